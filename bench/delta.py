"""Packing on a base bundle against a full pack (issue 26): ``python -m bench.delta [--scale F]
[--rounds R] [--changed P] [--workdir DIR] [--no-docs]``.

A copy of the *small* dataset (100,000 files of ~20 KiB at scale 1, 80 % random bytes and 20 %
JSON text) is packed in rounds; each round, warm (the tree in the page cache):

1. *full*: ``pack TREE OLD``, the baseline;
2. *nothing changed*: ``pack TREE NEW0 --base OLD``;
3. P % of the files (1 % by default, seeded) are rewritten with new content of the same size, then
   *1 % changed*: ``pack TREE NEW1 --base OLD``, and *full (changed)*: ``pack TREE FULL1``, the
   same tree packed whole in the same round;
4. *changed alone*: only the changed files packed (``files_from``): the compressed size of the
   changed content, which NEW1's own shards should not exceed by more than 10 %.

Reported: each time as a ratio to the full pack of the same tree in the same round (medians
over the rounds), NEW1's own shard bytes against the changed content compressed, the data bytes
NEW0 wrote (none: it writes an index only), and how OLD's shards reached NEW (hard links: zero
bytes of OLD copied). Writes ``bench-results/delta-*.json`` and, unless ``--no-docs``, the
section "Versions: packing on a base" of docs/benchmarks.md.

May import: the standard library, ``bench`` (datasets, report) and ``bundlefs``'s packing API.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import datasets
from bench.report import logger, median, publish
from bundlefs import PackOptions, pack

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Versions: packing on a base"

log = logger("delta")


def _timed_pack(src: Path, dest: Path, base: Path | None = None, **options: Any) -> dict:
    shutil.rmtree(dest, ignore_errors=True)
    started = time.perf_counter()
    summary = pack(str(src), str(dest), PackOptions(**options), base=base)
    seconds = time.perf_counter() - started
    facts: dict[str, Any] = {"seconds": seconds, "stored_bytes": summary.stored_bytes}
    if summary.reuse is not None:
        facts["reuse"] = summary.reuse.to_dict()
    return facts


def _change(tree: Path, files: list[str], share: float, rng: random.Random) -> list[str]:
    """Rewrite ``share`` of ``files`` with new random content of the same size."""
    chosen = sorted(rng.sample(files, max(1, round(len(files) * share))))
    for rel in chosen:
        path = tree / rel
        size = path.stat().st_size
        path.write_bytes(rng.randbytes(size))
    return chosen


def measure(workdir: Path, scale: float, rounds: int, share: float) -> dict[str, Any]:
    ds = datasets.small(workdir, scale, seed=1, log=log)
    area = workdir / "delta"
    shutil.rmtree(area, ignore_errors=True)
    area.mkdir(parents=True)
    tree = area / "tree"
    subprocess.run(["cp", "-a", "--reflink=auto", str(ds.root), str(tree)], check=True)
    out: dict[str, Any] = {"files": len(ds.files), "bytes": ds.total_bytes, "rounds": []}
    rng = random.Random(26)
    for r in range(rounds):
        facts: dict[str, Any] = {}
        facts["full"] = _timed_pack(tree, area / "old")
        facts["nothing"] = _timed_pack(tree, area / "new0", area / "old")
        changed = _change(tree, ds.files, share, rng)
        facts["changed_files"] = len(changed)
        facts["changed_bytes"] = sum((tree / rel).stat().st_size for rel in changed)
        facts["delta"] = _timed_pack(tree, area / "new1", area / "old")
        facts["full_changed"] = _timed_pack(tree, area / "full1")
        facts["changed_alone"] = _timed_pack(tree, area / "alone", files_from=changed)
        out["rounds"].append(facts)
        log(
            f"round {r + 1}/{rounds}: full {facts['full']['seconds']:.1f} s, nothing "
            f"{facts['nothing']['seconds']:.2f} s, {share:.0%} changed "
            f"{facts['delta']['seconds']:.2f} s (full {facts['full_changed']['seconds']:.1f} s)"
        )
    shutil.rmtree(area, ignore_errors=True)
    return out


def summarize(results: dict[str, Any]) -> dict[str, float]:
    rounds = results["rounds"]
    return {
        "full_s": median(f["full_changed"]["seconds"] for f in rounds),
        "delta_s": median(f["delta"]["seconds"] for f in rounds),
        "nothing_s": median(f["nothing"]["seconds"] for f in rounds),
        "delta_ratio": median(f["delta"]["seconds"] / f["full_changed"]["seconds"] for f in rounds),
        "nothing_ratio": median(f["nothing"]["seconds"] / f["full"]["seconds"] for f in rounds),
        "bytes_ratio": median(
            f["delta"]["stored_bytes"] / f["changed_alone"]["stored_bytes"] for f in rounds
        ),
        "nothing_bytes": max(f["nothing"]["stored_bytes"] for f in rounds),
        "copied_shards": max(
            sum(n for way, n in f[k]["reuse"]["ways"].items() if way != "link")
            for f in rounds
            for k in ("delta", "nothing")
        ),
    }


def render(results: dict[str, Any]) -> str:
    s = summarize(results)
    first = results["rounds"][0]
    mark = {True: "met", False: "**missed**"}
    return "\n".join(
        [
            SECTION,
            "",
            f"`python -m bench.delta` ({results['started']}, {len(results['rounds'])} rounds): the "
            f"small dataset ({results['files']:,} files, {results['bytes'] / 1e9:.2f} GB) packed "
            f"whole, then packed on that bundle (`pack --base`) with nothing changed and after "
            f"{first['changed_files']:,} files ({first['changed_bytes'] / 1e6:.1f} MB) got new "
            "content; each time against a full pack of the same tree in the same round, warm. "
            "Medians.",
            "",
            "| measure | value | target | |",
            "|---|---:|---:|---|",
            f"| `pack --base`, 1 % changed: time × full pack | {s['delta_ratio']:.3f} "
            f"({s['delta_s']:.2f} s vs {s['full_s']:.1f} s) | ≤ 0.10 | "
            f"{mark[s['delta_ratio'] <= 0.10]} |",
            f"| own shard bytes × changed content compressed | {s['bytes_ratio']:.3f} | ≤ 1.10 | "
            f"{mark[s['bytes_ratio'] <= 1.10]} |",
            f"| OLD's shards copied or cloned (not hard-linked) | {s['copied_shards']} | 0 | "
            f"{mark[s['copied_shards'] == 0]} |",
            f"| `pack --base`, nothing changed: time × full pack | {s['nothing_ratio']:.3f} "
            f"({s['nothing_s']:.2f} s) | ≤ 0.05 | {mark[s['nothing_ratio'] <= 0.05]} |",
            f"| data bytes written, nothing changed | {s['nothing_bytes']} | 0 | "
            f"{mark[s['nothing_bytes'] == 0]} |",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.delta", description=__doc__)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/bundlefs-bench"))
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--changed", type=float, default=1.0, help="percent of files changed")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args(argv)
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    results = measure(args.workdir, args.scale, args.rounds, args.changed / 100)
    results.update(started=started, summary=summarize(results))
    publish("delta", results, render(results), docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
