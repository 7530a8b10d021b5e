"""Bundles on fsspec's in-process ``memory://`` store, its profile in the object-store client's
table (storage/objectstore/client.py): pack publishes there (refusing a bundle already there
without ``force``, replacing and tidying with it, refusing what is not a bundle), a pack reads a
``memory://`` prefix, and ``Bundle``, ``iter_files``, ``verify`` and fsspec's ``fo=`` read it.
The byte-level store contract runs in tests/store/test_store_contract.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

fsspec = pytest.importorskip("fsspec")

from bundlefs import Bundle, PackOptions, pack  # noqa: E402
from bundlefs.errors import PackError  # noqa: E402
from bundlefs.read.verify import verify  # noqa: E402
from bundlefs.storage.location import parse_location  # noqa: E402
from bundlefs.storage.objectstore.client import PROFILES, profile_of  # noqa: E402
from tests.conftest import SAMPLE_FILES  # noqa: E402

_names = iter(range(1_000_000))


@pytest.fixture
def memory() -> Iterator[tuple[object, str]]:
    """fsspec's memory file system and a bucket of the test's own, removed afterwards."""
    fs = fsspec.filesystem("memory")
    bucket = f"b{next(_names)}"
    yield fs, bucket
    if fs.exists(f"/{bucket}"):
        fs.rm(f"/{bucket}", recursive=True)


def _options(tmp_path: Path, **more: object) -> PackOptions:
    return PackOptions(staging=str(tmp_path / "staging"), **more)  # type: ignore[arg-type]


def test_memory_has_a_profile_that_lists_and_takes_uploads() -> None:
    profile = profile_of(parse_location("memory://b/x.bundle"))
    assert profile is PROFILES["memory"]
    assert profile.lists and profile.writable


def test_a_bundle_packed_to_memory_reads_back_every_file(memory, sample_tree, tmp_path) -> None:
    _fs, bucket = memory
    url = f"memory://{bucket}/s.bundle"
    (tmp_path / "staging").mkdir()
    pack(str(sample_tree), url, _options(tmp_path))
    with Bundle(url, disk_cache=str(tmp_path / "cache")) as b:
        assert dict(b.iter_files()) == SAMPLE_FILES
        assert b["hello.txt"] == SAMPLE_FILES["hello.txt"]
    report = verify(url, disk_cache=str(tmp_path / "cache"))
    assert report.ok, report.problems
    fs = fsspec.filesystem(
        "bundle", fo=url, disk_cache=str(tmp_path / "c2"), skip_instance_cache=True
    )
    assert fs.cat("hello.txt") == SAMPLE_FILES["hello.txt"]
    fs.close()


def test_a_second_pack_to_memory_is_refused_without_force(memory, sample_tree, tmp_path) -> None:
    _fs, bucket = memory
    url = f"memory://{bucket}/s.bundle"
    (tmp_path / "staging").mkdir()
    pack(str(sample_tree), url, _options(tmp_path))
    with pytest.raises(PackError, match="already exists"):
        pack(str(sample_tree), url, _options(tmp_path))


def test_a_forced_pack_to_memory_replaces_and_tidies(memory, sample_tree, tmp_path) -> None:
    fs, bucket = memory
    url = f"memory://{bucket}/s.bundle"
    (tmp_path / "staging").mkdir()
    pack(str(sample_tree), url, _options(tmp_path, shard_size=64 * 1024))
    before = sorted(p.rsplit("/", 1)[-1] for p in fs.find(f"/{bucket}/s.bundle"))
    small = tmp_path / "small"
    small.mkdir()
    (small / "only.txt").write_bytes(b"just this\n")
    pack(str(small), url, _options(tmp_path, force=True))
    after = sorted(p.rsplit("/", 1)[-1] for p in fs.find(f"/{bucket}/s.bundle"))
    assert len([n for n in before if n.startswith("shard-")]) > 1
    assert after == ["COMPLETE", "data.mdb", "pages", "shard-00000000"]
    with Bundle(url, disk_cache=str(tmp_path / "cache")) as b:
        assert dict(b.iter_files()) == {"only.txt": b"just this\n"}


def test_a_pack_over_an_object_that_is_no_bundle_is_refused(memory, sample_tree, tmp_path) -> None:
    fs, bucket = memory
    fs.pipe(f"/{bucket}/s.bundle/notes.txt", b"mine")
    (tmp_path / "staging").mkdir()
    with pytest.raises(PackError, match="not a bundle"):
        pack(str(sample_tree), f"memory://{bucket}/s.bundle", _options(tmp_path, force=True))
    assert fs.cat(f"/{bucket}/s.bundle/notes.txt") == b"mine"


def test_a_memory_prefix_packs_every_object_below_it(memory, tmp_path) -> None:
    fs, bucket = memory
    fs.pipe(f"/{bucket}/data/a/b.txt", b"hello")
    fs.pipe(f"/{bucket}/data/c.bin", bytes(range(256)) * 10)
    fs.pipe(f"/{bucket}/data-old/x", b"not this")
    dest = tmp_path / "p.bundle"
    pack(f"memory://{bucket}/data", str(dest))
    with Bundle(dest) as b:
        assert dict(b.iter_files()) == {"a/b.txt": b"hello", "c.bin": bytes(range(256)) * 10}
