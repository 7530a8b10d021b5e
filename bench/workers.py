"""Issue 21's table: every path a user takes, bundlefs with 1..N worker processes beside
squashfuse_ll and the raw directory, measured in one run on this machine.

``python -m bench.workers [--files 20000] [--sample 5000] [--rounds 2] [--workers 1,2,4]
[--cold-only]``

- cold random whole-file reads (fresh mount, page cache dropped) with 1, 2, 4 and 8 reader
  processes, cat-style, and the daemon CPU per cold file (every process of the daemon together);
- warm random reads with Python ``open()``, 2 readers;
- ``find`` on a fresh mount; ``ls -lR`` fresh and warm on a real tree of ~49,000 entries (this
  virtual environment's site-packages);
- a cold PyTorch DataLoader epoch over the sample through the mount (4 loader workers, the
  files' bytes as samples), where torch is installed;
- one large file read cold with ``cat`` (compressible and random).

``--cold-only`` measures the first item alone (a quick iteration on what a cold request costs).

Each figure is the median of ``--rounds``; ratios are against squashfuse_ll (or raw) from the
same run. Results go to ``--workdir``/workers.json and are printed as Markdown
(docs/performance.md keeps the table of the last full run).

May import: the standard library, ``bench``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from bench import datasets
from bench.measure import drop_caches, run_readers
from bench.report import log, median
from bench.systems import Bundlefs, RawDir, Squashfuse, System, daemon_cpu_seconds, mounted

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


def measure(system: System, archives: dict[str, Path], sample_list: Path, expect: int,
            rounds: int, cold_only: bool = False) -> dict[str, float]:  # fmt: skip
    got: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        got.setdefault(key, []).append(value)

    for _ in range(rounds):
        for readers in READERS:
            with mounted(system, archives["small"], system.workdir / "mnt") as m:
                drop_caches()
                cpu0 = daemon_cpu_seconds(m.pid) if m.pid else None
                r = run_readers(m.root, sample_list, readers)
                cpu1 = daemon_cpu_seconds(m.pid) if m.pid else None
                if r.first_pass_bytes != expect:
                    raise RuntimeError(f"{system.name}: read {r.first_pass_bytes}, want {expect}")
                add(f"cold_{readers}", r.files_per_s)
                if cpu0 is not None and cpu1 is not None:
                    add(f"cpu_us_{readers}", (cpu1 - cpu0) / r.files * 1e6)
                if readers == 2 and not cold_only:
                    w = run_readers(m.root, sample_list, 2, mode="pyopen", min_seconds=1.0)
                    add("warm_pyopen_2", w.files_per_s)
        if cold_only:
            continue
        with mounted(system, archives["small"], system.workdir / "mnt") as m:
            drop_caches()
            add("find_fresh_s", _timed(["find", str(m.root)]))
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
    return {k: median(v) for k, v in got.items()}


ROWS = [
    *((f"cold_{r}", f"cold random reads, {r} reader{'s' * (r > 1)} (files/s)") for r in READERS),
    ("cpu_us_1", "daemon CPU per cold file, 1 reader (µs)"),
    ("cpu_us_4", "daemon CPU per cold file, 4 readers (µs)"),
    ("warm_pyopen_2", "warm Python open(), 2 readers (files/s)"),
    ("dataloader_cold_fps", "DataLoader epoch, 4 workers, cold (files/s)"),
    ("find_fresh_s", "find, fresh mount (s)"),
    ("lslR_fresh_s", "ls -lR site-packages, fresh mount (s)"),
    ("lslR_warm_s", "ls -lR site-packages, second run (s)"),
    ("seq_text_mbps", "cat 512 MiB compressible, cold (MB/s)"),
    ("seq_random_mbps", "cat 512 MiB random, cold (MB/s)"),
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/bundlefs-bench"))
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--sample", type=int, default=5_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", default="1,2,4", help="bundlefs variants: N or N:THREADS each")
    ap.add_argument("--no-peers", action="store_true", help="measure bundlefs only")
    ap.add_argument("--render", type=Path, help="only print the table of a saved JSON")
    ap.add_argument(
        "--cold-only", action="store_true", help="only the cold random reads and daemon CPU"
    )
    args = ap.parse_args(argv)
    if args.render:
        print(render(json.loads(args.render.read_text())["results"]))
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
    results: dict[str, dict[str, float]] = {}
    for system in systems:
        system.ensure(log)
        archives = {}
        for key, src in sources.items():
            first = next(s for s in systems if isinstance(s, BundlefsWorkers))
            if isinstance(system, BundlefsWorkers) and system is not first:
                archives[key] = first.archive_path(first.workdir / key)  # packed once
                continue
            log(f"{system.name}: packing {key}")
            archives[key] = system.pack(src, system.workdir / key).archive
        log(f"{system.name}: measuring")
        results[system.name] = measure(
            system, archives, sample_list, expect, args.rounds, args.cold_only
        )
        log(json.dumps(results[system.name]))
    out = args.workdir / "workers.json"
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "files": args.files, "results": results}, indent=1))  # fmt: skip
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
