"""The cluster cache (docs/storage.md): one disk cache directory shared by independent reader
processes (tests/support/cache_reader.py, real subprocesses reading a bundle from a local web
server, tests/support/httpserver.py), as readers on several hosts share one on NFS. What must
hold: no torn file is ever visible, a corrupted or vanished cached file is fetched again (never
served, never an error), one bound holds for all of them, and a range one process cached is
used by another that opened the bundle before it was there."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

from bundlefs import Bundle, PackOptions, pack  # noqa: E402
from tests.conftest import build_tree, pseudo_random_bytes  # noqa: E402
from tests.support.httpserver import HTTPServer, http_server  # noqa: E402

__all__ = ["http_server"]  # a fixture, imported to be found

ROOT = Path(__file__).resolve().parents[2]
_names = iter(range(1_000_000))


def _nested(files: dict[str, bytes]) -> dict:
    """``{"d/f": data}`` as the nested spec ``build_tree`` takes."""
    tree: dict = {}
    for path, data in files.items():
        *dirs, name = path.split("/")
        node = tree
        for d in dirs:
            node = node.setdefault(d, {})
        node[name] = data
    return tree


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A bundle of 40 files (about 2.4 MB) in 16 KiB records over several shards, and the JSON
    file of each path's SHA-256."""
    top = tmp_path_factory.mktemp("cluster")
    spec = {
        f"d{i % 4}/f{i}.bin": pseudo_random_bytes(20_000 + 3_000 * i, i, compressible=i % 2 == 0)
        for i in range(40)
    }
    src = build_tree(top / "src", _nested(spec))
    bundle = top / "c.bundle"
    pack(str(src), str(bundle), PackOptions(record_size=16 * 1024, shard_size=1 << 20))
    expected = top / "expected.json"
    expected.write_text(json.dumps({p: hashlib.sha256(d).hexdigest() for p, d in spec.items()}))
    return bundle, expected


@pytest.fixture
def url(http_server: HTTPServer, packed: tuple[Path, Path]) -> str:
    """The bundle served under a name of the test's own."""
    return http_server.publish(packed[0], f"cluster/{next(_names)}/c.bundle")


