"""PyTorch: ``BundleIterableDataset`` through real ``DataLoader`` workers — each worker of each
rank streams its own contiguous part, every file or sample exactly once per epoch; the shuffle
buffer's order is a function of seed and epoch; local and ``s3://`` bundles. Nothing is timed."""

from __future__ import annotations

import os
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, get_worker_info  # noqa: E402

from bundlefs import Bundle, FormatError, PackOptions, pack  # noqa: E402
from bundlefs.integrations.torch import BundleIterableDataset  # noqa: E402
from tests.conftest import build_tree, pseudo_random_bytes  # noqa: E402
from tests.support.s3server import S3Server, s3_server, upload_bundle  # noqa: E402

__all__ = ["s3_server"]  # a fixture, imported to be found

# 150 samples of 2-3 members in 3 directories, ~4 files a record, several shards.
SPEC: dict = {
    f"d{d}": {
        **{f"{i:04d}.bin": pseudo_random_bytes(400 + (i * 53) % 900, seed=d * 1000 + i)
           for i in range(50)},
        **{f"{i:04d}.cls": str(i % 7).encode() for i in range(50)},
        **{f"{i:04d}.txt": b"caption %d" % i for i in range(0, 50, 4)},
    }
    for d in range(3)
}  # fmt: skip


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = build_tree(tmp_path_factory.mktemp("iterable") / "src", SPEC)
    dest = src.parent / "iterable.bundle"
    pack(str(src), str(dest), PackOptions(record_size=4096, shard_size=32768))
    return dest


@pytest.fixture(scope="module")
def whole(bundle_path: Path) -> dict[str, list[Any]]:
    """The stored order, files and samples, from one process."""
    with Bundle(bundle_path) as b:
        return {"files": list(b.iter_files()), "samples": list(b.iter_samples())}


def _tagged(item: Any) -> tuple[int, Any]:
    """A module-level transform (picklable): the item with the worker that produced it."""
    info = get_worker_info()
    return (-1 if info is None else info.id), item


def _epoch(dataset: BundleIterableDataset, workers: int, **loader: Any) -> list[Any]:
    return list(DataLoader(dataset, batch_size=None, num_workers=workers, **loader))


def _contiguous(positions: list[int]) -> bool:
    return positions == list(range(positions[0], positions[0] + len(positions)))


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
@pytest.mark.parametrize("samples", [True, False], ids=["samples", "files"])
def test_four_workers_on_each_of_two_ranks_read_everything_once_each_a_contiguous_run(
    bundle_path, whole, samples
):
    expected = whole["samples" if samples else "files"]
    position = {item[0]: i for i, item in enumerate(expected)}
    seen: list[tuple[int, int, Any]] = []
    for rank in range(2):
        ds = BundleIterableDataset(
            bundle_path, samples=samples, rank=rank, world_size=2, transform=_tagged
        )
        seen += [(rank, worker, item) for worker, item in _epoch(ds, 4)]
    counts = Counter(item[0] for _r, _w, item in seen)
    assert set(counts) == set(position) and set(counts.values()) == {1}
    assert sorted((tuple(i) for _r, _w, i in seen), key=lambda i: position[i[0]]) == [
        tuple(i) for i in expected
    ]  # the contents too
    runs = {}
    for rank, worker, item in seen:
        runs.setdefault((rank, worker), []).append(position[item[0]])
    assert len(runs) == 8
    assert all(_contiguous(p) for p in runs.values())
    # Rank-major: rank 0's workers hold the first half of the stored order.
    assert max(max(p) for (r, _w), p in runs.items() if r == 0) < min(
        min(p) for (r, _w), p in runs.items() if r == 1
    )


