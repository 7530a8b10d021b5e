"""Compare bundlefs between two full bench runs: did a change make any figure worse?

    python -m bench.compare BEFORE.json AFTER.json

Two runs happen at different times on a shared machine, so a raw before/after ratio mixes the
change with the host's mood. Each bundlefs figure is therefore also shown normalised by a
reference measured in the same run (raw disk, or squashfuse_ll where raw has no such figure):
a change is "worse beyond noise" only when the figure got worse by more than the threshold both
as measured and as normalised, and its samples in the two runs do not overlap.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.report import METRICS, Metric, median

THRESHOLD = 0.10  # a 10% move is within what the same commit shows between runs here
REFERENCES = ("raw", "squashfuse_ll")


def _samples(run: dict, dataset: str, system: str, key: str) -> list[float]:
    return run["samples"].get(dataset, {}).get(system, {}).get(key, [])


def _worse(metric: Metric, before: float, after: float) -> float:
    """How much worse ``after`` is, as a fraction (negative: better)."""
    if not before or not after:
        return 0.0
    return (before / after - 1) if metric.higher_is_better else (after / before - 1)


def _beyond(moved: float, normalised: float | None, apart: bool, threshold: float) -> bool:
    """Moved past the threshold as measured and as normalised, with samples apart."""
    return moved > threshold and (normalised is None or normalised > threshold) and apart


def compare(before: dict, after: dict, threshold: float = THRESHOLD) -> tuple[list[str], int]:
    """The table's lines, and how many figures got worse beyond noise."""
    lines = [
        "| dataset | figure | before | after | after ÷ before | normalised by | "
        "normalised after ÷ before | verdict |",
        "|---|---|---:|---:|---:|---|---:|---|",
    ]
    worse_count = 0
    for dataset in sorted(after["samples"]):
        for metric in METRICS:
            b = _samples(before, dataset, "bundlefs", metric.key)
            a = _samples(after, dataset, "bundlefs", metric.key)
            if not a or not b:
                continue
            mb, ma = median(b), median(a)
            moved = _worse(metric, mb, ma)
            reference, normalised = "—", None
            for ref in REFERENCES:
                rb = _samples(before, dataset, ref, metric.key)
                ra = _samples(after, dataset, ref, metric.key)
                if rb and ra and median(rb) and median(ra):
                    reference = ref
                    nb = mb / median(rb)
                    na = ma / median(ra)
                    normalised = _worse(metric, nb, na)
                    break
            disjoint = max(a) < min(b) or min(a) > max(b)
            beyond = _beyond(moved, normalised, disjoint or len(a) == 1, threshold)
            gain = _beyond(-moved, None if normalised is None else -normalised, disjoint, threshold)
            verdict = "**worse**" if beyond else ("better" if gain else "same")
            worse_count += beyond
            ratio = f"{ma / mb:.2f}×" if mb else "—"
            norm = "—" if normalised is None else f"{1 / (1 + normalised):.2f}×"
            if not metric.higher_is_better and normalised is not None:
                norm = f"{1 + normalised:.2f}×"
            lines.append(
                f"| {dataset} | {metric.label} | {metric.fmt.format(mb)} | "
                f"{metric.fmt.format(ma)} | {ratio} | {reference} | {norm} | {verdict} |"
            )
    return lines, worse_count


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--threshold", type=float, default=THRESHOLD)
    args = ap.parse_args(argv)
    before = json.loads(args.before.read_text())
    after = json.loads(args.after.read_text())
    lines, worse = compare(before, after, args.threshold)
    for key, run in (("before", before), ("after", after)):
        meta = run.get("meta", {})
        print(f"{key}: {meta.get('git_head', '?')}, started {meta.get('started', '?')}")
    print("\n".join(lines))
    print(f"\n{worse} figure(s) worse beyond noise (threshold {args.threshold:.0%}).")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
