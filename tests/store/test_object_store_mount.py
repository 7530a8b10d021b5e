"""A bundle on an object store through the mount, against the local S3 server
(tests/support/s3server.py), issue 23: a sequential read (``cat``'s 128 KiB READs) is read ahead in
few large ranged GETs while random reads fetch only what they touch; a hung store (the server
SIGSTOPped) costs the first reader one ``--store-timeout``, every later uncached read fails at once,
the outage is logged once with the files that failed named, and reads succeed again soon after the
store resumes.
Every wait is bounded (a store timeout of 2 s here)."""

from __future__ import annotations

import errno
import json
import os
import random
import time
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("pyfuse3")

from bundlefs import PackOptions, pack  # noqa: E402
from tests.conftest import build_tree, pseudo_random_bytes  # noqa: E402
from tests.support.mounting import wait_until  # noqa: E402
from tests.support.s3server import S3Server, private_s3_server, s3_server, upload_bundle  # noqa: E402

__all__ = ["private_s3_server", "s3_server"]  # fixtures, imported to be found

MIB = 1024 * 1024
STORE_TIMEOUT = 2.0
_counter = iter(range(1_000_000))


def _storage(mountpoint: Path) -> dict:
    return json.loads(os.getxattr(mountpoint, "user.bundlefs.bundle"))["storage"]


def _stats(mountpoint: Path) -> dict:
    return json.loads(os.getxattr(mountpoint, "user.bundlefs.stats"))


