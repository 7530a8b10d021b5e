"""Soak: concurrent readers of a mounted bundle get the right bytes, in bounded memory (issue 5).

A bundle of a few thousand files (small ones sharing records, large ones over many records, some
incompressible) is mounted with a 32 MiB record cache — smaller than the data, so the cache
evicts all the time. Reader threads in this process and reader processes read random files at
random offsets and lengths, compare every byte with the source tree, and drop the kernel's page
cache for the file after each read (``POSIX_FADV_DONTNEED``) so the reads reach the daemon. The
daemon's VmRSS and RssAnon are sampled throughout and must stay below the cache size plus a fixed
margin, in every process of the mount (it is served by ``WORKERS`` worker processes, whose
record caches share the 32 MiB): each worker's below its share of the cache plus the margin, and
their RssAnon together below the cache plus a margin per worker. ``BUNDLEFS_SOAK_SECONDS`` sets
the duration (``make soak``: 300 s; default 20 s).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bundlefs import PackOptions, pack
from tests.support.hostile import report_line

pytestmark = pytest.mark.mount

SECONDS = float(os.environ.get("BUNDLEFS_SOAK_SECONDS", "20"))
STATS = "user.bundlefs.stats"
CACHE = 32 * 2**20
MARGIN = 64 * 2**20
THREADS = 4
PROCESSES = 3
WORKERS = 3

# One reader: random file, random offset and length, bytes compared with the source file.
READER = r"""
import json, os, random, sys, time

def run(mount, source, files, seconds, seed):
    rng = random.Random(seed)
    reads = nbytes = 0
    errors = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(errors) < 5:
        rel, size = files[rng.randrange(len(files))]
        if rng.random() < 0.1 or size == 0:
            off, n = 0, size + 1  # whole file (the read path that checks the file CRC)
        else:
            off = rng.randrange(size)
            n = rng.choice((1, 100, 4096, 65536, 300_000))
        try:
            fd = os.open(os.path.join(mount, rel), os.O_RDONLY)
            try:
                got = os.pread(fd, n, off)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except OSError as e:
            errors.append(f"{rel} at {off}+{n}: {e}")
            continue
        with open(os.path.join(source, rel), "rb") as f:
            f.seek(off)
            want = f.read(n)
        if got != want:
            errors.append(f"wrong bytes: {rel} at {off}+{n}")
        reads += 1
        nbytes += len(got)
    return {"reads": reads, "bytes": nbytes, "errors": errors}

if __name__ == "__main__":
    mount, source, listing, seconds, seed = sys.argv[1:]
    with open(listing) as f:
        files = json.load(f)
    print(json.dumps(run(mount, source, files, float(seconds), int(seed))))
"""


@pytest.fixture(scope="module")
def soak_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("soak") / "src"
    rng = random.Random(11)
    words = [rng.randbytes(rng.randint(4, 16)) for _ in range(200)]
    files = []
    for i in range(3000):
        # One file in a hundred spans many records; the rest are small and share records.
        big = i % 100 == 0
        size = rng.randint(300_000, 2_500_000) if big else int(rng.expovariate(1 / 12_000))
        if i % 3 == 0:
            data = rng.randbytes(size)  # incompressible: stored raw
        else:
            data = (b"".join(rng.choice(words) for _ in range(size // 8 + 1)))[:size]
        rel = f"d{i % 37:02d}/s{i % 5}/f{i:04d}.bin"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        files.append((rel, size))
    return root, files


def _memory(pid: int) -> tuple[int, int]:
    """(VmRSS, RssAnon) of a process, in bytes."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                values[key] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["RssAnon"]


def test_concurrent_random_reads_get_the_right_bytes_in_bounded_memory(
    soak_tree, tmp_path, mount_bundle, request
):
    source, files = soak_tree
    bundle = tmp_path / "soak.bundle"
    pack(str(source), str(bundle), PackOptions())
    m = mount_bundle(bundle, "--cache-size", "32MiB", "--workers", str(WORKERS))
    listing = tmp_path / "files.json"
    listing.write_text(json.dumps(files))
    script = tmp_path / "reader.py"
    script.write_text(READER)

    peak = [0, 0, 0]  # one process's VmRSS and RssAnon, and the mount's RssAnon summed
    samples = []
    stop = threading.Event()
    workers = [w["pid"] for w in json.loads(os.getxattr(m.mountpoint, STATS))["worker_processes"]]

    def sample() -> None:
        while not stop.is_set():
            memory = [_memory(pid) for pid in [m.pid, *workers]]
            peak[0] = max(peak[0], *(rss for rss, _ in memory))
            peak[1] = max(peak[1], *(anon for _, anon in memory))
            peak[2] = max(peak[2], sum(anon for _, anon in memory))
            samples.append(memory[0][0])
            stop.wait(0.25)

    namespace: dict = {}
    exec(compile(READER, str(script), "exec"), namespace)  # the same reader, in threads
    results: list[dict] = []

    def thread_reader(seed: int) -> None:
        results.append(namespace["run"](str(m.mountpoint), str(source), files, SECONDS, seed))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), str(m.mountpoint), str(source), str(listing)]
            + [str(SECONDS), str(100 + i)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    threads = [threading.Thread(target=thread_reader, args=(i,)) for i in range(THREADS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in processes:
        out, _ = p.communicate(timeout=SECONDS + 120)
        assert p.returncode == 0
        results.append(json.loads(out))
    elapsed = time.monotonic() - started
    stop.set()
    sampler.join()

    reads = sum(r["reads"] for r in results)
    nbytes = sum(r["bytes"] for r in results)
    errors = [e for r in results for e in r["errors"]]
    stats = json.loads(os.getxattr(m.mountpoint, STATS))
    report_line(
        request,
        f"soak: {len(files)} files, {THREADS} threads + {PROCESSES} processes for {elapsed:.0f} s: "
        f"{reads:,} reads, {nbytes / 2**20:,.0f} MiB checked, {len(errors)} errors; "
        f"{WORKERS} workers, peak per process VmRSS {peak[0] / 2**20:.0f} MiB, RssAnon "
        f"{peak[1] / 2**20:.0f} MiB, all RssAnon {peak[2] / 2**20:.0f} MiB (cache "
        f"{CACHE / 2**20:.0f} MiB + margin {MARGIN / 2**20:.0f} MiB a process); cache misses "
        f"{stats['cache_misses']:,}, evictions {stats['cache_evictions']:,}",
    )
    assert errors == []
    assert reads > 0 and len(samples) > 0
    assert stats["cache_evictions"] > 0  # the cache was under pressure, not just warm
    assert peak[1] < CACHE // WORKERS + MARGIN
    assert peak[0] < CACHE // WORKERS + MARGIN
    assert peak[2] < CACHE + MARGIN * WORKERS
    assert m.process.poll() is None
    assert sum(w["restarts"] for w in stats["worker_processes"]) == 0
