"""Packing on a base bundle against a full pack (issue 26): ``python -m bench.delta [--scale F]
[--rounds R] [--read-rounds Q] [--changed P] [--generations G] [--sample N] [--million
[--million-files N]] [--no-mount] [--workdir DIR] [--no-docs]``.

Two trees (``--million`` adds the second; ``make bench-million``):

- *small*: a copy of bench's small dataset (100,000 files at scale 1, log-normal sizes around
  20 KiB, 30 KiB mean, 80 % random bytes and 20 % JSON text);
- *million*: ``--million-files`` (1,000,000) generated files of ~20 KiB (``write_million``:
  log-normal sizes, 20 KiB mean, half random bytes and half text, 1,000 to a directory),
  seeded, written once under the work directory and kept between runs by its stamp (~20 GB:
  removed with the work directory).

Each round, warm (the tree in the page cache as far as it fits):

1. *full*: ``pack TREE OLD``, the baseline;
2. *nothing changed*: ``pack TREE NEW0 --base OLD``;
3. *touched*: P % of the files (1 % by default, seeded) get a new mtime, same content, then
   ``pack TREE NEWT --base OLD`` (each touched file is read and compared by digest, nothing
   stored); their mtimes are put back;
4. P % of the files are rewritten with new content of the same size, then *1 % changed*:
   ``pack TREE NEW1 --base OLD``, and *full (changed)*: ``pack TREE FULL1``, the same tree
   packed whole in the same round (on the million tree the round's *full* stands in for it:
   a second 15 GB bundle would not fit beside the tree and OLD; same files, same bytes);
5. *changed alone*: only the changed files packed (``files_from``): the compressed size of the
   changed content, which NEW1's own shards should not exceed by more than 10 %.

Then, on the small tree, *generations*: G (10) times P % of the files get new content and the
tree is packed on the previous generation (the first on the last OLD), and the final tree is
packed whole (*flat*). A fixed random sample of ``--sample`` files is read whole from the last
generation and from the flat bundle, in alternating order, each of ``--read-rounds`` rounds (9:
a round is ~15 s, and at 3 the rounds of one run spread over 0.6 to 1.1 of flat, far more than
the 5 % the target allows, on this shared 2-core machine): through the Python API
(``bundlefs.Bundle.read``, a reader process as bench.run's) cold (caches dropped) and warm, and
unless ``--no-mount`` through a real mount (bench.systems' bundlefs, cat-style reads) cold and
warm: files/s of the generation ÷ the flat bundle's; through the API also files per second of the
reader's own CPU time, which the machine's other work moves far less than its wall time (a
reader preempted on a loaded machine waits in wall time only).

Reported: times as ratios to the full pack of the same tree in the same round (medians over the
rounds), own shard bytes against the changed content compressed, the data bytes NEW0 and NEWT
wrote, how OLD's shards reached NEW (hard links: zero bytes of OLD copied), and the read ratios
with the load average beside them. Writes ``bench-results/delta-*.json`` and, unless
``--no-docs``, the section "Versions: packing on a base" of docs/benchmarks.md; bench.versions
puts these beside bench.diff's and bench.dedup's in the issue's table.

May import: the standard library, ``bench`` (datasets, measure, report, systems) and
``bundlefs``'s packing API.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import datasets
from bench.measure import ReadResult, drop_caches, run_readers
from bench.report import git_head, logger, median, publish
from bench.systems import Bundlefs, mounted
from bundlefs import PackOptions, pack

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Versions: packing on a base"
MILLION_SEED = 26
MILLION_PER_DIR = 1000
MILLION_MEDIAN, MILLION_SIGMA = 16_700, 0.6  # log-normal: a mean of ~20 KiB
MILLION_MIN, MILLION_MAX = 1024, 256 * 1024
WARM_SECONDS = 2.0
# Issue 26's bounds.
TIME_CHANGED, BYTES_CHANGED, TIME_NOTHING, READS_WITHIN = 0.10, 1.10, 0.05, 0.05

log = logger("delta")


# -- the trees -------------------------------------------------------------------------------------


def write_million(root: Path, files: int, seed: int = MILLION_SEED) -> None:
    """The million tree (module docstring) at ``root``, unless its stamp says it is there."""
    params = {"kind": "million", "files": files, "seed": seed, "v": 1}
    stamp = root.with_name(root.name + ".stamp.json")
    try:
        if root.is_dir() and json.loads(stamp.read_text()) == params:
            return
    except (OSError, ValueError):
        pass
    log(f"writing {files:,} files of ~20 KiB under {root}")
    stamp.unlink(missing_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(seed)
    noise = rng.randbytes(64 * 2**20)  # each file's random half: a slice at a random offset
    text = b"".join(b"%d label %d ok\n" % (i, rng.randrange(10**6)) for i in range(40_000))
    mu = math.log(MILLION_MEDIAN)
    for i in range(files):
        if i % MILLION_PER_DIR == 0:
            folder = root / f"d{i // MILLION_PER_DIR:04d}"
            folder.mkdir(parents=True)
        size = int(min(MILLION_MAX, max(MILLION_MIN, rng.lognormvariate(mu, MILLION_SIGMA))))
        half = size // 2
        at, tat = rng.randrange(len(noise) - half), rng.randrange(len(text) - size)
        (folder / f"f{i:07d}.bin").write_bytes(
            noise[at : at + half] + text[tat : tat + size - half]
        )
    stamp.write_text(json.dumps(params))


def _files(tree: Path) -> list[str]:
    out = []
    for folder, dirs, names in os.walk(tree):
        dirs.sort()
        out += [os.path.relpath(os.path.join(folder, n), tree) for n in sorted(names)]
    return out


# -- packing ---------------------------------------------------------------------------------------


def _timed_pack(src: Path, dest: Path, base: Path | None = None, **options: Any) -> dict:
    shutil.rmtree(dest, ignore_errors=True)
    # What the last steps wrote (a tree changed, a bundle removed) is written back first: a pack
    # fsyncs, and on ext4 an fsync waits for every earlier write (measured: a pack on a base
    # with nothing changed took 6 to 8 s after the tree was copied, not 1).
    os.sync()
    started, cpu = time.perf_counter(), time.process_time()
    summary = pack(str(src), str(dest), PackOptions(**options), base=base)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    facts: dict[str, Any] = {"seconds": seconds, "cpu_seconds": cpu}
    facts["stored_bytes"] = summary.stored_bytes
    facts["data_bytes"] = summary.config.data_bytes
    if summary.reuse is not None:
        facts["reuse"] = summary.reuse.to_dict()
    return facts


def _change(tree: Path, files: list[str], share: float, rng: random.Random) -> list[str]:
    """Rewrite ``share`` of ``files`` with new random content of the same size."""
    chosen = sorted(rng.sample(files, max(1, round(len(files) * share))))
    for rel in chosen:
        path = tree / rel
        path.write_bytes(rng.randbytes(path.stat().st_size))
    return chosen


def _touch(tree: Path, files: list[str], share: float, rng: random.Random) -> dict[str, int]:
    """Give ``share`` of ``files`` an mtime one second later; returns their old mtimes."""
    chosen = sorted(rng.sample(files, max(1, round(len(files) * share))))
    before = {}
    for rel in chosen:
        st = (tree / rel).stat()
        before[rel] = st.st_mtime_ns
        os.utime(tree / rel, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    return before


def _untouch(tree: Path, before: dict[str, int]) -> None:
    for rel, mtime_ns in before.items():
        os.utime(tree / rel, ns=(mtime_ns, mtime_ns))


def pack_rounds(tree: Path, area: Path, rounds: int, share: float, second_full: bool) -> list:
    """The rounds of the module docstring on ``tree``; bundles under ``area``."""
    files = _files(tree)
    rng = random.Random(26)
    out = []
    for r in range(rounds):
        facts: dict[str, Any] = {}
        facts["full"] = _timed_pack(tree, area / "old")
        facts["nothing"] = _timed_pack(tree, area / "new0", area / "old")
        shutil.rmtree(area / "new0")
        touched = _touch(tree, files, share, rng)
        facts["touched"] = _timed_pack(tree, area / "newt", area / "old")
        shutil.rmtree(area / "newt")
        _untouch(tree, touched)
        changed = _change(tree, files, share, rng)
        facts["changed_files"] = len(changed)
        facts["changed_bytes"] = sum((tree / rel).stat().st_size for rel in changed)
        facts["delta"] = _timed_pack(tree, area / "new1", area / "old")
        shutil.rmtree(area / "new1")
        if second_full:
            facts["full_changed"] = _timed_pack(tree, area / "full1")
            shutil.rmtree(area / "full1")
        facts["changed_alone"] = _timed_pack(tree, area / "alone", files_from=changed)
        shutil.rmtree(area / "alone")
        facts["load_average"] = os.getloadavg()[0]
        out.append(facts)
        base = facts.get("full_changed", facts["full"])["seconds"]
        log(
            f"{len(files):,} files, round {r + 1}/{rounds}: full {facts['full']['seconds']:.1f} s,"
            f" nothing {facts['nothing']['seconds']:.2f} s, touched "
            f"{facts['touched']['seconds']:.2f} s, {share:.0%} changed "
            f"{facts['delta']['seconds']:.2f} s (full {base:.1f} s)"
        )
    return out


# -- generations and reads -------------------------------------------------------------------------


def generations(tree: Path, area: Path, count: int, share: float) -> tuple[Path, Path, list]:
    """``count`` chained generations on ``area/old`` and a flat pack of the final tree."""
    files = _files(tree)
    rng = random.Random(2626)
    base, times = area / "old", []
    for g in range(1, count + 1):
        _change(tree, files, share, rng)
        facts = _timed_pack(tree, area / f"gen{g}", base)
        times.append(facts)
        base = area / f"gen{g}"
    flat = area / "flat"
    times.append(_timed_pack(tree, flat))
    seconds = ", ".join(f"{t['seconds']:.1f}" for t in times[:-1])
    log(f"{count} generations: {seconds} s; flat {times[-1]['seconds']:.1f} s")
    return base, flat, times


def _read(where: Path, sample: Path, mode: str, warm: bool) -> ReadResult:
    if not warm:
        drop_caches()
    return run_readers(where, sample, 1, mode=mode, min_seconds=WARM_SECONDS if warm else 0.0)


def reads(newest: Path, flat: Path, tree: Path, workdir: Path, args: argparse.Namespace) -> dict:
    """files/s of ``newest`` and ``flat`` per way (api/mount, cold/warm), rounds alternating."""
    files = _files(tree)
    sample = random.Random(7).sample(files, min(args.sample, len(files)))
    listing = workdir / "delta-sample.txt"
    listing.write_text("".join(rel + "\n" for rel in sample))
    system = None
    if not args.no_mount:
        system = Bundlefs(workdir / "delta-systems")
        system.ensure(log)
    got: dict[str, dict[str, list[float]]] = {"new": {}, "flat": {}}
    cpu: dict[str, dict[str, list[float]]] = {"new": {}, "flat": {}}  # API reads: per CPU second
    for r in range(args.read_rounds):
        order = [("new", newest), ("flat", flat)]
        for name, bundle in order if r % 2 == 0 else order[::-1]:
            for warm in (False, True):
                way = f"api_{'warm' if warm else 'cold'}"
                read = _read(bundle, listing, "api", warm)
                got[name].setdefault(way, []).append(read.files_per_s)
                cpu[name].setdefault(way, []).append(read.files_per_cpu_s)
            if system is None:
                continue
            mnt = workdir / "delta-mnt"
            mnt.mkdir(exist_ok=True)
            with mounted(system, bundle, mnt) as m:
                for warm in (False, True):
                    way = f"mount_{'warm' if warm else 'cold'}"
                    got[name].setdefault(way, []).append(
                        _read(m.root, listing, "fs", warm).files_per_s
                    )
        log(
            f"reads round {r + 1}: "
            + ", ".join(f"{w} {got['new'][w][-1] / got['flat'][w][-1]:.3f}" for w in got["new"])
        )
    listing.unlink()
    for leftover in (workdir / "delta-mnt", workdir / "delta-mnt.log", workdir / "delta-systems"):
        if leftover.is_dir():
            leftover.rmdir()
        else:
            leftover.unlink(missing_ok=True)
    return {
        "sample": len(sample),
        "files_per_s": got,
        "files_per_cpu_s": cpu,
        "load_average": os.getloadavg()[0],
    }


# -- the run ---------------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> dict[str, Any]:
    workdir, share = args.workdir, args.changed / 100
    out: dict[str, Any] = {"trees": {}}
    ds = datasets.small(workdir, args.scale, seed=1, log=log)
    area = workdir / "delta"
    shutil.rmtree(area, ignore_errors=True)
    area.mkdir(parents=True)
    tree = area / "tree"
    subprocess.run(["cp", "-a", "--reflink=auto", str(ds.root), str(tree)], check=True)
    small: dict[str, Any] = {"files": len(ds.files), "bytes": ds.total_bytes}
    small["rounds"] = pack_rounds(tree, area, args.rounds, share, second_full=True)
    if args.generations:
        newest, flat, times = generations(tree, area, args.generations, share)
        small["generations"] = {"count": args.generations, "packs": times}
        small["reads"] = reads(newest, flat, tree, workdir, args)
    out["trees"]["small"] = small
    shutil.rmtree(area, ignore_errors=True)
    if args.million:  # packed where it was written, and rewritten by the next run
        root = workdir / "data" / f"million-{args.million_files}"
        write_million(root, args.million_files)
        time.sleep(3)  # past the racy window: a file written 2 s before a pack is compared
        root.with_name(root.name + ".stamp.json").unlink()  # its files are about to change
        area.mkdir(parents=True)
        million: dict[str, Any] = {"files": args.million_files}
        million["rounds"] = pack_rounds(root, area, 1, share, second_full=False)
        million["bytes"] = million["rounds"][0]["full"]["data_bytes"]
        out["trees"]["million"] = million
        shutil.rmtree(area, ignore_errors=True)
    return out


def summarize_tree(tree: dict[str, Any]) -> dict[str, Any]:
    rounds = tree["rounds"]

    def full(f: dict) -> dict:
        return f.get("full_changed", f["full"])

    s: dict[str, Any] = {
        "full_s": median(full(f)["seconds"] for f in rounds),
        "delta_s": median(f["delta"]["seconds"] for f in rounds),
        "nothing_s": median(f["nothing"]["seconds"] for f in rounds),
        "touched_s": median(f["touched"]["seconds"] for f in rounds),
        "delta_ratio": median(f["delta"]["seconds"] / full(f)["seconds"] for f in rounds),
        "nothing_ratio": median(f["nothing"]["seconds"] / f["full"]["seconds"] for f in rounds),
        "touched_ratio": median(f["touched"]["seconds"] / f["full"]["seconds"] for f in rounds),
        "bytes_ratio": median(
            f["delta"]["stored_bytes"] / f["changed_alone"]["stored_bytes"] for f in rounds
        ),
        "nothing_bytes": max(f[k]["stored_bytes"] for f in rounds for k in ("nothing", "touched")),
        "copied_shards": max(
            sum(n for way, n in f[k]["reuse"]["ways"].items() if way != "link")
            for f in rounds
            for k in ("delta", "nothing", "touched")
        ),
        "nothing_cpu_ratio": median(
            f["nothing"]["cpu_seconds"] / f["full"]["cpu_seconds"] for f in rounds
        ),
        "touched_cpu_ratio": median(
            f["touched"]["cpu_seconds"] / f["full"]["cpu_seconds"] for f in rounds
        ),
        "load": median(f["load_average"] for f in rounds),
    }
    if "reads" in tree:
        got = tree["reads"]["files_per_s"]
        s["reads"] = {
            way: median(n / f for n, f in zip(got["new"][way], got["flat"][way], strict=True))
            for way in got["new"]
        }
        s["reads_flat"] = {way: median(v) for way, v in got["flat"].items()}
        s["reads_rounds"] = {
            way: [n / f for n, f in zip(got["new"][way], got["flat"][way], strict=True)]
            for way in got["new"]
        }
        cpu = tree["reads"].get("files_per_cpu_s", {"new": {}, "flat": {}})
        s["reads_cpu"] = {
            way: median(n / f for n, f in zip(cpu["new"][way], cpu["flat"][way], strict=True))
            for way in cpu["new"]
        }
    return s


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    return {name: summarize_tree(tree) for name, tree in results["trees"].items()}


MARK = {True: "met", False: "**missed**"}


def _tree_rows(name: str, tree: dict[str, Any], s: dict[str, Any]) -> list[str]:
    first = tree["rounds"][0]
    base = "full (changed)" if "full_changed" in first else "full"
    label = f"{name}: {tree['files']:,} files, {tree['bytes'] / 1e9:.2f} GB (load {s['load']:.1f})"
    rows = [
        f"| {label} | `pack --base`, {first['changed_files']:,} files "
        f"({first['changed_bytes'] / 1e6:.1f} MB) changed: time × {base} | {s['delta_ratio']:.3f} "
        f"({s['delta_s']:.2f} s vs {s['full_s']:.1f} s) | ≤ {TIME_CHANGED} | "
        f"{MARK[s['delta_ratio'] <= TIME_CHANGED]} |",
        f"| | own shard bytes × the changed files packed alone | {s['bytes_ratio']:.3f} | "
        f"≤ {BYTES_CHANGED} | {MARK[s['bytes_ratio'] <= BYTES_CHANGED]} |",
        f"| | OLD's shards copied or cloned, not hard-linked (all packs on a base) | "
        f"{s['copied_shards']} | 0 | {MARK[s['copied_shards'] == 0]} |",
        f"| | `pack --base`, nothing changed: time × full (CPU time × full's) | "
        f"{s['nothing_ratio']:.3f} ({s['nothing_s']:.2f} s; CPU {s['nothing_cpu_ratio']:.3f}) | "
        f"≤ {TIME_NOTHING} | "
        f"{MARK[s['nothing_ratio'] <= TIME_NOTHING]} |",
        f"| | `pack --base`, {first['changed_files']:,} files touched: time × full (CPU) | "
        f"{s['touched_ratio']:.3f} ({s['touched_s']:.2f} s; CPU {s['touched_cpu_ratio']:.3f}) | "
        f"≤ {TIME_NOTHING} | "
        f"{MARK[s['touched_ratio'] <= TIME_NOTHING]} |",
        f"| | data bytes written, nothing changed or touched | {s['nothing_bytes']} | 0 | "
        f"{MARK[s['nothing_bytes'] == 0]} |",
    ]
    for way, ratio in s.get("reads", {}).items():
        api, temp = way.split("_")
        how = "Python API" if api == "api" else "mount, cat-style"
        in_cpu = s.get("reads_cpu", {}).get(way)
        value = f"{ratio:.3f}" if in_cpu is None else f"{ratio:.3f} (CPU {in_cpu:.3f})"
        rows.append(
            f"| | reads after {tree['generations']['count']} generations, {how}, {temp}: files/s "
            f"× flat ({s['reads_flat'][way]:,.0f}/s; rounds "
            f"{', '.join(f'{x:.2f}' for x in s['reads_rounds'][way])}) | {value} | "
            f"≥ {1 - READS_WITHIN:.2f} | "
            f"{MARK[ratio >= 1 - READS_WITHIN]} |"
        )
    return rows


def render(results: dict[str, Any]) -> str:
    summary = summarize(results)
    million = "; the million tree 1" if "million" in results["trees"] else ""
    chain = ""
    if results.get("generations"):
        chain = (
            f" Then on the small tree {results['generations']} generations, each packed on the "
            "one before after another 1 % changed, and the final tree packed whole (flat): a "
            f"sample of {results['sample']:,} files read from both, alternating, in "
            f"{results.get('read_rounds', results['rounds'])} rounds, through the "
            "Python API and a mount, cold (caches dropped) and warm; through the API also per "
            "second of the reader's CPU time (beside the wall time's ratio, which judges)."
        )
    lines = [
        SECTION,
        "",
        f"`python -m bench.delta` ({results['started']}, commit `{results['commit']}`, "
        f"{results['rounds']} rounds{million}): each tree packed whole, then packed on that "
        "bundle (`pack --base`) with nothing changed, with 1 % of the files touched (mtime only) "
        "and after 1 % got new content of the same size; each time against a full pack of the "
        f"same tree in the same round, warm.{chain} The targets judge wall time; CPU time (all "
        "threads) × the full pack's is beside it: on a loaded machine a pack on a base, one "
        "thread, gets a smaller share of the 2 cores than a full pack, which compresses on two. "
        "Medians; *load*: the 1-minute load average "
        f"(2 cores, shared): {results['load_start']:.1f} at the start, "
        f"{results['load_end']:.1f} at the end.",
        "",
        "| tree | measure | value | target | |",
        "|---|---|---:|---:|---|",
    ]
    for name, tree in results["trees"].items():
        lines += _tree_rows(name, tree, summary[name])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.delta", description=__doc__)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/bundlefs-bench"))
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--read-rounds", type=int, default=9, help="rounds of the reads")
    ap.add_argument("--changed", type=float, default=1.0, help="percent of files changed")
    ap.add_argument("--generations", type=int, default=10)
    ap.add_argument("--sample", type=int, default=2000, help="files read per pass")
    ap.add_argument("--no-mount", action="store_true", help="reads through the API only")
    ap.add_argument("--million", action="store_true", help="the million tree too (~20 GB)")
    ap.add_argument("--million-files", type=int, default=1_000_000)
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args(argv)
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_start = os.getloadavg()[0]
    results = measure(args)
    results.update(
        started=started,
        commit=git_head(),
        rounds=args.rounds,
        read_rounds=args.read_rounds,
        generations=args.generations,
        sample=args.sample,
        load_start=load_start,
        load_end=os.getloadavg()[0],
    )
    results["summary"] = summarize(results)
    publish("delta", results, render(results), docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
