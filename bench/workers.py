"""Issue 21's table: every path a user takes, bundlefs with 1..N worker processes beside
squashfuse_ll and the raw directory, measured in one run on this machine.

``python -m bench.workers [--files 20000] [--sample 5000] [--rounds 2] [--workers 1,2,4]
[--cold-only]``

- cold random whole-file reads (fresh mount, page cache dropped) with 1, 2, 4 and 8 reader
  processes, cat-style and with Python ``open()``, and the daemon CPU per cold file (every
  process of the daemon together, cat-style);
- warm random reads, the same two ways with the same reader counts (the cold pass's mount, at
  least a second each);
- ``find`` on a fresh mount and again; ``ls -lR`` fresh and warm on a real tree of ~49,000
  entries (this virtual environment's site-packages);
- a cold PyTorch DataLoader epoch over the sample through the mount (4 loader workers, the
  files' bytes as samples), where torch is installed;
- one large file read with ``cat``, cold and again (compressible and random);
- the random reads again with the package as a pip user installs it (``pip install
  'CHECKOUT[mount]'`` into a virtual environment of its own under ``--workdir``, rebuilt when
  the checkout's sources change; ``--no-pip`` leaves it out).

``--cold-only`` measures the first item alone (a quick iteration on what a cold request costs).
After the figures it prints issue 21's targets, each with what this run measured.

Each figure is the median of ``--rounds``, every system measured in turn within a round; ratios
are against squashfuse_ll (or raw) from the same run. Results go to ``--workdir``/workers.json
and are printed as Markdown (docs/performance.md keeps the table of the last full run).

May import: the standard library, ``bench``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from bench import datasets
from bench.measure import BENCH_ROOT, drop_caches, run_readers
from bench.report import log, median
from bench.systems import (
    Bundlefs,
    Log,
    Mounted,
    RawDir,
    Squashfuse,
    System,
    SystemUnavailable,
    daemon_cpu_seconds,
    mounted,
)

READERS = (1, 2, 4, 8)
LARGE = 512 * 1024 * 1024


class BundlefsWorkers(Bundlefs):
    """bundlefs mount --workers N (``spec`` "N", or "N:T" for ``--threads T`` too)."""

    def __init__(self, workdir: Path, spec: str) -> None:
        super().__init__(workdir, cache_size="64MiB")
        workers, _, threads = spec.partition(":")
        self.workers = int(workers)
        self.extra = ["--workers", workers] + (["--threads", threads] if threads else [])
        self.name = f"bundlefs-w{workers}" + (f"-t{threads}" if threads else "")

    def daemon_cmd(self, archive: Path, mnt: Path) -> list[str]:
        cmd = super().daemon_cmd(archive, mnt)
        return [*cmd[:-2], *self.extra, *cmd[-2:]]


# What a pip install of the checkout builds from: a change in any of these builds it again.
_PIP_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "bundlefs", "third_party/pyfuse3")


def _checkout_digest() -> str:
    h = hashlib.sha256()
    for name in _PIP_INPUTS:
        top = BENCH_ROOT / name
        files = [top] if top.is_file() else sorted(top.rglob("*"))
        for f in files:
            if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".so", ".c"):
                h.update(str(f.relative_to(BENCH_ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


class BundlefsPip(BundlefsWorkers):
    """The package as a pip user gets it: ``pip install 'CHECKOUT[mount]'`` into a virtual
    environment of its own (the patched binding compiled by bundlefs's own build, no
    ``make install``), the same mount arguments as ``bundlefs-wN``."""

    def __init__(self, workdir: Path, spec: str) -> None:
        super().__init__(workdir, spec)
        self.name = "bundlefs-pip-w" + spec.replace(":", "-t")
        self.venv = workdir / "venv"

    @property
    def cli(self) -> list[str]:
        return [str(self.venv / "bin" / "bundlefs")]

    def env(self) -> dict[str, str] | None:
        # Nothing of the developer's environment: the checkout's editable install is not on
        # this interpreter's path, and no PYTHONPATH may put it there.
        return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def ensure(self, log: Log) -> None:
        stamp = self.venv / ".checkout-digest"
        digest = _checkout_digest()
        if not (stamp.exists() and stamp.read_text() == digest):
            shutil.rmtree(self.venv, ignore_errors=True)
            log(f"{self.name}: pip install '{BENCH_ROOT}[mount]' into {self.venv}")
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", str(self.venv)], check=True)
            r = subprocess.run(
                [str(self.venv / "bin" / "pip"), "install", "-q", f"{BENCH_ROOT}[mount]"],
                capture_output=True,
                text=True,
                cwd="/",
                env=self.env(),
            )
            if r.returncode != 0:
                raise SystemUnavailable(f"pip install failed: {r.stderr.strip()[-1500:]}")
            stamp.write_text(digest)
        super().ensure(log)
        r = subprocess.run(
            [str(self.venv / "bin" / "python"), "-c",
             "import bundlefs.mount.bindings as b; print(b.binding(), b.load().__name__)"],
            capture_output=True, text=True, cwd="/", env=self.env(),
        )  # fmt: skip
        self.binding = r.stdout.strip() or r.stderr.strip()[-300:]
        log(f"{self.name}: binding {self.binding}")

    def _compile(self, log: Log) -> None:
        return None  # pip byte-compiled the installed package


def _default_workers() -> int:
    """``bundlefs mount``'s default ``--workers`` on this machine (bundlefs.mount.options)."""
    return max(2, min(len(os.sched_getaffinity(0)), 8))


