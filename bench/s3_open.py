"""The first byte of a bundle on an object store (issue 27): ``python -m bench.s3_open
[--sizes 100000,1000000] [--rounds 5] [--workdir DIR] [--no-docs]``.

For each size N the scale tree (``bench.scale.Tree``: N generated files of ~570 B, ``big/``
holding N/10 of them) is packed and published to a local S3 server (moto's, counting requests
and GET body bytes at the server: ``bench.object_store``). Only ``COMPLETE``, ``index/`` and the
shards of the files read are uploaded (an open touches no other object), and each is read once
before the rounds (moto reads a new object whole on its first GET). Each round, in a new
process with an empty disk cache, ``Bundle(url)`` is opened and the first byte of one file read
(round 1 a file in ``big/``, the largest directory: the longest binary search; then random
files), timed from the open to that byte, with what the server sent before it. Two variants
alternate in one run: *paged* (this version: the index fetched page by page as lookups need
it) and *whole* (the whole index fetched into the cache first, as every version did before:
``fetch_index(whole=True)``). The issue's bound: at 10,000,000 files (~570 MB of index), ≤ 1 s
and ≤ 4 MB fetched before the first byte.

Writes ``bench-results/s3open-*.json`` and, unless ``--no-docs``, the section "An object-store
bundle's first byte" of docs/scale.md. The work directory (under /var/tmp by default) and the
server are removed and stopped at the end.

May import: the standard library, ``bench`` (report, scale, object_store) and ``bundlefs``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import report
from bench.object_store import S3Server
from bench.scale import CREATED_S, DOC, Tree, TreeSource

SECTION = "## An object-store bundle's first byte"
SIZES = (100_000, 1_000_000)
ROUNDS = 5
VARIANTS = ("paged", "whole")
BOUND_SECONDS, BOUND_BYTES, BOUND_AT = 1.0, 4_000_000, 10_000_000
MB = 1e6

log = report.logger("s3-open")

# Run in a fresh interpreter per round: imports first (not timed), then open and first byte.
_ROUND = r"""
import json, sys, time, urllib.request
import s3fs, aiobotocore.session  # what a reader of s3 has imported: not timed
from bundlefs import Bundle
from bundlefs.storage.objectstore.fetcher import Fetcher
from bundlefs.storage.location import parse_location
from bundlefs.storage.objectstore.index_fetch import fetch_index
url, path, cache, variant, endpoint, counts = sys.argv[1:7]
options = {"key": "test", "secret": "test",
           "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
def server():
    with urllib.request.urlopen(endpoint + counts, timeout=5) as r:
        return json.load(r)
objects = {}
real = Fetcher.get
def get(self, url, start=None, end=None):
    data = real(self, url, start, end)
    name = url.rsplit("/", 1)[-1]
    objects[name] = objects.get(name, 0) + len(data)
    return data
Fetcher.get = get
before = server()
t0 = time.perf_counter()
if variant == "whole":
    fetch_index(parse_location(url, options), cache, whole=True)
b = Bundle(url, storage_options=options, disk_cache=cache)
with b.open(path) as f:
    first = f.read(1)
t1 = time.perf_counter()
after = server()
index = objects.get("data.mdb", 0) + objects.get("pages", 0)
t2 = time.perf_counter()
b2 = Bundle(url, storage_options=options, disk_cache=cache)  # the same cache: a second open
with b2.open(path) as f:
    f.read(1)
t3 = time.perf_counter()
b.close(); b2.close()
print(json.dumps({"seconds": t1 - t0, "warm_seconds": t3 - t2, "first": first.hex(),
                  "gets": after.get("GET", 0) - before.get("GET", 0),
                  "bytes": after.get("GET bytes", 0) - before.get("GET bytes", 0),
                  "index_bytes": index}))
"""


def _pack(files: int, dest: Path) -> float:
    from bundlefs import PackOptions, pack

    t0 = time.perf_counter()
    tree = Tree(files)
    pack(TreeSource(tree), str(dest), PackOptions(created_ns=CREATED_S * 10**9, jobs=2))
    return time.perf_counter() - t0


def _paths(tree: Tree, rounds: int) -> list[int]:
    """Round 1: a file in ``big/``; then random files."""
    sample = tree.sample(rounds + 1)
    in_big = next((i for i in tree.sample(1000) if i < tree.big), 0)
    return [in_big] + [i for i in sample if i != in_big][: rounds - 1]


def _upload(server: S3Server, bundle: Path, url: str, files: list[int], tree: Tree) -> None:
    from bundlefs import Bundle

    with Bundle(bundle) as b:
        shards = {b.resolve(tree.path(i)).shard for i in files}
    names = ["index/data.mdb", "index/pages"] + [f"shard-{s:08d}" for s in sorted(shards)]
    server.create_bucket("open")
    client = server.client()
    key = url.split("/", 3)[3]
    for name in [*names, "COMPLETE"]:  # the marker last, as a pack publishes
        client.upload_file(str(bundle / name), "open", f"{key}/{name}")
    # moto reads a new object's whole value on its first GET (seconds for a 1 GB shard at
    # 10,000,000 files: the first round took 3.4-3.9 s, the same file 1.2 s later): one
    # untimed GET of each first, so that the rounds time the reader, not the server.
    for name in names:
        client.get_object(Bucket="open", Key=f"{key}/{name}", Range="bytes=0-0")["Body"].read()


def _round(server: S3Server, url: str, path: str, cache: Path, variant: str) -> dict[str, Any]:
    from bench.object_store import COUNTS_PATH

    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _ROUND,
            url,
            path,
            str(cache),
            variant,
            server.endpoint,
            COUNTS_PATH,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    shutil.rmtree(cache, ignore_errors=True)
    if out.returncode:
        raise RuntimeError(f"the round failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


RUN_SIZES = (4096, 16384, 65536, 262144, 1048576)


def run_latency(server: S3Server, url: str, index_bytes: int, count: int = 20) -> dict[str, float]:
    """Median ms of a ranged GET of the index of each run size (``index_fill.FIRST_RUN``'s
    choice), at random aligned offsets, sizes interleaved."""
    import random

    from bundlefs.storage.location import parse_location
    from bundlefs.storage.objectstore.client import remote_filesystem

    fs = remote_filesystem(parse_location(url, server.storage_options))
    target = f"{url}/index/data.mdb"
    rng = random.Random(27)
    times: dict[int, list[float]] = {n: [] for n in RUN_SIZES}
    fs.cat_file(target, start=0, end=4096)  # the connection made
    for _ in range(count):
        for n in RUN_SIZES:
            at = rng.randrange(max(1, index_bytes - n)) // 4096 * 4096
            t0 = time.perf_counter()
            fs.cat_file(target, start=at, end=at + n)
            times[n].append((time.perf_counter() - t0) * 1e3)
    return {str(n): report.median(v) for n, v in times.items()}


def measure(files: int, work: Path, server: S3Server, rounds: int) -> dict[str, Any]:
    tree = Tree(files)
    bundle = work / f"{files}.bundle"
    log(f"{files:,} files: packing")
    pack_seconds = _pack(files, bundle)
    picked = _paths(tree, rounds)
    url = f"s3://open/n{files}/b.bundle"
    _upload(server, bundle, url, picked, tree)
    index_bytes = (bundle / "index" / "data.mdb").stat().st_size
    table_bytes = (bundle / "index" / "pages").stat().st_size
    out: dict[str, Any] = {
        "index_bytes": index_bytes,
        "table_bytes": table_bytes,
        "pack_seconds": pack_seconds,
        **{v: [] for v in VARIANTS},
    }
    out["run_ms"] = run_latency(server, url, index_bytes)
    log(f"{files:,} ranged GET ms by size: {out['run_ms']}")
    for n, i in enumerate(picked):
        for variant in VARIANTS if n % 2 == 0 else VARIANTS[::-1]:  # alternate which goes first
            r = _round(server, url, tree.path(i), work / "cache", variant)
            r["path"] = tree.path(i)
            out[variant].append(r)
            log(
                f"{files:,} {variant} {tree.path(i)}: {r['seconds'] * 1e3:,.0f} ms, "
                f"{r['gets']} GETs, {r['bytes'] / MB:.2f} MB ({r['index_bytes'] / MB:.2f} index)"
            )
    shutil.rmtree(bundle)
    return out


def _median(values: list[float]) -> float:
    return report.median(values)


def render(results: dict[str, Any]) -> str:
    sizes = sorted(int(n) for n in results["sizes"])
    meta = results["meta"]
    at = {n: results["sizes"][str(n)] for n in sizes}
    lines = [
        SECTION,
        "",
        f"`python -m bench.s3_open --sizes {','.join(map(str, sizes))} --rounds {meta['rounds']}` "
        f"on {meta['started']} ({meta['minutes']:.0f} min), bundlefs at `{meta['git_head']}`; "
        f"load {meta['load_start']} at the start, {meta['load_end']} at the end. Local moto "
        "server on the loopback; a new process and an empty disk cache per round, timed from "
        "`Bundle(url)` to the first byte of a file (imports, s3fs's included, not counted); bytes "
        "and GETs as the server counted them, the index's (`index/data.mdb` and `index/pages`) "
        "as the reader did. Median over the rounds (round 1 reads a file of `big/`, the "
        "largest directory), the worst in brackets. *paged*: this version; *whole*: the index "
        "fetched whole first, as before. Warm: a second open on the same cache.",
        "",
        "| figure | " + " | ".join(f"{n:,} files" for n in sizes) + " | growth |",
        "|---|" + "---:|" * len(sizes) + "---:|",
        "| index (MB) | "
        + " | ".join(f"{at[n]['index_bytes'] / MB:,.1f}" for n in sizes)
        + f" | {at[sizes[-1]]['index_bytes'] / at[sizes[0]]['index_bytes']:.1f}× |",
        "| page table (MB) | "
        + " | ".join(f"{at[n]['table_bytes'] / MB:,.2f}" for n in sizes)
        + " | |",
    ]
    for variant in VARIANTS:
        for figure, label, scale, digits in (
            ("seconds", "first byte (ms)", 1e3, 0),
            ("bytes", "fetched before it (MB)", 1 / MB, 2),
            ("index_bytes", "of it, the index's (MB)", 1 / MB, 2),
            ("gets", "GETs before it", 1, 0),
            ("warm_seconds", "first byte, warm (ms)", 1e3, 0),
        ):
            values = {n: [r[figure] * scale for r in at[n][variant]] for n in sizes}
            cells = [
                f"{_median(values[n]):,.{digits}f} ({max(values[n]):,.{digits}f})" for n in sizes
            ]
            first, last = _median(values[sizes[0]]), _median(values[sizes[-1]])
            growth = f"{last / first:.2f}×" if first else ""
            lines.append(f"| {variant}: {label} | " + " | ".join(cells) + f" | {growth} |")
    lines += [
        "",
        "A ranged GET of the index, by size (median ms of 20, sizes interleaved, one "
        "connection): what chose a sparse copy's run of 64 KiB (`index_fill.FIRST_RUN`).",
        "",
        "| files | " + " | ".join(f"{n // 1024} KiB" for n in RUN_SIZES) + " |",
        "|---|" + "---:|" * len(RUN_SIZES),
    ]
    for n in sizes:
        run_ms = at[n]["run_ms"]
        lines.append(f"| {n:,} | " + " | ".join(f"{run_ms[str(r)]:.1f}" for r in RUN_SIZES) + " |")
    lines += [
        "",
        f"The issue's bound, at {BOUND_AT:,} files: first byte ≤ {BOUND_SECONDS:g} s and ≤ "
        f"{BOUND_BYTES / MB:g} MB fetched before it (the paged rows).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.s3_open", description=__doc__)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="file counts (%(default)s)")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="rounds per size (%(default)s)")
    ap.add_argument("--workdir", type=Path, help="where bundles are built (removed at the end)")
    ap.add_argument("--no-docs", action="store_true", help="do not write docs/scale.md")
    args = ap.parse_args(argv)
    sizes = sorted(int(float(s)) for s in args.sizes.split(","))
    clock = report.RunClock()
    work = Path(tempfile.mkdtemp(prefix="bundlefs-bench-s3open.", dir=args.workdir or "/var/tmp"))
    server = S3Server(work / "moto.log")
    try:
        server.start()
        measured = {str(n): measure(n, work, server, args.rounds) for n in sizes}
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    results = {"sizes": measured, "meta": clock.meta(rounds=args.rounds)}
    report.publish("s3open", results, render(results), docs=not args.no_docs, section=DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