def test_the_shuffle_is_a_function_of_seed_and_epoch(bundle_path, whole):
    def order(seed: int, epoch: int) -> list[str]:
        ds = BundleIterableDataset(bundle_path, samples=True, shuffle_buffer=32, seed=seed)
        ds.set_epoch(epoch)
        return [key for key, _members in _epoch(ds, 2)]

    first = order(0, 0)
    assert first == order(0, 0)
    assert sorted(first) == sorted(key for key, _m in whole["samples"])
    assert first != [key for key, _m in whole["samples"]]
    assert order(0, 1) != first and order(1, 0) != first
    assert sorted(order(0, 1)) == sorted(first)


def test_the_shuffle_buffer_mixes_within_its_window(bundle_path, whole):
    ds = BundleIterableDataset(bundle_path, shuffle_buffer=8, seed=3)
    position = {path: i for i, (path, _data) in enumerate(whole["files"])}
    got = [position[path] for path, _data in _epoch(ds, 0)]
    assert sorted(got) == list(range(len(position)))
    # An item leaves the buffer at most 8 items after it would have come, never before it is read.
    assert all(p <= i + 8 for i, p in enumerate(got))


def test_the_dataset_keeps_no_bundle_open_and_each_worker_opens_its_own(bundle_path, whole):
    ds = BundleIterableDataset(bundle_path)
    assert ds._opened is None  # opened to scan the index, and closed
    assert len(_epoch(ds, 2)) == len(whole["files"])
    assert ds._opened is None  # only the (forked) workers opened it
    assert len(_epoch(ds, 0)) == len(whole["files"])  # in this process: opened here, kept
    opened = ds._opened
    assert opened is not None and opened[0] == os.getpid()
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._opened is None and copy._plan is None and copy.location == ds.location
    assert [path for path, _data in copy] == [path for path, _data in whole["files"]]
    ds.close()
    assert opened[1].closed


def test_a_worker_refuses_a_bundle_replaced_since_the_dataset_was_made(bundle_path, tmp_path):
    src = build_tree(tmp_path / "src", {"x.bin": b"x"})
    pack(str(src), str(tmp_path / "b"))
    ds = BundleIterableDataset(tmp_path / "b")
    pack(str(src), str(tmp_path / "b"), PackOptions(force=True, record_size=8192))
    with pytest.raises(FormatError, match="replaced"):
        _epoch(ds, 0)


def test_a_dataset_over_an_open_bundle_reaches_spawned_workers(bundle_path):
    with Bundle(bundle_path, cache_size=1 << 20) as b:
        ds = BundleIterableDataset(b, samples=True, rank=1, world_size=2)
        assert ds.options.cache_size == 1 << 20
        got = _epoch(ds, 2, multiprocessing_context="spawn")
        expected = [*b.iter_samples(part=(2, 4)), *b.iter_samples(part=(3, 4))]
    assert sorted(map(tuple, got)) == sorted(expected) and expected


def test_rank_and_world_size_come_from_the_environment_when_not_given(bundle_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    ds = BundleIterableDataset(bundle_path)
    assert (ds.rank, ds.world_size) == (3, 4)
    assert ds.part() == (3, 4)
    assert (BundleIterableDataset(bundle_path, rank=0, world_size=1).part()) == (0, 1)


@pytest.mark.parametrize(
    "bad", [{"rank": 2, "world_size": 2}, {"shuffle_buffer": -1}, {"key": "suffix"}]
)
def test_bad_arguments_are_value_errors_when_the_dataset_is_made(bundle_path, bad):
    with pytest.raises(ValueError):
        BundleIterableDataset(bundle_path, **bad)


def test_an_s3_bundle_streams_through_two_workers_on_each_of_two_ranks(
    bundle_path, whole, s3_server: S3Server, tmp_path
):
    url = upload_bundle(s3_server, bundle_path, "s3://torch-iterable/x.bundle")
    options = {"storage_options": s3_server.storage_options, "disk_cache": tmp_path / "cache"}
    got = []
    for rank in range(2):
        ds = BundleIterableDataset(url, samples=True, rank=rank, world_size=2, **options)
        got += _epoch(ds, 2)
    assert sorted(map(tuple, got)) == sorted(whole["samples"])
