"""Daemon CPU per cold file, bundlefs variants against each other and squashfuse_ll, one run.

    python -m bench.coldcpu --variant before=/tmp/snap:/tmp/pyfuse3-old --variant after
        [--variant 'noprefetch:::--no-prefetch'] [--readers 1,2,4] [--rounds 4]
        [--files 20000] [--sample 4000] [--workers 2] [--no-peers]

For iterating on what each cold request costs (issue 21). A variant is
``NAME[=SOURCE][:PYFUSE3][:ARGS]``: SOURCE a directory holding a ``bundlefs`` package to run
instead of the installed one (``git archive COMMIT bundlefs | tar -x -C DIR``), PYFUSE3 a
directory holding a ``pyfuse3`` build (``pip install --target DIR``), ARGS more ``bundlefs
mount`` arguments (space-separated). Every round measures every variant in turn, each reader
count on a fresh mount after dropping the page cache: cold random whole-file reads (cat-style),
files/s, the daemon's CPU per file (every process of it, user + system) and its minor page
faults per file. Prints each measurement with the load average, then the medians; the JSON goes
to ``--workdir``/coldcpu.json. Run as root; on a shared machine compare within one run only.

May import: the standard library, ``bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import datasets
from bench.measure import drop_caches, run_readers
from bench.report import log, median
from bench.systems import Bundlefs, Squashfuse, System, daemon_cpu_seconds, mounted


@dataclass(frozen=True)
class Variant:
    name: str
    source: Path | None = None
    pyfuse3: Path | None = None
    args: tuple[str, ...] = ()

    @classmethod
    def parse(cls, spec: str) -> Variant:
        head, _, rest = spec.partition(":")
        name, _, source = head.partition("=")
        pyfuse3, _, args = rest.partition(":")
        return cls(
            name,
            Path(source) if source else None,
            Path(pyfuse3) if pyfuse3 else None,
            tuple(args.split()),
        )


class BundlefsVariant(Bundlefs):
    """``bundlefs mount --workers N`` from a source snapshot and a pyfuse3 build of its own."""

    def __init__(self, workdir: Path, variant: Variant, workers: int) -> None:
        super().__init__(workdir, cache_size="64MiB", source=variant.source)
        self.name = variant.name
        self.variant = variant
        self.workers = workers

    @property
    def cli(self) -> list[str]:
        return [sys.executable, "-m", "bundlefs"]

    def env(self) -> dict[str, str] | None:
        path = [str(p) for p in (self.variant.pyfuse3, self.variant.source) if p is not None]
        if not path:
            return None
        return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}  # before site-packages

    def daemon_cmd(self, archive: Path, mnt: Path) -> list[str]:
        cmd = super().daemon_cmd(archive, mnt)
        extra = ["--workers", str(self.workers), *self.variant.args]
        return [*cmd[:-2], *extra, *cmd[-2:]]


def minor_faults(pid: int) -> int:
    """Minor page faults of ``pid`` and its children (the daemon's workers)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += int(fields[7])  # field 10: minflt
    return total


def measure_once(
    system: System, archive: Path, sample: Path, expect: int, readers: int
) -> dict[str, float]:
    with mounted(system, archive, system.workdir / "mnt") as m:
        drop_caches()
        assert m.pid is not None
        cpu0, faults0 = daemon_cpu_seconds(m.pid), minor_faults(m.pid)
        r = run_readers(m.root, sample, readers)
        cpu1, faults1 = daemon_cpu_seconds(m.pid), minor_faults(m.pid)
    if r.first_pass_bytes != expect:
        raise RuntimeError(f"{system.name}: read {r.first_pass_bytes} bytes, want {expect}")
    if cpu0 is None or cpu1 is None:
        raise RuntimeError(f"{system.name}: the daemon went away")
    return {
        "files_per_s": r.files_per_s,
        "cpu_us": (cpu1 - cpu0) / r.files * 1e6,
        "minflt": (faults1 - faults0) / r.files,
        "load": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.coldcpu", description=__doc__)
    ap.add_argument("--variant", action="append", type=Variant.parse, required=True)
    ap.add_argument("--readers", default="1,4")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--sample", type=int, default=4_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-peers", action="store_true", help="no squashfuse_ll")
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/bundlefs-bench"))
    args = ap.parse_args(argv)
    work = args.workdir / "coldcpu"
    work.mkdir(parents=True, exist_ok=True)
    small = datasets.small(args.workdir, args.files / datasets.SMALL_FILES, 4, log)
    rels = small.sample(args.sample, 4)
    sample = work / "sample.txt"
    sample.write_text("".join(r + "\n" for r in rels))
    expect = sum(small.sizes[r] for r in rels)
    systems: list[System] = [BundlefsVariant(work / "bfs", v, args.workers) for v in args.variant]
    if not args.no_peers:
        systems.append(Squashfuse(work / "sq"))
    archives: dict[str, Path] = {}
    for system in systems:
        system.ensure(log)
        kind = "squashfs" if isinstance(system, Squashfuse) else "bundle"
        if kind not in archives:
            log(f"{system.name}: packing")
            archives[kind] = system.pack(small.root, system.workdir / "small").archive
    got: dict[str, dict[str, list[float]]] = {}
    for round_ in range(args.rounds):
        for system in systems:
            archive = archives["squashfs" if isinstance(system, Squashfuse) else "bundle"]
            for readers in (int(n) for n in args.readers.split(",")):
                m = measure_once(system, archive, sample, expect, readers)
                for key, value in m.items():
                    got.setdefault(system.name, {}).setdefault(f"{key}_{readers}", []).append(value)
                log(
                    f"round {round_} {system.name} {readers} readers: "
                    f"{m['files_per_s']:,.0f} files/s, {m['cpu_us']:.0f} µs CPU/file, "
                    f"{m['minflt']:.1f} minor faults/file, load {m['load']:.1f}"
                )
    medians = {n: {k: median(v) for k, v in d.items()} for n, d in got.items()}
    (work / "coldcpu.json").write_text(json.dumps({"runs": got, "medians": medians}, indent=1))
    for name, figures in medians.items():
        print(name, "  ".join(f"{k} {v:,.1f}" for k, v in sorted(figures.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
