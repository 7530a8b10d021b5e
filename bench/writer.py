"""``Writer`` against ``pack`` on the same files: ``python -m bench.writer [--files N]``.

Issue 25's target: ``bundlefs.Writer`` fed N small ``(path, bytes)`` pairs packs at least 0.9× the
files/s of ``pack`` on the same tree written to disk first, with a peak RSS of at most 100 MB.

The pairs are generated, deterministically, without holding them: ``d{i // 1000}/f{i}.bin`` of
200 to 2,000 bytes each (slices of one seeded 4 MiB blob, half random bytes, half text), added in
path order. The tree is written to ``WORKDIR/writer/tree-N`` once (kept for later runs, with a
stamp), so ``pack`` reads it from a warm page cache while the Writer is handed the same bytes from
memory. Each round runs both in child processes, in alternating order: files/s is N over the
time of the ``pack`` call, or of the Writer's adds and ``close``, measured in the child; peak RSS
is the child's own ``VmHWM``, the interpreter included. Medians over the rounds; the
ratio is taken in the same run. Writes ``bench-results/writer-*.json`` and the section "Writer: a
bundle from Python" of docs/benchmarks.md. ``make bench`` runs it at 1,000,000 files.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.report import logger, median, publish

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Writer: a bundle from Python"
TARGET_RATIO = 0.9
TARGET_RSS_MB = 100
_BLOB = 4 * 1024 * 1024
_PER_DIR = 1000
_CREATED_NS = 1_700_000_000 * 10**9

log = logger("writer")


@functools.cache
def _blob() -> bytes:
    rng = random.Random(25)
    words = b"alpha beta gamma delta label train valid image width height crop ".split()
    text = bytearray()
    while len(text) < _BLOB // 2:  # a thousand words at a time: the peak RSS is the packer's
        text += b" ".join(rng.choices(words, k=1000)) + b"\n"
    return rng.randbytes(_BLOB // 2) + bytes(text[: _BLOB // 2])


def pairs(count: int) -> Iterator[tuple[str, bytes]]:
    """The N (path, bytes) pairs, in path order; nothing but the blob is held."""
    blob = _blob()
    for i in range(count):
        size = 200 + (i * 7919) % 1801
        start = (i * 104729) % (len(blob) - size)
        yield f"d{i // _PER_DIR:04d}/f{i:07d}.bin", blob[start : start + size]


def tree(workdir: Path, count: int) -> Path:
    """The pairs as files on disk (written once; a stamp beside it says it is complete)."""
    root = workdir / "writer" / f"tree-{count}"
    stamp = root.with_name(root.name + ".complete")
    if stamp.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    log(f"writing {count:,} files to {root}")
    for i, (path, data) in enumerate(pairs(count)):
        target = root / path
        if i % _PER_DIR == 0:
            target.parent.mkdir(parents=True)
        target.write_bytes(data)
    stamp.touch()
    return root


# -- the children ----------------------------------------------------------------------------------


def child(kind: str, count: int, source: str, dest: str) -> int:
    """One timed run in this process; prints its seconds as JSON."""
    import bundlefs

    options = bundlefs.PackOptions(created_ns=_CREATED_NS)
    if kind == "pack":
        started = time.perf_counter()
        bundlefs.pack(source, dest, options)
        seconds = time.perf_counter() - started
    else:
        generated = pairs(count)
        _blob()  # made before the clock starts
        started = time.perf_counter()
        with bundlefs.Writer(dest, options) as w:
            for path, data in generated:
                w.add(path, data)
        seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "rss_mb": _peak_rss_mb()}), flush=True)
    return 0


def _peak_rss_mb() -> float:
    """This process's VmHWM: its own peak, not the parent's it was forked from (which the
    ``ru_maxrss`` of a forked-then-exec'd child may report)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run_child(kind: str, count: int, source: Path, dest: Path) -> dict[str, float]:
    """(seconds, files/s, peak RSS in MB) of one child run."""
    shutil.rmtree(dest, ignore_errors=True)
    os.sync()  # the last run's output written back now, not during this one
    cmd = [sys.executable, "-m", "bench.writer", "--child", kind, "--files", str(count)]
    proc = subprocess.Popen(
        [*cmd, "--source", str(source), "--dest", str(dest)],
        stdout=subprocess.PIPE,
        cwd=REPO,
    )
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"the {kind} child failed (exit {proc.returncode})")
    result = json.loads(out)
    return {"seconds": result["seconds"], "fps": count / result["seconds"], **result}


