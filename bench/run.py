"""Entry point: ``python -m bench.run [--quick] [--scale F] [--workdir DIR] ...``.

Installs the peers it needs, generates the datasets, packs each dataset with every system,
checks each mount serves the right data, then runs interleaved rounds of measurements and writes
``docs/benchmarks.md``, ``docs/benchmarks.png`` and ``bench-results/*.json``.

Needs root (``/proc/sys/vm/drop_caches``, apt-get) and ``/dev/fuse``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import datasets, report
from bench.measure import Bench, Samples, rotate
from bench.report import log
from bench.systems import ALL_SYSTEMS, System, SystemUnavailable, make_system
from bench.targets import evaluate
from tests.support.mounting import sweep_stale_mounts

REPO = Path(__file__).resolve().parent.parent
ALL_DATASETS = ("small", "large", "source")


def parse_size(text: str) -> int:
    """'64MiB', '1GiB', '512M', '1048576' -> bytes (K/M/G/T are binary multiples, as for caches)."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(?:I?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"bad size {text!r}")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--quick", action="store_true", help="small scale (0.05) and fewer rounds: a few minutes"
    )
    ap.add_argument("--scale", type=float, help="file-count scale factor (default 1, quick 0.05)")
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/bundlefs-bench"))
    ap.add_argument("--rounds", type=int, help="rounds of read/mount measurements (5, quick 3)")
    ap.add_argument("--pack-rounds", type=int, help="rounds of packing (3, quick 2)")
    ap.add_argument("--sample", type=int, help="random-read sample size (5000, quick 1000)")
    ap.add_argument(
        "--systems",
        default=",".join(ALL_SYSTEMS),
        help=f"comma-separated subset of {','.join(ALL_SYSTEMS)}",
    )
    ap.add_argument(
        "--datasets",
        default=",".join(ALL_DATASETS),
        help=f"comma-separated subset of {','.join(ALL_DATASETS)}",
    )
    ap.add_argument("--cache-size", default="64MiB", help="bundlefs mount --cache-size")
    ap.add_argument(
        "--bundlefs-ref",
        metavar="REF",
        help="measure bundlefs as committed at this git ref (e.g. HEAD) instead of the work tree",
    )
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="only rewrite docs/benchmarks.md/.png from a saved bench-results JSON",
    )
    ap.add_argument(
        "--warm-seconds",
        type=float,
        help="repeat warm read passes for at least this long (1.0, quick 0.5)",
    )
    ap.add_argument(
        "--no-docs",
        action="store_true",
        help="do not rewrite docs/benchmarks.md and .png (JSON is still written)",
    )
    args = ap.parse_args(argv)
    args.scale = args.scale if args.scale is not None else (0.05 if args.quick else 1.0)
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.pack_rounds = args.pack_rounds or (2 if args.quick else 3)
    args.sample = args.sample or (1000 if args.quick else 5000)
    if args.warm_seconds is None:
        args.warm_seconds = 0.5 if args.quick else 1.0
    args.systems = [s for s in args.systems.split(",") if s]
    args.datasets = [d for d in args.datasets.split(",") if d]
    for d in args.datasets:
        if d not in ALL_DATASETS:
            ap.error(f"unknown dataset {d!r}")
    return args


def _cmd_output(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        lines = (r.stdout or r.stderr).strip().splitlines()
        return lines[0] if lines else ""
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def machine_info() -> str:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} CPUs ({model}), {mem:.0f} GiB RAM, {platform.platform()}"


def preflight(workdir: Path) -> None:
    if os.geteuid() != 0:
        sys.exit("bench.run needs root: it drops the page cache and may apt-get install peers")
    if not os.path.exists("/dev/fuse"):
        sys.exit("/dev/fuse is missing: FUSE mounts are impossible here")
    # A previous run killed hard may have left mounts behind: clear them (one bounded pass).
    for p in sweep_stale_mounts(workdir.absolute(), live_too=True):
        log(f"unmounted a stale mount left by an earlier run: {p}")