def _reader(url: str, cache: Path, expected: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.cache_reader", url, str(cache), str(expected)]
        + list(args),
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (out, err)
    assert "Traceback" not in err, err
    return json.loads(out.strip().splitlines()[-1])


def _cached(cache: Path) -> list[Path]:
    return [p for p in (cache / "records").rglob("shard-*") if p.is_file()]


def _held(cache: Path) -> int:
    total = 0
    for p in (cache / "records").rglob("*"):
        with contextlib.suppress(FileNotFoundError):  # evicted while counted
            total += p.stat().st_size if p.is_file() else 0
    return total


def _in_background(action: Callable[[], None], stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        while not stop.is_set():
            action()
            time.sleep(0.005)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_two_processes_filling_one_cache_never_show_a_torn_file(url, packed, tmp_path):
    bundle, expected = packed
    cache = tmp_path / "cache"
    shards = {p.name: p.read_bytes() for p in bundle.glob("shard-*")}
    seen: set[str] = set()
    torn: list[str] = []

    def look() -> None:
        for piece in _cached(cache):
            try:
                data = piece.read_bytes()
            except FileNotFoundError:
                continue  # evicted or replaced while listed
            shard, offset, length = piece.name.split(".")
            seen.add(piece.name)
            start = int(offset)
            if len(data) != int(length) or data != shards[shard][start : start + int(length)]:
                torn.append(piece.name)

    stop = threading.Event()
    watcher = _in_background(look, stop)
    readers = [_reader(url, cache, expected, "--seed", str(n)) for n in range(2)]
    try:
        results = [_result(r) for r in readers]
    finally:
        stop.set()
        watcher.join()
    look()
    assert torn == []
    assert len(seen) >= 10
    assert all(r["stats"]["requests"] >= 1 for r in results)


def test_a_corrupted_cached_file_is_fetched_again_never_served(url, packed, tmp_path):
    _bundle, expected = packed
    cache = tmp_path / "cache"
    _result(_reader(url, cache, expected))  # fills the cache
    rng = random.Random(7)

    def corrupt() -> None:
        pieces = _cached(cache)
        if not pieces:
            return
        piece = rng.choice(pieces)
        try:
            with open(piece, "r+b") as f:  # in place, same size: what bad media does
                size = os.fstat(f.fileno()).st_size
                at = rng.randrange(size)
                f.seek(at)
                byte = f.read(1)
                f.seek(at)
                f.write(bytes([byte[0] ^ 0xFF]) if byte else b"")
        except FileNotFoundError:
            pass  # discarded by a reader meanwhile

    for _ in range(30):  # before the readers open: their listing holds damaged files
        corrupt()
    stop = threading.Event()
    corrupter = _in_background(corrupt, stop)
    readers = [_reader(url, cache, expected, "--rounds", "3", "--seed", str(n)) for n in (1, 2)]
    try:
        results = [_result(r) for r in readers]
    finally:
        stop.set()
        corrupter.join()
    assert sum(r["stats"]["discards"] for r in results) >= 1
    assert all(r["wrong"] == [] and r["errors"] == [] for r in results)


def test_a_cached_file_removed_by_another_process_is_a_miss(url, packed, tmp_path):
    _bundle, expected = packed
    cache = tmp_path / "cache"
    _result(_reader(url, cache, expected))  # fills the cache: the readers below list it all
    readers = [_reader(url, cache, expected, "--rounds", "3", "--wait") for _ in range(2)]
    for r in readers:
        assert r.stdout is not None and r.stdout.readline().strip() == "open"
    rng = random.Random(5)

    def remove() -> None:
        pieces = _cached(cache)
        for piece in rng.sample(pieces, min(3, len(pieces))):
            piece.unlink(missing_ok=True)  # what another process's eviction does

    stop = threading.Event()
    remover = _in_background(remove, stop)
    try:
        for r in readers:
            assert r.stdin is not None
            r.stdin.write("go\n")
            r.stdin.flush()
        results = [_result(r) for r in readers]
    finally:
        stop.set()
        remover.join()
    assert all(r["wrong"] == [] and r["errors"] == [] for r in results)
    assert sum(r["stats"]["disk_misses"] for r in results) >= 1


def test_processes_sharing_a_cache_keep_one_bound(http_server, packed, tmp_path):
    bundle, expected = packed
    # Two bundles (the same bytes under two names would share ids: one is repacked apart).
    urls = [http_server.publish(bundle, f"cluster/{next(_names)}/c.bundle")]
    other = tmp_path / "other.bundle"
    with Bundle(bundle) as b:
        files = dict(b.iter_files())
    src = build_tree(tmp_path / "src", _nested(files))
    pack(str(src), str(other), PackOptions(record_size=16 * 1024, shard_size=1 << 20))
    urls.append(http_server.publish(other, f"cluster/{next(_names)}/c.bundle"))
    cache = tmp_path / "cache"
    bound = 600_000  # a quarter of each bundle's data
    peak = 0

    def measure() -> None:
        nonlocal peak
        peak = max(peak, _held(cache))

    stop = threading.Event()
    watcher = _in_background(measure, stop)
    readers = [
        _reader(u, cache, expected, "--size", str(bound), "--rounds", "2", "--seed", str(n))
        for n, u in enumerate(urls)
    ]
    try:
        results = [_result(r) for r in readers]
    finally:
        stop.set()
        watcher.join()
    # Each reader counts the whole directory at most a tenth of the bound after its last count:
    # two at once overshoot by at most two tenths (and the record in hand), briefly.
    largest = max(p.stat().st_size for p in _cached(cache))
    assert 0 < _held(cache) <= bound * 1.2 + largest
    assert peak <= bound * 1.2 + 2 * largest, (peak, bound)
    assert all(r["stats"]["disk_cache_size"] == bound for r in results)


def test_a_range_another_process_cached_after_the_open_is_used(url, packed, tmp_path):
    bundle, expected = packed
    cache = tmp_path / "cache"
    late = _reader(url, cache, expected, "--wait")
    assert late.stdout is not None and late.stdout.readline().strip() == "open"
    opened = time.monotonic()
    _result(_reader(url, cache, expected))  # another process fills the cache meanwhile
    time.sleep(max(0.0, 2.1 - (time.monotonic() - opened)))  # past the listing's interval
    assert late.stdin is not None
    late.stdin.write("go\n")
    late.stdin.flush()
    stats = _result(late)["stats"]
    stored = sum(p.stat().st_size for p in bundle.glob("shard-*"))
    assert stats["disk_hits"] >= 1
    assert stats["bytes_fetched"] < stored // 10, (stats["bytes_fetched"], stored)