def check(dest: Path, count: int) -> None:
    """The Writer's bundle holds every pair (checked once, in stored order)."""
    from bundlefs import Bundle

    expected = pairs(count)
    with Bundle(dest) as b:
        assert len(b) == count, f"{len(b)} files in the bundle, {count} added"
        for (path, data), (want_path, want) in zip(b.items(), expected, strict=True):
            assert (path, data) == (want_path, want), f"{path} differs"


def measure(workdir: Path, count: int, rounds: int) -> dict[str, Any]:
    source = tree(workdir, count)
    dest = workdir / "writer" / "out.bundle"
    runs: dict[str, list[dict[str, float]]] = {"pack": [], "writer": []}
    for r in range(rounds):
        for kind in ("pack", "writer") if r % 2 == 0 else ("writer", "pack"):
            result = run_child(kind, count, source, dest)
            runs[kind].append(result)
            log(f"round {r + 1}: {kind} {result['fps']:,.0f} files/s, {result['rss_mb']:.0f} MB")
            if kind == "writer" and r == 0:
                check(dest, count)
    shutil.rmtree(dest, ignore_errors=True)
    out: dict[str, Any] = {"files": count, "rounds": rounds, "runs": runs}
    for kind, results in runs.items():
        out[kind] = {m: median(x[m] for x in results) for m in ("seconds", "fps", "rss_mb")}
    out["ratio"] = out["writer"]["fps"] / out["pack"]["fps"]
    paired = zip(runs["writer"], runs["pack"], strict=True)
    out["round_ratios"] = [w["fps"] / p["fps"] for w, p in paired]
    return out


def render(results: dict[str, Any]) -> str:
    pack, writer, ratio = results["pack"], results["writer"], results["ratio"]
    met_speed = "met" if ratio >= TARGET_RATIO else "NOT met"
    met_rss = "met" if writer["rss_mb"] <= TARGET_RSS_MB else "NOT met"
    rounds = ", ".join(f"{r:.2f}×" for r in results["round_ratios"])
    return "\n".join(
        [
            SECTION,
            "",
            f"`python -m bench.writer` ({results['started']}, {results['rounds']} rounds, "
            f"alternating): {results['files']:,} small `(path, bytes)` pairs (200 to 2,000 "
            "bytes, 1,000 to a directory) given to `bundlefs.Writer`, against `bundlefs.pack` of "
            "the same files written to disk first (read from a warm page cache). Files/s over "
            "the `pack` call, or the adds and `close`; peak RSS of the process (`VmHWM`), "
            "the interpreter included. Medians.",
            "",
            "| | seconds | files/s | × pack | peak RSS |",
            "|---|---:|---:|---:|---:|",
            f"| `pack` | {pack['seconds']:.1f} | {pack['fps']:,.0f} | 1.00 | "
            f"{pack['rss_mb']:.0f} MB |",
            f"| `Writer` | {writer['seconds']:.1f} | {writer['fps']:,.0f} | {ratio:.2f} | "
            f"{writer['rss_mb']:.0f} MB |",
            "",
            f"Targets (issue 25): files/s ≥ {TARGET_RATIO}× `pack`'s: {met_speed} "
            f"({ratio:.2f}×; round by round {rounds}); peak RSS ≤ {TARGET_RSS_MB} MB: {met_rss} "
            f"({writer['rss_mb']:.0f} MB).",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.writer", description=__doc__)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/bundlefs-bench"))
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--keep-tree", action="store_true", help="keep the tree for later runs")
    ap.add_argument("--child", choices=("pack", "writer"), help=argparse.SUPPRESS)
    ap.add_argument("--source", help=argparse.SUPPRESS)
    ap.add_argument("--dest", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child, args.files, args.source, args.dest)
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    results = measure(args.workdir, args.files, args.rounds)
    results["started"] = started
    publish("writer", results, render(results), docs=not args.no_docs)
    if not args.keep_tree:
        shutil.rmtree(args.workdir / "writer", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
