"""A version-6 bundle on an object store opens without downloading its index (issue 27): the
local copy is sparse and filled page by page as lookups need them (docs/storage.md, "The
index"). On moto's server: what an open fetches does not grow with the index; everything reads
the same; a damaged page on the store costs only its entries; readers in two processes share
one copy; a version-5 bundle is still fetched whole."""

from __future__ import annotations

import errno
import multiprocessing
import os
import shutil
import stat
from collections import Counter
from pathlib import Path

import pytest

from bundlefs import Bundle, pack
from bundlefs.core.format import pages as lp
from bundlefs.errors import CorruptDataError, FormatError
from bundlefs.packing.options import PackOptions
from bundlefs.read.verify import verify
from bundlefs.storage.objectstore.fetcher import Fetcher
from tests.support.s3server import S3Server, s3_server, upload_bundle
from tests.support.trees import assert_one_line_error, run_cli

__all__ = ["s3_server"]  # a fixture, imported to be found

DATA = Path(__file__).resolve().parents[1] / "data"
_counter = iter(range(1_000_000))


def _tree(root: Path, dirs: int, per_dir: int) -> Path:
    for d in range(dirs):
        sub = root / f"d{d:03}"
        sub.mkdir(parents=True)
        for i in range(per_dir):
            (sub / f"f{i:05}.txt").write_bytes(f"{d}/{i}\n".encode() * (1 + i % 7))
    return root


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small and a 20× larger bundle of the same shape (directories of 1,000 files)."""
    out = {}
    for name, dirs in (("small", 2), ("large", 40)):
        base = tmp_path_factory.mktemp(name)
        dest = base / "b.bundle"
        pack(str(_tree(base / "src", dirs, 1000)), str(dest), PackOptions())
        out[name] = dest
    return out


def _upload(server: S3Server, bundle: Path) -> str:
    return upload_bundle(server, bundle, f"s3://pages/t{next(_counter)}/b.bundle")


def _open(server: S3Server, url: str, cache: Path) -> Bundle:
    return Bundle(url, storage_options=server.storage_options, disk_cache=str(cache))


@pytest.fixture
def fetched(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Bytes every ``Fetcher`` GET returned, by object name (the last part of the URL)."""
    counts: Counter[str] = Counter()
    real = Fetcher.get

    def get(self: Fetcher, url: str, start: int | None = None, end: int | None = None) -> bytes:
        data = real(self, url, start, end)
        counts[url.rsplit("/", 1)[-1]] += len(data)
        return data

    monkeypatch.setattr(Fetcher, "get", get)
    return counts


def test_an_open_fetches_what_lookups_need_not_the_index(s3_server, bundles, tmp_path, fetched):
    before_first_byte = {}
    for name, bundle in bundles.items():
        url = _upload(s3_server, bundle)
        fetched.clear()
        with _open(s3_server, url, tmp_path / name) as b:
            # The first byte: the path looked up, its record found, the shard read.
            index_bytes = fetched["data.mdb"]
            assert b.read("d001/f00123.txt") == b"1/123\n" * (1 + 123 % 7)
        size = (bundle / "index" / "data.mdb").stat().st_size
        before_first_byte[name] = (index_bytes, size)
        print(name, size, dict(fetched))
        copy = next((tmp_path / name / "index").glob("*/index/data.mdb"))
        assert copy.stat().st_size == size  # sparse: its full size, its blocks what was fetched
        assert copy.stat().st_blocks * 512 < size or size <= 512 * 1024
    (small, small_size), (large, large_size) = before_first_byte.values()
    assert large_size > 10 * small_size
    assert large < large_size / 4
    assert large <= small + 256 * 1024  # a run or a few more: not the index's growth


def test_lookups_listings_and_reads_are_the_sources(s3_server, bundles, tmp_path, fetched):
    bundle = bundles["large"]
    url = _upload(s3_server, bundle)
    with Bundle(bundle) as local, _open(s3_server, url, tmp_path / "c") as remote:
        assert list(remote.walk("")) == list(local.walk(""))
        for top, _dirs, files in local.walk(""):
            for name in files[::97]:
                rel = f"{top}/{name}" if top else name
                assert remote.read(rel) == local.read(rel)
                assert remote.lstat(rel) == local.lstat(rel)
        assert remote.info().config.file_count == local.info().config.file_count
    report = verify(url, storage_options=s3_server.storage_options, disk_cache=str(tmp_path / "c"))
    assert report.ok, report.problems
    fetched.clear()
    report = verify(url, storage_options=s3_server.storage_options, disk_cache=str(tmp_path / "c"))
    assert report.ok and fetched["data.mdb"] == 0  # the copy is whole now: nothing fetched


