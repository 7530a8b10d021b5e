"""``bundlefs diff`` of two big bundles (issue 26): ``python -m bench.diff [--sizes 100000,1000000]
[--workdir DIR] [--rounds R] [--keep] [--no-docs]``.

Per size N: OLD is bench.scale's generated tree of N files packed (``TreeSource``, never on
disk); NEW is the same tree with ~1.2% of the files changed (``ChangedSource``, a pure function of
N): 0.4% rewritten at the same size (``M``), 0.2% touched (``m``, mtime + 1 s), 0.2% removed
(``D``), 0.2% renamed in their directory (``R``), and new files beside 0.2% (``A``). Then every
shard file of both bundles is deleted, so nothing but the indexes can answer, and the run
measures, warm (each index read once before):

- *diff*: ``bundlefs.read.diff.diff(OLD, NEW)`` consumed whole, and the changes counted by
  status, which must equal what ``ChangedSource`` made;
- *CLI*: ``bundlefs diff --stat OLD NEW`` as a process (interpreter start and imports included);
- *scan*, the baseline: both indexes' entries read with one cursor scan each
  (``IndexReader.iter_raw``), nothing decoded: the floor of any diff that looks at every entry.

Medians over ``--rounds``; diff ÷ scan in the same run. Writes ``bench-results/diff-*.json`` and,
unless ``--no-docs``, the section "Diff of two bundles" of docs/benchmarks.md.

May import: the standard library, ``bench`` (report, scale) and ``bundlefs``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.report import logger, publish
from bench.scale import CREATED_S, Tree, TreeSource, _mix
from bundlefs import PackOptions, pack
from bundlefs.packing.sources.base import SourceItem
from bundlefs.read.diff import diff
from bundlefs.storage.index import IndexReader

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Diff of two bundles"
TARGET_SECONDS = 5.0  # issue 26: two 1M-file bundles
CHANGE_SEED = 26
# Per 1,000 files, what happens to file i (by a hash of i): [0, 4) rewritten, [4, 6) touched,
# [6, 8) removed, [8, 10) renamed, [10, 12) a new file beside it; the rest stay.
WHAT = {**dict.fromkeys(range(0, 4), "M"), **dict.fromkeys(range(4, 6), "m")}
WHAT |= {6: "D", 7: "D", 8: "R", 9: "R", 10: "A", 11: "A"}

log = logger("diff")


def fate(i: int) -> str | None:
    return WHAT.get(_mix(CHANGE_SEED << 40 ^ i) % 1000)


class ChangedSource(TreeSource):
    """``TreeSource`` with the changes of ``fate`` applied, each directory's names sorted."""

    def children(self, rel: bytes) -> Iterator[SourceItem]:
        if not rel:
            yield from super().children(rel)
            return
        items = []
        for item in super().children(rel):
            i = item.st.st_ino - 1
            what = fate(i)
            if what == "M":  # same size, other bytes
                data = bytes(b ^ 0x5A for b in item.data or b"")
                items.append(SourceItem(item.rel, item.name, item.st, data, item.st, item.st))
            elif what == "m":
                st = _with(item.st, st_mtime_ns=item.st.st_mtime_ns + 10**9)
                items.append(SourceItem(item.rel, item.name, st, item.data, st, st))
            elif what == "R":
                name = b"renamed-" + item.name
                rel_path = rel + b"/" + name
                items.append(SourceItem(rel_path, name, item.st, item.data, item.st, item.st))
            elif what != "D":
                items.append(item)
            if what == "A":
                name = item.name + b".new"
                data = b"added %d\n" % i
                st = _with(item.st, st_size=len(data), st_ino=self.tree.files + i + 1)
                items.append(SourceItem(rel + b"/" + name, name, st, data, st, st))
        yield from sorted(items, key=lambda it: it.name)


def _with(st: Any, **changes: int) -> Any:
    return dataclasses.replace(st, **changes)


def expected(files: int) -> Counter[str]:
    return Counter(what for i in range(files) if (what := fate(i)) is not None)


def _pack(source: TreeSource, dest: Path) -> float:
    started = time.perf_counter()
    pack(source, str(dest), PackOptions(created_ns=CREATED_S * 10**9, jobs=2))
    return time.perf_counter() - started


def _scan(paths: list[Path]) -> tuple[float, float]:
    """(wall, CPU) seconds to read both indexes' entries, nothing decoded."""
    started, cpu = time.perf_counter(), time.process_time()
    for path in paths:
        index = IndexReader(str(path))
        try:
            for _ in index.iter_raw(1, index.config.entry_count):
                pass
        finally:
            index.close()
    return time.perf_counter() - started, time.process_time() - cpu


