"""Bounded memory (issue 27): ``python -m bench.memory [--sizes 100000,1000000] [--workdir DIR]
[--no-docs]``.

For each size N, the scale tree (``bench.scale.Tree``: N generated files of ~570 B, never on
disk) is

- packed from a tar on stdin (``bundlefs pack - B``, fed by ``bench.scale.tar_chunks`` from this
  process): the packer's peak RSS;
- verified (``bundlefs verify B``);
- merged with itself at two prefixes (``bundlefs merge B B M --at a --at b``: 2N files).

Each command's peak RSS is its VmHWM (``wait4``), which counts the file pages it maps too (the
index LMDB maps, read or written); its peak RssAnon, sampled every 20 ms, is its own memory. The
growth per entry between the smallest and the largest size gives the projections to the issue's
targets: a tar of 10,000,000 members packed in ≤ 256 MB, a bundle of 100,000,000 files verified
in ≤ 128 MB, and merge at 10,000,000 entries.

Writes ``bench-results/memory-*.json`` and, unless ``--no-docs``, the section "Bounded memory" of
docs/scale.md. The work directory (a temporary directory under /var/tmp by default) is removed.

May import: the standard library, ``bench`` (report, scale).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import report
from bench.scale import CREATED_S, DOC, Tree, tar_chunks

SECTION = "## Bounded memory"
SIZES = (100_000, 1_000_000)
# Where each figure is projected to, and the bound there (MB; None: no bound).
TARGETS = {"pack": (10_000_000, 256), "verify": (100_000_000, 128), "merge": (10_000_000, None)}
CLI = [str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "bundlefs")]

log = report.logger("memory")


def _anon_kib(pid: int) -> int:
    """RssAnon of the command ``/usr/bin/time`` (``pid``) runs."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = f.read().split()
        with open(f"/proc/{children[0]}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except (OSError, IndexError):
        pass
    return 0


def run(cmd: list[str], feed: Tree | None = None) -> dict[str, float]:
    """``cmd`` run to its end (fed the tree's tar on stdin if ``feed``): its wall time, peak RSS
    and peak RssAnon (bytes)."""
    # Through /usr/bin/time: a child forked from this process would count this process's own
    # RSS in its peak (Linux keeps ru_maxrss across exec), time's child only its own.
    peak_file = tempfile.NamedTemporaryFile(prefix="bundlefs-bench-memory.", suffix=".rss")  # noqa: SIM115 - closed below
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        ["/usr/bin/time", "-f", "%M", "-o", peak_file.name, *cmd],
        stdin=subprocess.PIPE if feed is not None else subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    peak_anon = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_anon
        while not done.wait(0.02):
            peak_anon = max(peak_anon, _anon_kib(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        if feed is not None:
            assert proc.stdin is not None
            try:
                for chunk in tar_chunks(feed):
                    proc.stdin.write(chunk)
                proc.stdin.close()
            except BrokenPipeError:
                pass  # it failed: its exit code says so
        status = proc.wait()
    finally:
        done.set()
        sampler.join()
    assert proc.stderr is not None
    error = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    seconds = time.perf_counter() - t0
    with peak_file:
        peak_kib = int(peak_file.read().split()[-1])
    if status != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {error[-2000:]}")
    return {"seconds": seconds, "peak_rss": peak_kib * 1024, "peak_anon": peak_anon * 1024}


def measure(files: int, work: Path) -> dict[str, dict[str, float]]:
    tree = Tree(files)
    tree.pool  # noqa: B018 - built before the clock starts
    bundle, merged = work / f"b{files}", work / f"m{files}"
    created = ["--created", str(CREATED_S)]
    out = {"pack": run([*CLI, "pack", "-", str(bundle), "--quiet", *created], feed=tree)}
    log(f"  {files:,}: pack - {_shown(out['pack'])}")
    out["verify"] = run([*CLI, "verify", str(bundle)])
    log(f"  {files:,}: verify {_shown(out['verify'])}")
    out["merge"] = run(
        [*CLI, "merge", str(bundle), str(bundle), str(merged), "--at", "a", "--at", "b", "-q"]
        + created
    )
    log(f"  {files:,}: merge {_shown(out['merge'])}")
    shutil.rmtree(bundle)
    shutil.rmtree(merged)
    return out


def _shown(m: dict[str, float]) -> str:
    rss, anon = m["peak_rss"] / 1e6, m["peak_anon"] / 1e6
    return f"{m['seconds']:.1f} s, peak RSS {rss:,.0f} MB, RssAnon {anon:,.0f} MB"


def _entries(command: str, files: int) -> int:
    return 2 * files if command == "merge" else files


def render(results: dict[str, Any]) -> str:
    sizes = sorted(int(n) for n in results["sizes"])
    small, large = str(sizes[0]), str(sizes[-1])
    meta = results["meta"]
    lines = [
        SECTION,
        "",
        f"`python -m bench.memory --sizes {','.join(map(str, sizes))}` on {meta['started']} "
        f"({meta['minutes']:.0f} min), bundlefs at `{meta['git_head']}`; load {meta['load_start']} "
        f"at the start, {meta['load_end']} at the end. Peak RSS is the command's VmHWM (it counts "
        "the index pages it maps, read or written); RssAnon, sampled every 20 ms, its own memory. "
        "Per entry: the growth from the smallest to the largest size (merge: the entries of its "
        "output, twice the tree's); projected: linear from the largest size.",
        "",
        "| command | figure | "
        + " | ".join(f"{n:,}" for n in sizes)
        + " | per entry (bytes) | projected at | projected (MB) | bound (MB) |",
        "|---|---|" + "---:|" * len(sizes) + "---:|---:|---:|---:|",
    ]
    for command, (at, bound) in TARGETS.items():
        for figure, label in (("peak_rss", "peak RSS (MB)"), ("peak_anon", "peak RssAnon (MB)")):
            values = [results["sizes"][str(n)][command][figure] for n in sizes]
            grown = _entries(command, sizes[-1]) - _entries(command, sizes[0])
            slope = (values[-1] - values[0]) / grown if grown else 0.0
            projected = values[-1] + slope * (at - _entries(command, sizes[-1]))
            cells = " | ".join(f"{v / 1e6:,.0f}" for v in values)
            shown_bound = f"{bound}" if bound is not None and figure == "peak_rss" else ""
            lines.append(
                f"| `{command}` | {label} | {cells} | {slope:,.1f} | {at:,} | "
                f"{projected / 1e6:,.0f} | {shown_bound} |"
            )
    lines += [
        "",
        "What each holds, from the code: `pack -` keeps its members in a temporary SQLite table "
        "on disk (8 MiB of page cache; ~130 bytes a member of that file with these 21-byte names) "
        "and the builder's queue of directories; `verify` a bit per inode, ~20 bytes per "
        "directory and a 32 MiB record cache, and takes the index's mapped pages out of its "
        "resident set as it scans; `merge` the directories of about two levels of the tree (the "
        "builder's queue and the stored source's), 40 bytes per directory of totals, one entry "
        "per multiply-linked file and the names a clash overrode (`MergeSummary.overridden`).",
    ]
    times = ", ".join(f"{c} {results['sizes'][large][c]['seconds']:.0f} s" for c in TARGETS)
    lines += ["", f"Wall times at {int(large):,} files: {times} (at {int(small):,}: "
              + ", ".join(f"{c} {results['sizes'][small][c]['seconds']:.0f} s" for c in TARGETS)
              + ")."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, measure_size: Callable[..., Any] = measure) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="file counts (%(default)s)")
    ap.add_argument("--workdir", type=Path, help="where bundles are built (removed at the end)")
    ap.add_argument("--no-docs", action="store_true", help="do not write docs/scale.md")
    args = ap.parse_args(argv)
    sizes = sorted(int(float(s)) for s in args.sizes.split(","))
    clock = report.RunClock()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)  # the run's own directory goes inside
    work = Path(tempfile.mkdtemp(prefix="bundlefs-bench-memory.", dir=args.workdir or "/var/tmp"))
    try:
        measured = {str(n): measure_size(n, work) for n in sizes}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {"sizes": measured, "meta": clock.meta()}
    report.publish("memory", results, render(results), docs=not args.no_docs, section=DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