def _leaf_page_of_entries(bundle: Path) -> int:
    """A leaf page of ``entries`` in the middle of the index (4-byte keys, names in values)."""
    index = (bundle / "index" / "data.mdb").read_bytes()
    last = len(index) // 4096 - 1
    leaves = []
    for pgno in range(2, last + 1):
        try:
            page = lp.tree_page(index[pgno * 4096 : (pgno + 1) * 4096], pgno, last)
        except FormatError:
            continue  # a free or overflow page
        if (
            page.leaf
            and len(page.keys[0]) == 4
            and b".txt" in index[pgno * 4096 : (pgno + 1) * 4096]
        ):
            leaves.append(pgno)
    return leaves[len(leaves) // 2]


def _damaged_upload(server: S3Server, bundle: Path) -> tuple[str, int]:
    """``bundle`` uploaded with one leaf of ``entries`` damaged on the store: (URL, page)."""
    url = _upload(server, bundle)
    index = bytearray((bundle / "index" / "data.mdb").read_bytes())
    page = _leaf_page_of_entries(bundle)
    index[page * 4096 + 2000] ^= 0xFF
    server.put(f"{url}/index/data.mdb", bytes(index))
    return url, page


def _split(remote: Bundle, local: Bundle, page: int) -> tuple[list[str], list[str]]:
    """(readable, lost) of a sample of the files: the readable ones read as the source."""
    good, lost = [], []
    for d in range(40):
        for i in range(0, 1000, 50):
            rel = f"d{d:03}/f{i:05}.txt"
            try:
                data = remote.read(rel)
            except CorruptDataError as e:
                assert f"index page {page}" in str(e)
                lost.append(rel)
                continue
            assert data == local.read(rel)
            good.append(rel)
    return good, lost


def _cli_options(server: S3Server, cache: Path) -> list[str]:
    return [
        "--storage-option=key=test",
        "--storage-option=secret=test",
        f"--storage-option=client_kwargs.endpoint_url={server.endpoint}",
        "--storage-option=client_kwargs.region_name=us-east-1",
        "--disk-cache", str(cache),
    ]  # fmt: skip


def test_a_damaged_page_on_the_store_costs_only_its_entries(s3_server, bundles, tmp_path):
    bundle = bundles["large"]
    url, page = _damaged_upload(s3_server, bundle)
    with Bundle(bundle) as local, _open(s3_server, url, tmp_path / "c") as remote:
        good, lost = _split(remote, local, page)
    assert lost and len(good) > 10 * len(lost)
    # The command line: one sentence naming the page, the rest of the bundle still there.
    options = _cli_options(s3_server, tmp_path / "cli")
    line = assert_one_line_error(run_cli("cat", *options, url, lost[0]))
    assert f"index page {page}" in line
    shown = run_cli("cat", *options, url, good[0])
    assert shown.returncode == 0 and shown.stdout == (bundle.parent / "src" / good[0]).read_bytes()
    report = verify(url, storage_options=s3_server.storage_options, disk_cache=str(tmp_path / "c"))
    assert any(f"index page {page} fails its checksum" in p.message for p in report.problems)


def _files_on_page(bundle: Path, page: int) -> list[str]:
    """The files whose entries the leaf ``page`` holds (the tree's inodes are breadth-first:
    the root 1, the 40 directories 2-41, then each directory's 1,000 files)."""
    index = (bundle / "index" / "data.mdb").read_bytes()
    leaf = lp.tree_page(index[page * 4096 : (page + 1) * 4096], page, len(index) // 4096 - 1)
    inodes = [int.from_bytes(key, "big") - 42 for key in leaf.keys]
    return [f"d{k // 1000:03}/f{k % 1000:05}.txt" for k in inodes if k >= 0]


@pytest.mark.mount
def test_a_damaged_page_on_the_store_is_eio_on_a_mount(s3_server, bundles, tmp_path, mount_bundle):
    pytest.importorskip("pyfuse3")
    bundle = bundles["large"]
    url, page = _damaged_upload(s3_server, bundle)
    lost = _files_on_page(bundle, page)
    m = mount_bundle(
        url,
        *_cli_options(s3_server, tmp_path / "cache"),
        allowed_log=[rf"index page {page}", "damaged", "EIO", "fails its checksum"],
    )
    with pytest.raises(OSError) as e:
        (m.mountpoint / lost[len(lost) // 2]).read_bytes()
    assert e.value.errno == errno.EIO
    src = bundle.parent / "src"
    for d in ("d000", "d039"):
        assert sorted(os.listdir(m.mountpoint / d)) == sorted(os.listdir(src / d))
        for name in sorted(os.listdir(src / d))[::100]:
            assert (m.mountpoint / d / name).read_bytes() == (src / d / name).read_bytes()


def _read_all(url: str, options: dict, cache: str, expect: dict[str, bytes]) -> int:
    with Bundle(url, storage_options=options, disk_cache=cache) as b:
        for rel, data in expect.items():
            assert b.read(rel) == data, rel
    return len(expect)


def test_two_processes_share_one_sparse_copy(s3_server, bundles, tmp_path):
    bundle = bundles["large"]
    url = _upload(s3_server, bundle)
    with Bundle(bundle) as local:
        expect = {
            f"d{d:03}/f{i:05}.txt": local.read(f"d{d:03}/f{i:05}.txt")
            for d in range(0, 40, 3)
            for i in range(0, 1000, 37)
        }
    cache = str(tmp_path / "shared")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        args = (url, s3_server.storage_options, cache, expect)
        assert pool.starmap(_read_all, [args, args]) == [len(expect)] * 2
    (copy,) = Path(cache, "index").glob("*/index/data.mdb")
    # What both filled is the index's bytes wherever it is not a hole.
    whole = (bundle / "index" / "data.mdb").read_bytes()
    mine = copy.read_bytes()
    for at in range(0, len(whole), 4096):
        page = mine[at : at + 4096]
        assert page == whole[at : at + 4096] or page == bytes(4096)


def test_a_version_5_bundle_is_still_fetched_whole(s3_server, tmp_path, fetched):
    bundle = tmp_path / "v5.bundle"
    shutil.copytree(DATA / "v5-twelve-shards.bundle", bundle)
    url = _upload(s3_server, bundle)
    with _open(s3_server, url, tmp_path / "c") as b:
        for top, _dirs, files in b.walk(""):
            for name in files:
                rel = f"{top}/{name}" if top else name
                if stat.S_ISREG(b.lstat(rel).st_mode):
                    b.read(rel)
    size = os.path.getsize(bundle / "index" / "data.mdb")
    assert fetched["data.mdb"] == size
    (copy,) = (tmp_path / "c" / "index").glob("*/index/data.mdb")
    assert copy.read_bytes() == (bundle / "index" / "data.mdb").read_bytes()
