"""Record compression side by side: ``python -m bench.codecs [--rounds R] [--no-docs]``.

Packs the *source* dataset (the Python standard library's source tree, as ``make bench`` copies it)
with each codec — lz4 (the default), zstd at levels 1, 3 (its default) and 19, and none — and
measures, per codec:

- the ratio (file bytes / stored shard bytes) and the pack time;
- decode speed: every compressed record of the bundle read from the page cache, CRC-checked and
  decompressed in this process, in MB/s of output (the cost a cold read pays on top of the disk);
- a full read in pack order through the library (``Bundle.iter_files``), warm, in MB/s.

Speeds are medians over rounds, with the codecs interleaved in each round, and are reported as
ratios to lz4 measured in the same run (the machine is shared and noisy). Writes
``bench-results/codecs-*.json`` and the section "Compression: lz4 and zstd" of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import time
from pathlib import Path
from typing import Any

from bench import datasets
from bench.report import logger, median, write_section
from bundlefs import Bundle, PackOptions, pack

REPO = Path(__file__).resolve().parent.parent
CODECS = ("lz4", "zstd:1", "zstd", "zstd:19", "none")
SECTION = "## Compression: lz4 and zstd"


log = logger("codecs")


def decode_all(bundle: Bundle) -> tuple[int, float]:
    """(bytes produced, seconds) for loading every record of every shard, uncached."""
    # The records, not the cache: decode cost without cache bookkeeping.
    shards = bundle._parts.shards
    produced = 0
    started = time.perf_counter()
    for shard in range(bundle.config.shard_count):
        for record in bundle.content.records(shard):
            produced += len(shards.load(record))
    return produced, time.perf_counter() - started


def read_all(bundle: Bundle) -> tuple[int, float]:
    produced = 0
    started = time.perf_counter()
    for _path, data in bundle.iter_files():
        produced += len(data)
    return produced, time.perf_counter() - started


def measure(workdir: Path, rounds: int) -> dict[str, Any]:
    ds = datasets.source(workdir, log)
    out: dict[str, Any] = {"files": len(ds.files), "bytes": ds.total_bytes, "codecs": {}}
    bundles = {}
    for codec in CODECS:
        dest = workdir / "codecs" / codec.replace(":", "-")
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        summary = pack(str(ds.root), str(dest), PackOptions(compression=codec, created_ns=0))
        bundles[codec] = dest
        out["codecs"][codec] = {
            "stored_bytes": summary.stored_bytes,
            "ratio": summary.config.data_bytes / summary.stored_bytes,
            "pack_s": summary.seconds,
            "decode_mbps": [],
            "read_mbps": [],
        }
        log(f"{codec:8} ratio {out['codecs'][codec]['ratio']:.2f}, pack {summary.seconds:.1f} s")
    for r in range(rounds):
        order = CODECS[r % len(CODECS) :] + CODECS[: r % len(CODECS)]
        for codec in order:
            with Bundle(bundles[codec], cache_size=64 * 2**20) as b:
                produced, seconds = decode_all(b)
                out["codecs"][codec]["decode_mbps"].append(produced / seconds / 1e6)
                produced, seconds = read_all(b)
                out["codecs"][codec]["read_mbps"].append(produced / seconds / 1e6)
        log(f"round {r + 1}/{rounds} done")
    for facts in out["codecs"].values():
        facts["decode_median"] = median(facts["decode_mbps"])
        facts["read_median"] = median(facts["read_mbps"])
    return out


def render(results: dict[str, Any]) -> str:
    codecs = results["codecs"]
    lz4 = codecs["lz4"]
    lines = [
        SECTION,
        "",
        f"`python -m bench.codecs` ({results['started']}, {results['rounds']} rounds): the source "
        f"dataset ({results['files']:,} files, {results['bytes'] / 1e6:.1f} MB of Python source) "
        "packed with each codec (`bundlefs pack --compression CODEC`). *Decode* loads every "
        "record from the page cache, checks its CRC and expands it; *read* is "
        "`Bundle.iter_files()` over the whole bundle, warm. Medians; ratios against lz4 in the "
        "same run.",
        "",
        "| codec | ratio | stored | pack | decode MB/s | × lz4 | read MB/s | × lz4 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for codec, f in codecs.items():
        lines.append(
            f"| {codec} | {f['ratio']:.2f} | {f['stored_bytes'] / 1e6:.1f} MB | "
            f"{f['pack_s']:.1f} s | {f['decode_median']:,.0f} | "
            f"{f['decode_median'] / lz4['decode_median']:.2f} | {f['read_median']:,.0f} | "
            f"{f['read_median'] / lz4['read_median']:.2f} |"
        )
    best = max((c for c in codecs if c.startswith("zstd")), key=lambda c: codecs[c]["ratio"])
    zstd = codecs["zstd"]
    lines += [
        "",
        f"zstd stores this text in {zstd['stored_bytes'] / lz4['stored_bytes']:.0%} of lz4's "
        f"bytes at its default level ({codecs[best]['stored_bytes'] / lz4['stored_bytes']:.0%} "
        f"at {best}, which packs {codecs[best]['pack_s'] / lz4['pack_s']:.0f}× slower), and "
        f"decodes at {zstd['decode_median'] / lz4['decode_median']:.2f}× lz4's speed; a whole "
        f"warm read, where CRCs, lookups and copies also cost, runs at "
        f"{zstd['read_median'] / lz4['read_median']:.2f}×. lz4 stays the default, for reads. "
        "zstd is for bundles where stored or transferred bytes cost more than CPU: archives, "
        "slow disks, object stores.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.codecs", description=__doc__)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/bundlefs-bench"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args(argv)
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    results = measure(args.workdir, args.rounds)
    results.update(started=started, rounds=args.rounds)
    out_dir = REPO / "bench-results"
    out_dir.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    (out_dir / f"codecs-{stamp}.json").write_text(json.dumps(results, indent=2))
    text = render(results)
    print(text)
    if not args.no_docs:
        write_section(text, REPO / "docs" / "benchmarks.md")
        log("wrote the section to docs/benchmarks.md")
    shutil.rmtree(args.workdir / "codecs", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
