"""Review of branch s3index (sparse version-6 index copies): reproductions of what breaks the
rule "LMDB never reads a page that was not fetched and checked". Each crash-prone step runs in
a child process (a CLI run or a fork) so a fault shows as its exit status, not a dead pytest."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from bundlefs import Bundle, PackOptions, pack  # noqa: E402
from bundlefs.errors import CorruptDataError, FormatError  # noqa: E402
from bundlefs.storage.location import parse_location  # noqa: E402
from bundlefs.storage.objectstore.fetcher import Fetcher  # noqa: E402
from bundlefs.storage.objectstore.index_fetch import fetch_index  # noqa: E402
from tests.support.s3server import S3Server, s3_server, upload_bundle  # noqa: E402
from tests.support.trees import run_cli  # noqa: E402

__all__ = ["s3_server"]  # a fixture, imported to be found

DIRS, PER_DIR = 6, 1000  # an index of ~600 KB: far more than the 64 KiB fetched at open


def _tree(root: Path, changed: bool) -> Path:
    for d in range(DIRS):
        sub = root / f"d{d:03}"
        sub.mkdir(parents=True)
        for i in range(PER_DIR):
            body = f"{d}/{i}\n".encode() * (1 + i % 7)
            if changed and (d, i) == (DIRS - 1, PER_DIR - 1):
                body = b"changed\n"
            (sub / f"f{i:05}.txt").write_bytes(body)
            os.utime(sub / f"f{i:05}.txt", ns=(10**18, 10**18))
    return root


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("review")
    out = []
    for name, changed in (("old", False), ("new", True)):
        dest = base / f"{name}.bundle"
        pack(str(_tree(base / f"{name}.src", changed)), str(dest), PackOptions(created_ns=0))
        out.append(dest)
    assert (out[0] / "index" / "data.mdb").stat().st_size > 8 * 64 * 1024
    return out[0], out[1]


def _env(server: S3Server, cache: Path) -> dict[str, str]:
    return {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "BUNDLEFS_CACHE_DIR": os.fspath(cache),
    }


def test_diff_reads_version_6_bundles_at_urls(s3_server, pair, tmp_path, monkeypatch) -> None:
    old, new = pair
    local = run_cli("diff", old, new)
    assert local.returncode == 1
    assert f"M\td{DIRS - 1:03}/f{PER_DIR - 1:05}.txt\n".encode() in local.stdout
    urls = [
        upload_bundle(s3_server, b, f"s3://review/{tmp_path.name}/{b.name}") for b in (old, new)
    ]
    for k, v in _env(s3_server, tmp_path / "cache").items():
        monkeypatch.setenv(k, v)
    args = ("diff", *urls, "--storage-option", f"endpoint_url={s3_server.endpoint}")
    cold = run_cli(*args)  # a fresh cache: the main database's pages are not there
    print("cold: returncode", cold.returncode, "stderr", cold.stderr.decode()[-300:])
    # A cache another reader (a mount, an ls) has filled what an open needs in: the diff opens,
    # and its walk reads entries' leaves that are holes.
    for url in urls:
        with Bundle(
            url, storage_options=s3_server.storage_options, disk_cache=str(tmp_path / "cache")
        ):
            pass
    warm = run_cli(*args)
    print("warm: returncode", warm.returncode, "stderr", warm.stderr.decode()[-300:])
    assert (cold.returncode, cold.stdout) == (1, local.stdout), cold.stderr.decode()
    assert (warm.returncode, warm.stdout) == (1, local.stdout), warm.stderr.decode()


def test_a_plain_index_reader_refuses_a_sparse_copy(s3_server, pair, tmp_path) -> None:
    from bundlefs.storage.index import IndexReader

    old, _new = pair
    url = upload_bundle(s3_server, old, f"s3://review/{tmp_path.name}/plain.bundle")
    local = fetch_index(parse_location(url, s3_server.storage_options), tmp_path / "cache")
    for check in (True, False):
        with pytest.raises(FormatError, match="sparse copy .* open the bundle by its URL"):
            IndexReader(local, check_checksum=check)


def _sample(bundle: Path, step: int) -> dict[str, bytes]:
    """Every ``step``-th file of each directory of the tree ``bundle`` was packed from."""
    src = bundle.parent / "old.src"
    return {
        f"d{d:03}/f{i:05}.txt": (src / f"d{d:03}/f{i:05}.txt").read_bytes()
        for d in range(DIRS)
        for i in range(0, PER_DIR, step)
    }


def _in_forked_child(body: Callable[[], int]) -> int:
    """Run ``body`` in a forked child (as the mount's supervisor forks a worker) and return its
    exit status: ``body``'s code, 4 on an exception, minus the signal that killed it. Printed."""
    pid = os.fork()
    if pid == 0:
        code = 4
        try:
            code = body()
        except BaseException as e:  # noqa: BLE001 (reported through the exit status)
            print("child:", type(e).__name__, e, flush=True)
        finally:
            os._exit(code)
    _pid, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    print("child exit:", signal.Signals(-code).name if code < 0 else code)
    return code


def _reads_all(bundle: Bundle, expect: dict[str, bytes]) -> int:
    """0 when every file of ``expect`` reads back as expected, else 3."""
    return 0 if all(bundle.read(rel) == data for rel, data in expect.items()) else 3


def _how(code: int) -> str:
    return signal.Signals(-code).name if code < 0 else str(code)


def test_a_child_forked_after_the_cache_copy_was_replaced_fills_its_own_file(
    s3_server, pair, tmp_path
) -> None:
    old, _new = pair
    url = upload_bundle(s3_server, old, f"s3://review/{tmp_path.name}/fork.bundle")
    cache = tmp_path / "cache"
    expect = _sample(old, 97)
    with Bundle(url, storage_options=s3_server.storage_options, disk_cache=str(cache)) as b:
        # Another process finds the copy unusable (or a cleaner removes it) and fetches it
        # again: a new directory, a new data.mdb, at the same path.
        (local,) = (cache / "index").glob("*/COMPLETE")
        shutil.rmtree(local.parent)
        location = parse_location(url, s3_server.storage_options)
        fetch_index(location, cache)
        code = _in_forked_child(lambda: _reads_all(b, expect))  # a worker, or its replacement
    assert code == 0, f"the forked child ended with {_how(code)}"


def _timed_lstat(bundle: Bundle, rel: str, out: dict[str, tuple[float, str]]) -> None:
    started = time.monotonic()
    try:
        bundle.lstat(rel)
        what = "ok"
    except Exception as e:  # noqa: BLE001 (what it raised is the result)
        what = f"{type(e).__name__}: {e}"
    out[rel] = (time.monotonic() - started, what)


def test_lookups_in_an_outage_fail_in_one_store_timeout(pair, tmp_path) -> None:
    old, _new = pair
    server = S3Server(tmp_path)
    server.start()
    try:
        url = upload_bundle(server, old, "s3://outage/b.bundle")
        timeout = 2.0
        bundle = Bundle(
            url,
            storage_options=server.storage_options,
            disk_cache=str(tmp_path / "cache"),
            store_timeout=timeout,
        )
    finally:
        server.stop()  # the store goes away with the bundle open
    # ... and something that never answers takes its address (a store that hangs: a dropped
    # route, an overloaded gateway): connections are made by the kernel, requests never answered.
    silent = socket.socket()
    silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    silent.bind(("127.0.0.1", server.port))
    silent.listen(64)
    with bundle, silent:
        out: dict[str, tuple[float, str]] = {}
        files = [f"d{d:03}/f00500.txt" for d in (1, 3, 5)]  # three leaves not fetched yet
        threads = [threading.Thread(target=_timed_lstat, args=(bundle, f, out)) for f in files]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join()
    for rel, (took, what) in sorted(out.items()):
        print(f"{rel}: {took:.1f} s, {what[:120]}")
    assert all(what != "ok" for _took, what in out.values())
    assert max(took for took, _what in out.values()) < 1.5 * timeout


def test_index_pages_fail_at_once_while_the_shard_store_is_out(pair, tmp_path) -> None:
    old, _new = pair
    server = S3Server(tmp_path)
    server.start()
    try:
        url = upload_bundle(server, old, "s3://outage/b.bundle")
        bundle = Bundle(
            url,
            storage_options=server.storage_options,
            disk_cache=str(tmp_path / "cache"),
            store_timeout=2.0,
        )
        bundle.lstat("d000/f00001.txt")
    finally:
        server.stop()
    with bundle:
        with pytest.raises(CorruptDataError):
            bundle.read("d000/f00001.txt")  # the shard store finds the outage
        started = time.monotonic()
        with pytest.raises(CorruptDataError, match="outage"):
            bundle.lstat(f"d{DIRS - 1:03}/f00900.txt")  # a leaf not fetched yet
        took = time.monotonic() - started
    print(f"index page in the outage: {took:.3f} s")
    assert took < 0.5


def test_a_short_write_into_the_copy_never_reaches_lmdb(s3_server, pair, tmp_path) -> None:
    old, _new = pair
    url = upload_bundle(s3_server, old, f"s3://review/{tmp_path.name}/short.bundle")
    expect = _sample(old, 7)
    cache = str(tmp_path / "cache")

    def reads_on_a_full_disk(b: Bundle) -> int:
        # What a cache disk that fills up mid-write does: write(2) stores the first bytes
        # and returns their count. RLIMIT_FSIZE does the same at a given offset (Python
        # ignores SIGXFSZ: writes starting past it fail with EFBIG, as ENOSPC would).
        limit = 48 * 4096 + 2 * 4096  # pages 50-63 of the run 48-63 are never written
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        code = 0
        for rel, data in expect.items():
            try:
                if b.read(rel) != data:
                    code = 3
            except CorruptDataError:
                pass  # an error for that lookup is right: its page cannot be stored
        return code

    with Bundle(url, storage_options=s3_server.storage_options, disk_cache=cache) as b:
        code = _in_forked_child(lambda: reads_on_a_full_disk(b))
    assert code == 0, f"the forked child ended with {_how(code)}"


def test_a_child_forked_after_the_cache_copy_was_removed_still_reads(
    s3_server, pair, tmp_path
) -> None:
    old, _new = pair
    url = upload_bundle(s3_server, old, f"s3://review/{tmp_path.name}/gone.bundle")
    cache = tmp_path / "cache"
    expect = _sample(old, 97)
    with Bundle(url, storage_options=s3_server.storage_options, disk_cache=str(cache)) as b:
        (local,) = (cache / "index").glob("*/COMPLETE")
        shutil.rmtree(local.parent)
        code = _in_forked_child(lambda: _reads_all(b, expect))
        parent = all(b.read(rel) == data for rel, data in expect.items())
    print("parent read all:", parent)
    assert parent and code == 0


def test_a_bundle_replaced_at_its_url_is_not_reported_as_damage(s3_server, pair, tmp_path):
    old, new = pair
    url = upload_bundle(s3_server, old, f"s3://review/{tmp_path.name}/replaced.bundle")
    cache = str(tmp_path / "cache")
    with Bundle(url, storage_options=s3_server.storage_options, disk_cache=cache) as b:
        b.read("d000/f00001.txt")
        upload_bundle(s3_server, new, url)  # republished at the same URL (pack --force)
        with pytest.raises(CorruptDataError) as e:  # its entry's page is the new bundle's
            b.lstat(f"d{DIRS - 1:03}/f{PER_DIR - 1:05}.txt")
    print("error:", e.value)
    assert "fails its checksum" not in str(e.value)
    assert "was replaced at its URL" in str(e.value)


def test_a_whole_copy_already_cached_is_not_fetched_again(s3_server, pair, tmp_path, monkeypatch):
    old, _new = pair
    url = upload_bundle(s3_server, old, f"s3://review/{tmp_path.name}/whole.bundle")
    fetched = {"data.mdb": 0}
    real = Fetcher.get

    def get(self: Fetcher, url: str, start: int | None = None, end: int | None = None) -> bytes:
        data = real(self, url, start, end)
        if url.endswith("/data.mdb"):
            fetched["data.mdb"] += len(data)
        return data

    monkeypatch.setattr(Fetcher, "get", get)
    location = parse_location(url, s3_server.storage_options)
    size = (old / "index" / "data.mdb").stat().st_size
    fetch_index(location, tmp_path / "cache", whole=True)
    first = fetched["data.mdb"]
    fetch_index(location, tmp_path / "cache", whole=True)
    again = fetched["data.mdb"] - first
    print(f"index {size} bytes; first whole fetch {first}, second {again}")
    assert first <= size  # the first run, fetched at open, is not fetched again
    assert again == 0


def _gap_forged(base: Path) -> tuple[Path, int]:
    """A bundle of directories of long-named files (few entries per leaf) whose index is forged
    (page table and marker resealed, as a hostile writer would): the keys of d000's children
    but its first moved past the last inode, the count LMDB holds unchanged. (bundle, its size)"""
    from tests.support.hostile import entry_of, forge, read_values

    src = base / "long.src"
    for d in range(3):
        (src / f"d{d:03}").mkdir(parents=True)
        for i in range(300):
            (src / f"d{d:03}" / (f"{i:05}" + "n" * 200)).write_bytes(b"x")
    bundle = base / "long.bundle"
    pack(str(src), str(bundle), PackOptions(created_ns=0))
    values = read_values(bundle, b"entries")
    last = max(int.from_bytes(k, "big") for k in values)
    d000 = next(
        entry_of(bundle, ino) for ino in range(1, 10) if entry_of(bundle, ino).name == b"d000"
    )
    first, count = d000.first_child, d000.size
    gone = [first + k for k in range(1, count)]
    forge(
        bundle,
        puts={
            (b"entries", (last + k).to_bytes(4, "big")): values[(first + k).to_bytes(4, "big")]
            for k in range(1, count)
        },
        deletes=[(b"entries", ino.to_bytes(4, "big")) for ino in gone],
    )
    return bundle, count


def test_a_gap_in_a_forged_index_never_walks_lmdb_into_a_hole(s3_server, tmp_path) -> None:
    bundle, count = _gap_forged(tmp_path)
    with Bundle(bundle) as local:
        with pytest.raises(FormatError) as e:
            local.listdir("d000")
        print("local:", e.value)
    url = upload_bundle(s3_server, bundle, f"s3://review/{tmp_path.name}/gap.bundle")
    cache = str(tmp_path / "cache")

    def lists_or_refuses(b: Bundle) -> int:
        try:
            b.listdir("d000")
        except (FormatError, CorruptDataError) as e:  # refusing the forged directory is right
            print("child:", type(e).__name__, e, flush=True)
        return 0

    with Bundle(url, storage_options=s3_server.storage_options, disk_cache=cache) as b:
        code = _in_forked_child(lambda: lists_or_refuses(b))
    assert code == 0, f"the forked child ended with {_how(code)}"
