"""Packing on a base from sources other than a directory (issue 26): ``python -m bench.delta_sources
[--scale F] [--rounds R] [--changed P] [--workdir DIR] [--no-docs]``.

A copy of the *small* dataset (100,000 files of ~20 KiB at scale 1) is made into each source
kind: a tar, a tar.gz, and the tree itself listed with ``files_from``. Each round, for each kind,
warm: *full* (``pack SRC OLD``), the baseline; *nothing changed* (``pack SRC NEW0 --base OLD``);
then P % of the files (1 % by default) get new content of the same size, the source is made
again, and *changed* (``pack SRC NEW1 --base OLD``) is timed against *full (changed)*, the new
source packed whole in the same round. (Making the archive is not timed.)

What to expect: a tar has no index, so a pack on a base still reads (and decompresses) the whole
archive, skipping only the hashing, compressing and writing of unchanged members; a list of files
is an ``lstat`` and a lookup in OLD per unchanged file, as a directory walk is. Reported: each time
as a ratio to the full pack of the same source in the same round (medians), and the data bytes
NEW0 wrote. Writes ``bench-results/delta_sources-*.json`` and, unless ``--no-docs``, the section
"Versions: packing on a base, from archives and lists" of docs/benchmarks.md.

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

SECTION = "## Versions: packing on a base, from archives and lists"
KINDS = ("tar", "tar.gz", "files_from")

log = logger("delta_sources")


def _source(kind: str, tree: Path, area: Path, files: list[str]) -> tuple[str, dict]:
    """The source of ``kind`` made from ``tree`` (untimed): SRC and its options."""
    if kind == "files_from":
        return str(tree), {"files_from": tuple(files)}
    out = area / ("t.tar" if kind == "tar" else "t.tar.gz")
    flags = ["-czf"] if kind == "tar.gz" else ["-cf"]
    subprocess.run(["tar", *flags, str(out), "-C", str(tree), "."], check=True)
    return str(out), {}


def _timed(src: str, dest: Path, options: dict, base: Path | None = None) -> dict[str, Any]:
    shutil.rmtree(dest, ignore_errors=True)
    started = time.perf_counter()
    summary = pack(src, str(dest), PackOptions(**options), base=base)
    return {"seconds": time.perf_counter() - started, "stored_bytes": summary.stored_bytes}


def _change(tree: Path, files: list[str], share: float, rng: random.Random) -> None:
    for rel in sorted(rng.sample(files, max(1, round(len(files) * share)))):
        path = tree / rel
        path.write_bytes(rng.randbytes(path.stat().st_size))


def _round(kind: str, tree: Path, area: Path, files: list[str], share: float, seed: int) -> dict:
    """One round of ``kind`` on a fresh copy of the dataset at ``tree``."""
    src, options = _source(kind, tree, area, files)
    facts = {"full": _timed(src, area / "old", options)}
    facts["nothing"] = _timed(src, area / "new0", options, area / "old")
    _change(tree, files, share, random.Random(seed))
    src, options = _source(kind, tree, area, files)
    facts["changed"] = _timed(src, area / "new1", options, area / "old")
    facts["full_changed"] = _timed(src, area / "full1", options)
    for name in ("old", "new0", "new1", "full1"):
        shutil.rmtree(area / name, ignore_errors=True)
    return facts


def measure(workdir: Path, scale: float, rounds: int, share: float) -> dict[str, Any]:
    ds = datasets.small(workdir, scale, seed=1, log=log)
    area = workdir / "delta_sources"
    out: dict[str, Any] = {"files": len(ds.files), "bytes": ds.total_bytes, "rounds": []}
    for r in range(rounds):
        facts: dict[str, Any] = {}
        for kind in KINDS:
            shutil.rmtree(area, ignore_errors=True)
            area.mkdir(parents=True)
            tree = area / "tree"
            subprocess.run(["cp", "-a", "--reflink=auto", str(ds.root), str(tree)], check=True)
            facts[kind] = _round(kind, tree, area, ds.files, share, seed=r)
            f = facts[kind]
            log(
                f"round {r + 1}/{rounds} {kind}: full {f['full']['seconds']:.1f} s, nothing "
                f"{f['nothing']['seconds']:.2f} s, changed {f['changed']['seconds']:.2f} s "
                f"(full {f['full_changed']['seconds']:.1f} s)"
            )
        out["rounds"].append(facts)
    shutil.rmtree(area, ignore_errors=True)
    return out


def summarize(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    rounds = results["rounds"]
    return {
        kind: {
            "full_s": median(f[kind]["full"]["seconds"] for f in rounds),
            "nothing_ratio": median(
                f[kind]["nothing"]["seconds"] / f[kind]["full"]["seconds"] for f in rounds
            ),
            "changed_ratio": median(
                f[kind]["changed"]["seconds"] / f[kind]["full_changed"]["seconds"] for f in rounds
            ),
            "nothing_bytes": max(f[kind]["nothing"]["stored_bytes"] for f in rounds),
        }
        for kind in KINDS
    }


def render(results: dict[str, Any]) -> str:
    s = summarize(results)
    rows = [
        f"| {kind} | {v['full_s']:.1f} s | {v['nothing_ratio']:.3f} | {v['changed_ratio']:.3f} | "
        f"{v['nothing_bytes']:.0f} |"
        for kind, v in s.items()
    ]
    return "\n".join(
        [
            SECTION,
            "",
            f"`python -m bench.delta_sources` ({results['started']}, {len(results['rounds'])} "
            f"rounds, load {results['load']}): the small dataset ({results['files']:,} files, "
            f"{results['bytes'] / 1e9:.2f} GB) as each source, packed whole, then on that bundle "
            f"with nothing changed and after {results['changed']:g} % of the files got new "
            "content (the source made again); each time against a full pack of the same source "
            "in the same round, warm. Medians. A tar has no index: a pack on a base still reads "
            "and decompresses all of it.",
            "",
            "| source | full pack | nothing changed × full | changed × full | data bytes, "
            "nothing changed |",
            "|---|---:|---:|---:|---:|",
            *rows,
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.delta_sources", description=__doc__)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/bundlefs-bench"))
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--changed", type=float, default=1.0, help="percent of files changed")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args(argv)
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = Path("/proc/loadavg").read_text().split()[0]
    results = measure(args.workdir, args.scale, args.rounds, args.changed / 100)
    load += " to " + Path("/proc/loadavg").read_text().split()[0]  # at the start and the end
    results.update(started=started, load=load, changed=args.changed, summary=summarize(results))
    publish("delta_sources", results, render(results), docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
