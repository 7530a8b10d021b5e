"""Issue 26's targets table (datasets that change): ``python -m bench.versions [--no-docs]``,
the last step of ``make bench``.

It measures nothing: it reads the newest results of the parts that do, in ``bench-results/``
(bench.delta's for packing on a base and reading after generations, its small and, when a run
had it, its million tree; bench.diff's for ``diff`` at 1,000,000 files; bench.dedup's for
``--dedup``), and puts each figure beside the issue's bound, with the run it came from (its
date), so that a figure from an older run than the others shows as such. Prints the table and,
unless ``--no-docs``, writes it as the section "Versions: issue 26's targets" of
docs/benchmarks.md.

May import: the standard library and ``bench`` (report, delta, dedup, diff).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench import dedup, delta
from bench import diff as diff_bench
from bench.report import REPO, write_section

SECTION = "## Versions: issue 26's targets"
RESULTS = REPO / "bench-results"
MISSING = "— (not run)"


def _newest(name: str, wanted: Any = None) -> dict[str, Any] | None:
    """The newest ``bench-results/NAME-*.json`` (for which ``wanted(results)`` holds)."""
    for path in sorted(RESULTS.glob(f"{name}-*.json"), reverse=True):
        try:
            results = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if wanted is None or wanted(results):
            results["_file"] = path.name
            return results
    return None


def _mark(met: bool | None) -> str:
    return "" if met is None else ("met" if met else "**missed**")


def _delta_rows(trees: dict[str, tuple[dict, dict] | None]) -> list[list[str]]:
    """Rows: measure, target, small, million, status (both trees' verdicts)."""

    def cell(name: str, key: str, fmt: str) -> tuple[str, float | None]:
        got = trees[name]
        if got is None:
            return MISSING, None
        value = got[1][key]
        return fmt.format(value), value

    specs = [
        ("`pack --base`, 1 % of files changed: time × a full pack", "≤ 0.10", "delta_ratio",
         "{:.3f}", lambda v: v <= delta.TIME_CHANGED),
        ("… new shard bytes × the changed content compressed", "≤ 1.1", "bytes_ratio", "{:.3f}",
         lambda v: v <= delta.BYTES_CHANGED),
        ("… OLD's shards copied, not hard-linked (bytes of OLD copied: 0)", "0", "copied_shards",
         "{}", lambda v: v == 0),
        ("`pack --base`, nothing changed: time × a full pack", "≤ 0.05", "nothing_ratio",
         "{:.3f}", lambda v: v <= delta.TIME_NOTHING),
        ("`pack --base`, 1 % of files only touched: time × a full pack", "≤ 0.05",
         "touched_ratio", "{:.3f}", lambda v: v <= delta.TIME_NOTHING),
        ("… data bytes written (nothing changed, touched)", "0", "nothing_bytes", "{}",
         lambda v: v == 0),
    ]  # fmt: skip
    rows = []
    for label, target, key, fmt, ok in specs:
        cells = [cell(name, key, fmt) for name in ("small", "million")]
        verdicts = [ok(v) for _, v in cells if v is not None]
        rows.append([label, target, cells[0][0], cells[1][0], _mark(all(verdicts))])
    small = trees["small"]
    reads = small[1].get("reads", {}) if small is not None else {}
    for way, how in (
        ("api_cold", "Python API, cold"),
        ("api_warm", "Python API, warm"),
        ("mount_cold", "mount, cold"),
        ("mount_warm", "mount, warm"),
    ):
        value = reads.get(way)
        text = MISSING if value is None else f"{value:.3f}"
        within = None if value is None else value >= 1 - delta.READS_WITHIN
        label = f"random reads of NEW after 10 chained 1 % generations, {how}: files/s × flat"
        rows.append([label, "≥ 0.95", text, "—", _mark(within)])
    return rows


def _diff_row(results: dict | None) -> list[str]:
    label = "`diff` of two 1,000,000-file bundles (CLI, CPU s; wall s), no shard read"
    sizes = [s for s in (results or {}).get("sizes", []) if s["files"] == 1_000_000]
    if not sizes:
        return [label, "≤ 5 s", MISSING, MISSING, ""]
    m = sizes[0]["median"]
    value = f"{m['cli_cpu']:.2f} ({m['cli']:.2f})"
    return [label, "≤ 5 s", "—", value, _mark(m["cli_cpu"] <= diff_bench.TARGET_SECONDS)]


def _dedup_rows(results: dict | None) -> list[list[str]]:
    if results is None:
        return [["`--dedup`, 30 % duplicate files", "", MISSING, "—", ""]]
    s = results["summary"]
    files = f"{results['files']:,}-file tree with 30 % duplicate files"
    return [
        [f"`--dedup` on a {files}: stored bytes × without", f"≤ {dedup.TARGET_BYTES}",
         f"{s['dups_bytes_ratio']:.3f}", "—", _mark(s["dups_bytes_ratio"] <= dedup.TARGET_BYTES)],
        ["… pack time × without (CPU; wall)", f"≤ {dedup.TARGET_TIME}",
         f"{s['dups_cpu_ratio']:.3f} ({s['dups_time_ratio']:.3f})", "—",
         _mark(s["dups_cpu_ratio"] <= dedup.TARGET_TIME)],
    ]  # fmt: skip


def _source(name: str, results: dict | None, when: str = "started") -> str:
    if results is None:
        return f"{name}: not run"
    return f"{name} {results.get(when, '?')} (`{results['_file']}`)"


def render() -> str:
    def has(tree: str) -> Any:
        return lambda r: tree in r.get("trees", {}) and "summary" in r

    runs = {tree: _newest("delta", has(tree)) for tree in ("small", "million")}
    trees = {
        tree: None if r is None else (r["trees"][tree], r["summary"][tree])
        for tree, r in runs.items()
    }
    diff_results, dedup_results = _newest("diff"), _newest("dedup")
    small, million = trees["small"], trees["million"]
    heads = [
        f"small ({small[0]['files']:,} files)" if small else "small",
        f"million ({million[0]['files']:,} files)" if million else "million",
    ]
    rows = _delta_rows(trees) + [_diff_row(diff_results)] + _dedup_rows(dedup_results)
    sources = [
        _source("bench.delta (small)", runs["small"]),
        _source("bench.delta (million: `make bench-million`)", runs["million"]),
        _source("bench.diff", diff_results, "when"),
        _source("bench.dedup", dedup_results),
    ]
    lines = [
        SECTION,
        "",
        "Issue 26's table, from the newest results of bench.delta, bench.diff and bench.dedup "
        "(`python -m bench.versions`, the last step of `make bench`; the sections below give "
        "each part's method, load and detail). Every ratio is against a baseline measured in "
        "the same run of its part. Runs: " + "; ".join(sources) + ".",
        "",
        f"| metric | target | {heads[0]} | {heads[1]} | |",
        "|---|---:|---:|---:|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.versions", description=__doc__)
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args(argv)
    text = render()
    print(text, flush=True)
    if not args.no_docs:
        write_section(text, Path(REPO / "docs" / "benchmarks.md"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