def _timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _large_files(workdir: Path) -> Path:
    root = workdir / "data" / "large-pair"
    stamp = root / ".done"
    if not stamp.exists():
        root.mkdir(parents=True, exist_ok=True)
        rng = random.Random(21)
        words = [
            bytes(rng.choice(b"abcdefghij ") for _ in range(rng.randrange(2, 9)))
            for _ in range(4096)
        ]
        with open(root / "text.log", "wb") as f:
            written = 0
            while written < LARGE:
                line = b" ".join(rng.choice(words) for _ in range(12)) + b"\n"
                chunk = line * 512
                f.write(chunk)
                written += len(chunk)
        with open(root / "random.bin", "wb") as f:
            for _ in range(LARGE // (1 << 20)):
                f.write(rng.randbytes(1 << 20))
        stamp.touch()
    return root


_EPOCH = r"""
import sys, time
from torch.utils.data import DataLoader, Dataset

class Files(Dataset):
    def __init__(self, root, rels):
        self.paths = [f"{root}/{r}" for r in rels]
    def __len__(self):
        return len(self.paths)
    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return len(f.read())

root, listing = sys.argv[1], sys.argv[2]
rels = open(listing).read().split()
loader = DataLoader(Files(root, rels), batch_size=64, shuffle=True, num_workers=4,
                    collate_fn=sum)
t0 = time.perf_counter()
n = sum(1 for _ in loader)
print(len(rels) / (time.perf_counter() - t0))
"""


def _dataloader_epoch(root: Path, sample_list: Path) -> float | None:
    """Files per second of one cold DataLoader epoch over the sample, or None without torch."""
    r = subprocess.run(
        [sys.executable, "-c", _EPOCH, str(root), str(sample_list)],
        capture_output=True, text=True, cwd="/",
    )  # fmt: skip
    if r.returncode != 0:
        if "No module named 'torch'" in r.stderr:
            return None
        raise RuntimeError(f"DataLoader epoch failed: {r.stderr[-1000:]}")
    return float(r.stdout.split()[-1])


def measure(
    system: System,
    archives: dict[str, Path],
    sample_list: Path,
    expect: int,
    got: dict[str, list[float]],
    cold_only: bool = False,
    reads_only: bool = False,
) -> None:
    """One round of every figure of ``system``, each appended to its list in ``got``."""

    def add(key: str, value: float) -> None:
        got.setdefault(key, []).append(value)

    def timed5(cmd: list[str]) -> float:
        """The median of five runs of ``cmd`` (a warm figure: one ~0.1 s run is noisy)."""
        return median([_timed(cmd) for _ in range(5)])

    def cold(stack: contextlib.ExitStack, readers: int, mode: str) -> Mounted:
        """A fresh mount read cold by ``readers`` processes in ``mode``, up until ``stack``
        closes."""
        m = stack.enter_context(mounted(system, archives["small"], system.workdir / "mnt"))
        drop_caches()
        cpu0 = daemon_cpu_seconds(m.pid) if m.pid else None
        r = run_readers(m.root, sample_list, readers, mode=mode)
        cpu1 = daemon_cpu_seconds(m.pid) if m.pid else None
        if r.first_pass_bytes != expect:
            raise RuntimeError(f"{system.name}: read {r.first_pass_bytes}, want {expect}")
        suffix = "" if mode == "fs" else f"_{mode}"
        add(f"cold{suffix}_{readers}", r.files_per_s)
        if cpu0 is not None and cpu1 is not None:
            add(f"cpu_us{suffix}_{readers}", (cpu1 - cpu0) / r.files * 1e6)
        return m

    for readers in READERS:
        for mode in ("fs",) if cold_only else ("fs", "pyopen"):
            with contextlib.ExitStack() as stack:
                m = cold(stack, readers, mode)
                if not cold_only:  # the sample is in the page cache now: warm reads
                    w = run_readers(m.root, sample_list, readers, mode=mode, min_seconds=1.0)
                    add(f"warm_{mode}_{readers}", w.files_per_s)
    if cold_only or reads_only:
        return
    with mounted(system, archives["small"], system.workdir / "mnt") as m:
        drop_caches()
        add("find_fresh_s", _timed(["find", str(m.root)]))
        add("find_warm_s", timed5(["find", str(m.root)]))
        drop_caches()
        fps = _dataloader_epoch(m.root, sample_list)
        if fps is not None:
            add("dataloader_cold_fps", fps)
    with mounted(system, archives["site"], system.workdir / "mnt") as m:
        drop_caches()
        add("lslR_fresh_s", _timed(["ls", "-lR", str(m.root)]))
        add("lslR_warm_s", _timed(["ls", "-lR", str(m.root)]))
    with mounted(system, archives["large"], system.workdir / "mnt") as m:
        for name in ("text.log", "random.bin"):
            drop_caches()
            seconds = _timed(["cat", str(m.root / name)])
            add(f"seq_{name.split('.')[0]}_mbps", LARGE / 1e6 / seconds)
            seconds = timed5(["cat", str(m.root / name)])  # from the page cache now
            add(f"seq_{name.split('.')[0]}_warm_mbps", LARGE / 1e6 / seconds)


def _readers(r: int) -> str:
    return f"{r} reader{'s' * (r > 1)}"


ROWS = [
    *((f"cold_{r}", f"cold random reads, cat-style, {_readers(r)} (files/s)") for r in READERS),
    *(
        (f"cold_pyopen_{r}", f"cold random reads, Python open(), {_readers(r)} (files/s)")
        for r in READERS
    ),  # fmt: skip
    *((f"cpu_us_{r}", f"daemon CPU per cold file, cat-style, {_readers(r)} (µs)") for r in READERS),
    *(
        (f"cpu_us_pyopen_{r}", f"daemon CPU per cold file, Python open(), {_readers(r)} (µs)")
        for r in READERS
    ),  # fmt: skip
    *((f"warm_fs_{r}", f"warm random reads, cat-style, {_readers(r)} (files/s)") for r in READERS),
    *(
        (f"warm_pyopen_{r}", f"warm random reads, Python open(), {_readers(r)} (files/s)")
        for r in READERS
    ),  # fmt: skip
    ("dataloader_cold_fps", "DataLoader epoch, 4 workers, cold (files/s)"),
    ("find_fresh_s", "find, fresh mount (s)"),
    ("find_warm_s", "find, second run (s)"),
    ("lslR_fresh_s", "ls -lR site-packages, fresh mount (s)"),
    ("lslR_warm_s", "ls -lR site-packages, second run (s)"),
    ("seq_text_mbps", "cat 512 MiB compressible, cold (MB/s)"),
    ("seq_random_mbps", "cat 512 MiB random, cold (MB/s)"),
    ("seq_text_warm_mbps", "cat 512 MiB compressible, second run (MB/s)"),
    ("seq_random_warm_mbps", "cat 512 MiB random, second run (MB/s)"),
]


def render(results: dict[str, dict[str, float]]) -> str:
    names = list(results)
    base = "squashfuse_ll" if "squashfuse_ll" in results else names[0]
    lines = ["| metric | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key, label in ROWS:
        cells = []
        for n in names:
            v = results[n].get(key)
            if v is None:
                cells.append("—")
                continue
            ref = results[base].get(key)
            ratio = f" ({v / ref:.2f}×)" if ref and n != base else ""
            cells.append(f"{v:,.0f}{ratio}" if v >= 100 else f"{v:.3g}{ratio}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratio(results: dict[str, dict[str, float]], a: str, b: str, key: str) -> float | None:
    x, y = results.get(a, {}).get(key), results.get(b, {}).get(key)
    return x / y if x and y else None


_CPU = [f"cpu_us_{r}" for r in READERS]
_WARM = [f"warm_{m}_{r}" for m in ("fs", "pyopen") for r in READERS]

# Issue 21's targets: (label, measured, against, figures, at least?, bound). "measured" is
# "judged" (the --workers variant judged) or "pip"; "against" a system, or None for the figure
# itself (µs). Each figure of a row must meet the bound.
_TARGETS: list[tuple[str, str, str | None, list[str], bool, float]] = [
    ("cold random reads, 2 readers ≥ 1.3× squashfuse_ll", "judged", "squashfuse_ll",
     ["cold_2"], True, 1.3),
    ("cold random reads, 4 and 8 readers ≥ 1.3× squashfuse_ll", "judged", "squashfuse_ll",
     ["cold_4", "cold_8"], True, 1.3),
    ("… and ≥ 1.5× bundlefs with one worker", "judged", "bundlefs-w1",
     ["cold_4", "cold_8"], True, 1.5),
    ("cold random reads, 1 reader ≥ 1.0× squashfuse_ll", "judged", "squashfuse_ll",
     ["cold_1"], True, 1.0),
    ("daemon CPU per cold file, all processes, 1/2/4/8 readers ≤ 150 µs", "judged", None,
     _CPU, False, 150.0),
    ("… the same beside squashfuse_ll's (×)", "judged", "squashfuse_ll", _CPU, False, 1.0),
    ("warm Python open(), 2 readers ≥ 1.0× squashfuse_ll", "judged", "squashfuse_ll",
     ["warm_pyopen_2"], True, 1.0),
    ("DataLoader epoch through the mount, cold ≥ 1.0× squashfuse_ll", "judged",
     "squashfuse_ll", ["dataloader_cold_fps"], True, 1.0),
    ("sequential cold read of one large file, compressible / random ≥ 1.0× squashfuse_ll",
     "judged", "squashfuse_ll", ["seq_text_mbps", "seq_random_mbps"], True, 1.0),
    ("find, fresh mount ≤ 2× raw (time)", "judged", "raw", ["find_fresh_s"], False, 2.0),
    ("ls -lR warm (second run) ≤ 3× raw (time)", "judged", "raw", ["lslR_warm_s"], False, 3.0),
    ("ls -lR fresh mount ≤ 0.5× squashfuse_ll (time)", "judged", "squashfuse_ll",
     ["lslR_fresh_s"], False, 0.5),
    # "The same within noise": rounds of one variant here spread ±15 % (docs/performance.md).
    ("pip-installed mount ({pip}), warm random reads, cat-style and open(), 1/2/4/8 readers, "
     "× {judged} ≥ 0.85", "pip", "judged", _WARM, True, 0.85),
    # Issue 21: "everything issue 9 met (warm reads, warm find, sequential warm) still met".
    ("issue 9, still: warm random reads, cat-style, 1 reader ≥ 3× squashfuse_ll", "judged",
     "squashfuse_ll", ["warm_fs_1"], True, 3.0),
    ("issue 9, still: … and ≥ 0.7× raw", "judged", "raw", ["warm_fs_1"], True, 0.7),
    ("issue 9, still: warm random reads, Python open(), 1 reader ≥ 1× squashfuse_ll",
     "judged", "squashfuse_ll", ["warm_pyopen_1"], True, 1.0),
    ("issue 9, still: find, warm ≤ 1.5× raw (time)", "judged", "raw", ["find_warm_s"],
     False, 1.5),
    ("issue 9, still: sequential warm read, compressible / random ≥ 1× squashfuse_ll",
     "judged", "squashfuse_ll", ["seq_text_warm_mbps", "seq_random_warm_mbps"], True, 1.0),
]  # fmt: skip


def targets(results: dict[str, dict[str, float]], workers: str) -> str:
    """Issue 21's targets, each with what this run measured (``workers``: the variant judged,
    the default ``--workers`` here); the pip-installed row only where one was measured."""
    names = {"judged": workers}
    pip = next((n for n in results if n.startswith("bundlefs-pip-")), None)
    if pip is not None:
        names["pip"] = pip
    lines = [f"Issue 21's targets ({workers} judged):", "", "| target | measured | |"]
    lines.append("|---|---|---|")
    for label, measured, against, keys, at_least, bound in _TARGETS:
        if measured not in names:
            continue
        a = names[measured]
        if against is None:
            values = [results.get(a, {}).get(k) for k in keys]
            shown = [f"{v:.0f} µs" if v is not None else "—" for v in values]
        else:
            values = [_ratio(results, a, names.get(against, against), k) for k in keys]
            shown = [f"{v:.2f}×" if v is not None else "—" for v in values]
        got = [v for v in values if v is not None]
        met = all(v >= bound if at_least else v <= bound for v in got)
        verdict = "—" if not got else ("met" if met else "missed")
        lines.append(f"| {label.format(**names)} | {' / '.join(shown)} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/bundlefs-bench"))
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--sample", type=int, default=5_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", default="1,2,4", help="bundlefs variants: N or N:THREADS each")
    ap.add_argument("--no-peers", action="store_true", help="measure bundlefs only")
    ap.add_argument("--no-pip", action="store_true", help="no pip-installed bundlefs")
    ap.add_argument("--render", type=Path, help="only print the table of a saved JSON")
    ap.add_argument(
        "--cold-only", action="store_true", help="only the cold random reads and daemon CPU"
    )
    args = ap.parse_args(argv)
    default = f"bundlefs-w{_default_workers()}"
    if args.render:
        saved = json.loads(args.render.read_text())["results"]
        print(render(saved) + "\n\n" + targets(saved, default))
        return 0
    work = args.workdir / "workers"
    work.mkdir(parents=True, exist_ok=True)
    small = datasets.small(args.workdir, args.files / datasets.SMALL_FILES, 4, log)
    rels = small.sample(args.sample, 4)
    sample_list = work / "sample.txt"
    sample_list.write_text("".join(r + "\n" for r in rels))
    expect = sum(small.sizes[r] for r in rels)
    sources = {"small": small.root}
    if not args.cold_only:
        sources["site"] = Path(sysconfig.get_paths()["purelib"])
        sources["large"] = _large_files(args.workdir)
    systems: list[System] = [] if args.no_peers else [RawDir(work / "raw"), Squashfuse(work / "sq")]
    systems += [BundlefsWorkers(work / f"w{n}", n) for n in args.workers.split(",")]
    if not args.no_pip and not args.cold_only:
        systems.append(BundlefsPip(work / "pip", str(_default_workers())))
    archives: dict[str, dict[str, Path]] = {}
    for system in systems:
        system.ensure(log)
        archives[system.name] = {}
        for key, src in sources.items():
            first = next(s for s in systems if isinstance(s, BundlefsWorkers))
            if isinstance(system, BundlefsWorkers) and system is not first:
                archives[system.name][key] = first.archive_path(first.workdir / key)  # once
                continue
            log(f"{system.name}: packing {key}")
            archives[system.name][key] = system.pack(src, system.workdir / key).archive
    # Round by round, every system in turn: the machine drifts over a run (other sessions, the
    # page cache, the disk), and measuring each system's rounds back to back would charge the
    # drift to whichever came last.
    got: dict[str, dict[str, list[float]]] = {system.name: {} for system in systems}
    for round_ in range(args.rounds):
        for system in systems:
            log(f"round {round_ + 1}/{args.rounds}: {system.name}")
            measure(
                system, archives[system.name], sample_list, expect, got[system.name],
                args.cold_only, reads_only=isinstance(system, BundlefsPip),
            )  # fmt: skip
    results = {name: {k: median(v) for k, v in figures.items()} for name, figures in got.items()}
    log(json.dumps(results))
    out = args.workdir / "workers.json"
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    saved = {"date": date, "files": args.files, "results": results, "rounds": got}
    out.write_text(json.dumps(saved, indent=1))
    print(render(results) + "\n\n" + targets(results, default))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