def bundlefs_snapshot(ref: str, workdir: Path) -> tuple[Path, str]:
    """Extract ``bundlefs/`` as committed at ``ref`` (read-only for the repository: git archive)."""
    sha = _cmd_output(["git", "-C", str(REPO), "rev-parse", "--short", ref])
    dest = workdir / "bundlefs-src" / sha
    if not (dest / "bundlefs" / "__init__.py").exists():
        tmp = dest.with_name(sha + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", ref, "bundlefs"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return dest, sha


def setup_systems(
    args: argparse.Namespace, samples: Samples, bundlefs_source: Path | None
) -> list[System]:
    systems = []
    for name in args.systems:
        system = make_system(name, args.workdir, args.cache_size, bundlefs_source)
        try:
            system.ensure(log)
        except SystemUnavailable as e:
            samples.errors.append(f"{name}: unavailable: {e}")
            log(f"SKIP {name}: {e}")
            continue
        systems.append(system)
    return systems


def bench_dataset(
    bench: Bench, ds: datasets.Dataset, systems: list[System], args: argparse.Namespace
) -> dict[str, Any]:
    log(f"== dataset {ds.name}: {len(ds.files):,} files, {ds.total_bytes / 1e6:,.1f} MB")
    ok = bench.pack(systems, ds, args.pack_rounds)
    # Large files: all of them, in order (the sequential test); otherwise the fixed sample.
    rels = list(ds.files) if ds.name == "large" else ds.sample(args.sample, args.seed)
    list_path = bench.list_file(ds, "sample", rels)
    expect = sum(ds.sizes[r] for r in rels)

    for system in list(ok):
        if not system.is_fuse:
            continue
        try:
            bench.verify(system, ds, rels)
        except Exception as e:  # noqa: BLE001 - report and carry on with the other systems
            bench.fail("verify", system, ds, e)
            ok.remove(system)

    for r in range(args.rounds):
        log(f"  {ds.name} round {r + 1}/{args.rounds}")
        for system in rotate(list(ok), r):
            t0 = time.perf_counter()
            try:
                if ds.name == "large":
                    bench.seq_round(system, ds, list_path, expect)
                else:
                    bench.tree_round(system, ds, list_path, expect)
                    if system.name == "bundlefs":
                        bench.api_round(system, ds, list_path, expect)
            except Exception as e:  # noqa: BLE001
                bench.fail(f"round {r + 1}", system, ds, e)
                ok.remove(system)
                continue
            log(f"    {system.name:14} {time.perf_counter() - t0:6.1f} s")
    return {"files": len(ds.files), "bytes": ds.total_bytes, "sample": len(rels)}


def write_docs(results: dict[str, Any], names: list[str]) -> None:
    """docs/benchmarks.md (+ .png when matplotlib is there) from one run's results."""
    docs = REPO / "docs"
    med = report.medians(results["samples"])
    verdicts = evaluate(med)
    png: str | None = None
    if report.ensure_matplotlib(log):
        try:
            meta = results["meta"]
            title = f"bundlefs benchmarks, scale {meta['scale']}, {meta['started']}"
            report.plot(med, names, docs / "benchmarks.png", title)
            png = "benchmarks.png"
        except Exception as e:  # noqa: BLE001 - a missing plot must not lose the tables
            log(f"plot failed: {e}")
    kept = report.extra_sections(docs / "benchmarks.md")
    (docs / "benchmarks.md").write_text(report.markdown(results, med, verdicts, names, png))
    for section in kept:
        report.write_section(section, docs / "benchmarks.md")
    log(f"wrote {docs / 'benchmarks.md'}")


def render_only(path: Path) -> int:
    """Rewrite the docs from a saved results JSON (no measuring)."""
    results = json.loads(path.read_text())
    names = [s for s in ALL_SYSTEMS if any(s in d for d in results["samples"].values())]
    write_docs(results, names)
    return 0


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    # Turn SIGTERM into SystemExit so the `finally` blocks unmount everything on the way out.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.render is not None:
        return render_only(args.render)
    argv_shown = sys.argv[1:] if argv is None else argv
    started = dt.datetime.now(dt.UTC)
    t_start = time.perf_counter()
    args.workdir.mkdir(parents=True, exist_ok=True)
    preflight(args.workdir)
    load_start = report.load_average()
    # The bundlefs under test: a snapshot of a commit, or the work tree (marked when it differs
    # from HEAD: the package may be mid-edit while the bench runs).
    bundlefs_source: Path | None = None
    if args.bundlefs_ref:
        bundlefs_source, git_head = bundlefs_snapshot(args.bundlefs_ref, args.workdir)
        log(f"bundlefs: commit {git_head}, snapshot in {bundlefs_source}")
    else:
        git_head = _cmd_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
        status = ["git", "-C", str(REPO), "status", "--porcelain", "bundlefs"]
        if _cmd_output(status) not in ("", "?"):
            git_head += " + uncommitted work-tree changes"

    samples = Samples()
    systems = setup_systems(args, samples, bundlefs_source)
    cache_bytes = parse_size(args.cache_size)
    bench = Bench(args.workdir, samples, log, cache_bytes, args.warm_seconds)
    ds_info: dict[str, Any] = {}

    for name in args.datasets:
        if name == "small":
            ds = datasets.small(args.workdir, args.scale, args.seed, log)
        elif name == "large":
            ds = datasets.large(args.workdir, args.scale, args.seed, log)
        else:
            ds = datasets.source(args.workdir, log)
        ds_info[name] = bench_dataset(bench, ds, systems, args)

    names = [s.name for s in systems]
    med = report.medians(samples.to_json())
    verdicts = evaluate(med)
    print(report.console_summary(med, verdicts, names, samples.notes_json()), flush=True)

    results: dict[str, Any] = {
        "meta": {
            "argv": argv_shown,
            "started": started.strftime("%Y-%m-%d %H:%M UTC"),
            "duration_s": time.perf_counter() - t_start,
            "machine": machine_info(),
            "load_start": load_start,
            "load_end": report.load_average(),
            "scale": args.scale,
            "rounds": args.rounds,
            "pack_rounds": args.pack_rounds,
            "seed": args.seed,
            "cache_size": args.cache_size,
            "git_head": git_head,
            "versions": {
                "mksquashfs": _cmd_output(["mksquashfs", "-version"]),
                "squashfuse_ll": _cmd_output(["squashfuse_ll", "--version"]),
            },
        },
        "datasets": ds_info,
        "samples": samples.to_json(),
        "medians": med,
        "notes": samples.notes_json(),
        "targets": [
            {
                "key": v.target.key,
                "issue": v.target.issue,
                "label": v.target.label,
                "value": v.value,
                "met": v.met,
                "required": v.target.describe(),
            }
            for v in verdicts
        ],
        "errors": samples.errors,
    }
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    json_path = report.write_json(results, REPO / "bench-results", stamp)
    log(f"raw results: {json_path}")

    if not args.no_docs:
        write_docs(results, names)
    if samples.errors:
        log(f"{len(samples.errors)} error(s): see the report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