def _diff(old: Path, new: Path) -> tuple[float, float, Counter[str]]:
    started, cpu = time.perf_counter(), time.process_time()
    counts = Counter(change.status for change in diff(old, new))
    return time.perf_counter() - started, time.process_time() - cpu, counts


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cli(old: Path, new: Path) -> tuple[float, float]:
    started, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run(
        [sys.executable, "-m", "bundlefs", "diff", "--stat", str(old), str(new)],
        capture_output=True,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 1:
        raise RuntimeError(f"bundlefs diff exited {done.returncode}: {done.stderr.decode()}")
    return seconds, _children_cpu() - cpu


def measure_size(files: int, workdir: Path, rounds: int) -> dict[str, Any]:
    tree = Tree(files)
    tree.pool  # noqa: B018 - built before the clocks start
    old, new = workdir / f"old-{files}.bundle", workdir / f"new-{files}.bundle"
    log(f"{files:,} files: packing OLD and NEW")
    pack_old = _pack(TreeSource(tree), old)
    pack_new = _pack(ChangedSource(tree), new)
    for bundle in (old, new):  # nothing but the indexes can answer now
        for shard in bundle.glob("shard-*"):
            shard.unlink()
    want = expected(files)
    _scan([old, new])  # warm: the indexes in the page cache
    samples: dict[str, list[float]] = {k: [] for k in ("diff", "cli", "scan")}
    samples |= {k + "_cpu": [] for k in ("diff", "cli", "scan")}
    for r in range(rounds):
        seconds, cpu, counts = _diff(old, new)
        if +counts != +want:
            raise RuntimeError(f"diff found {dict(counts)}, the tree changed {dict(want)}")
        for name, (wall, used) in (
            ("diff", (seconds, cpu)),
            ("cli", _cli(old, new)),
            ("scan", _scan([old, new])),
        ):
            samples[name].append(wall)
            samples[name + "_cpu"].append(used)
        found = dict(sorted(counts.items()))
        log(f"  round {r + 1}: diff {seconds:.2f} s ({cpu:.2f} s CPU), {found}")
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "files": files,
        "entries": tree.files + tree.dirs + 1,
        "changes": dict(sorted(want.items())),
        "pack_old_s": pack_old,
        "pack_new_s": pack_new,
        "index_bytes": sum((b / "index" / "data.mdb").stat().st_size for b in (old, new)),
        "samples": samples,
        "median": med,
        "diff_over_scan": med["diff_cpu"] / med["scan_cpu"],
        "load_average": os.getloadavg()[0],
    }


def render(results: dict[str, Any]) -> str:
    sizes = results["sizes"]
    lines = [
        SECTION,
        "",
        f"`python -m bench.diff` ({results['when']}, {results['rounds']} rounds): bench.scale's "
        "generated tree packed as OLD and again with ~1.2% of its files changed as NEW "
        "(rewritten at the same size, touched, removed, renamed, added beside), then every "
        "shard file of both deleted: only the indexes answer. *diff* is "
        "`bundlefs.read.diff.diff(OLD, NEW)` consumed whole (its counts checked against the "
        "changes made), *CLI* `bundlefs diff --stat OLD NEW` as a process (start-up included), "
        "*scan* both indexes read with one cursor scan each, nothing decoded (the floor). Each "
        "as wall time and as CPU time (the machine is shared: CPU time is what an idle machine's "
        "wall time would be); warm page cache; medians; × scan is diff's CPU time over scan's, "
        "in the same run; *load*: the 1-minute load average at the end. Target: ≤ 5 s at "
        "1,000,000 files, no shard read; the target column judges the CLI's CPU time (one "
        "thread, no disk wait with a warm cache: an idle machine's wall time).",
        "",
        "| files | changes | index bytes (both) | scan wall / CPU | diff wall / CPU | × scan "
        "| CLI wall / CPU | load | target |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in sizes:
        m = s["median"]
        target = "met" if m["cli_cpu"] <= TARGET_SECONDS else "missed"
        lines.append(
            f"| {s['files']:,} | {sum(s['changes'].values()):,} | {s['index_bytes']:,} | "
            f"{m['scan']:.2f} / {m['scan_cpu']:.2f} s | {m['diff']:.2f} / {m['diff_cpu']:.2f} s | "
            f"{s['diff_over_scan']:.1f} | {m['cli']:.2f} / {m['cli_cpu']:.2f} s | "
            f"{s['load_average']:.1f} | {target if s['files'] >= 1_000_000 else '—'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.diff", description=__doc__)
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bundlefs-bench-diff-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        sizes = [measure_size(int(n), workdir, args.rounds) for n in args.sizes.split(",")]
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    now = dt.datetime.now(dt.UTC)
    results = {"when": now.strftime("%Y-%m-%d %H:%M UTC"), "rounds": args.rounds, "sizes": sizes}
    publish("diff", results, render(results), docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