def _options(server: S3Server, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--storage-option=key=test",
        "--storage-option=secret=test",
        f"--storage-option=client_kwargs.endpoint_url={server.endpoint}",
        "--storage-option=client_kwargs.region_name=us-east-1",
        "--disk-cache", str(tmp_path / "cache"),
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def large_bundle(tmp_path_factory) -> tuple[Path, bytes]:
    """One 48 MiB incompressible file in 256 KiB records (192 of them)."""
    root = tmp_path_factory.mktemp("large")
    data = random.Random(23).randbytes(48 * MIB)
    build_tree(root / "src", {"large.bin": data})
    pack(str(root / "src"), str(root / "large.bundle"))
    return root / "large.bundle", data


@pytest.fixture(scope="module")
def small_files_bundle(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    """Twelve files of 40 KB in records of their own (16 KiB records: several per file)."""
    root = tmp_path_factory.mktemp("small")
    files = {f"f{i:02}.bin": pseudo_random_bytes(40_000, seed=i) for i in range(12)}
    build_tree(root / "src", files)
    pack(str(root / "src"), str(root / "small.bundle"), PackOptions(record_size=16 * 1024))
    return root / "small.bundle", files


# -- sequential and random reads -------------------------------------------------------------------


def test_cat_of_a_large_file_is_read_ahead_in_few_large_gets(
    s3_server, large_bundle, mount_bundle, tmp_path
):
    path, data = large_bundle
    url = upload_bundle(s3_server, path, f"s3://mountread/t{next(_counter)}/large.bundle")
    m = mount_bundle(url, *_options(s3_server, tmp_path))
    before = _storage(m.mountpoint)
    got = bytearray()
    with open(m.mountpoint / "large.bin", "rb", buffering=0) as f:
        while chunk := f.read(128 * 1024):  # cat's read size
            got += chunk
    assert got == data
    after = _storage(m.mountpoint)
    gets = after["requests"] - before["requests"]
    fetched = after["bytes_fetched"] - before["bytes_fetched"]
    # 192 records: read ahead in pieces growing to 8 MiB, not a GET or two per record.
    assert gets <= 24, after
    assert fetched <= 1.05 * len(data), after
    assert after["prefetch_bytes"] >= 0.9 * len(data), after


def test_a_bundle_at_a_url_is_served_by_one_process_unless_told(
    s3_server, large_bundle, mount_bundle, tmp_path
):
    path, _ = large_bundle
    url = upload_bundle(s3_server, path, f"s3://mountread/t{next(_counter)}/large.bundle")
    served = _stats(mount_bundle(url, *_options(s3_server, tmp_path)).mountpoint)
    assert served["workers"] == 1
    assert served["single_process_reason"].startswith("a bundle at a URL")
    m = mount_bundle(url, *_options(s3_server, tmp_path / "two"), "--workers", "2")
    assert _stats(m.mountpoint)["workers"] == 2


def test_random_small_reads_fetch_only_the_records_they_touch(
    s3_server, large_bundle, mount_bundle, tmp_path
):
    path, data = large_bundle
    url = upload_bundle(s3_server, path, f"s3://mountread/t{next(_counter)}/large.bundle")
    m = mount_bundle(url, *_options(s3_server, tmp_path))
    rng = random.Random(5)
    records = rng.sample(range(len(data) // (256 * 1024)), 24)
    before = _storage(m.mountpoint)
    fd = os.open(m.mountpoint / "large.bin", os.O_RDONLY)
    try:
        for record in records:
            offset = record * 256 * 1024 + rng.randrange(0, 256 * 1024 - 4096)
            assert os.pread(fd, 4096, offset) == data[offset : offset + 4096]
    finally:
        os.close(fd)
    after = _storage(m.mountpoint)
    fetched = after["bytes_fetched"] - before["bytes_fetched"]
    # One 256 KiB record each (plus a shard header): nothing read ahead.
    assert fetched <= 1.1 * len(records) * 256 * 1024, after
    assert after["prefetch_bytes"] == before["prefetch_bytes"], after


# -- outages ---------------------------------------------------------------------------------------


def _read_errno(path: Path) -> tuple[int | None, float]:
    """The errno of reading ``path`` whole (None: it read), and how long that took."""
    started = time.monotonic()
    try:
        path.read_bytes()
    except OSError as e:
        return e.errno, time.monotonic() - started
    return None, time.monotonic() - started


def _mount_for_an_outage(server, path, files, bucket, mount_bundle, tmp_path):
    """A mount of the bundle at s3://BUCKET with no disk cache, no prefetch and a short store
    timeout, its shard's header already fetched; (the mount, the sorted file names)."""
    url = upload_bundle(server, path, f"s3://{bucket}/small.bundle")
    m = mount_bundle(
        url,
        *_options(server, tmp_path, "--disk-cache-size", "0", "--no-prefetch"),
        "--store-timeout", str(STORE_TIMEOUT),
        allowed_log=[r"object store is unreachable", r"read failed with EIO \(object store"],
    )  # fmt: skip
    names = sorted(files)
    # The shard's header is then known; the last file, so that no read-ahead holds the others.
    assert (m.mountpoint / names[-1]).read_bytes() == files[names[-1]]
    return m, names


def test_a_hung_store_fails_the_first_read_within_the_store_timeout_and_the_rest_at_once(
    private_s3_server, small_files_bundle, mount_bundle, tmp_path
):
    server = private_s3_server
    path, files = small_files_bundle
    m, names = _mount_for_an_outage(server, path, files, "outage", mount_bundle, tmp_path)
    server.pause()
    try:
        code, first = _read_errno(m.mountpoint / names[1])
        assert code == errno.EIO
        # One store timeout, and the kernel's retry of the failed read answered at once.
        assert first <= STORE_TIMEOUT + 3, first
        for name in names[2:6]:
            code, seconds = _read_errno(m.mountpoint / name)
            assert code == errno.EIO and seconds < 2, (name, seconds)
        stats = _stats(m.mountpoint)
        assert stats["outage_eio_count"] == 5, stats  # once per failed read
        assert stats["eio_count"] == 0, stats  # not damage
        log = m.log_text()
        assert log.count("object store is unreachable") == 1, log
        assert f"read failed with EIO (object store unreachable): /{names[1]}" in log, log
        assert "damaged data" not in log
    finally:
        server.resume()


def test_reads_succeed_within_seconds_of_the_store_resuming(
    private_s3_server, small_files_bundle, mount_bundle, tmp_path
):
    server = private_s3_server
    path, files = small_files_bundle
    m, names = _mount_for_an_outage(server, path, files, "resume", mount_bundle, tmp_path)
    server.pause()
    try:
        assert _read_errno(m.mountpoint / names[1])[0] == errno.EIO
    finally:
        server.resume()
    resumed = time.monotonic()

    def reads() -> bool:
        return _read_errno(m.mountpoint / names[1])[0] is None

    assert wait_until(reads, timeout=10)
    assert time.monotonic() - resumed < 10
    for name in names:
        assert (m.mountpoint / name).read_bytes() == files[name], name
    assert "object store answers again" in m.log_text()
    assert not _storage(m.mountpoint)["outage"]
