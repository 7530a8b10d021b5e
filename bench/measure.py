"""The timed experiments.

Every experiment appends raw samples to a ``Samples`` store keyed by dataset, system and metric;
medians and ratios are computed later by ``bench.report``. Systems are interleaved inside each
round (and their order rotated between rounds) so that a noisy neighbour on this shared machine
slows every system alike instead of one system's whole series.

"Cold" means a fresh mount (a new daemon with empty caches) after ``echo 3 >
/proc/sys/vm/drop_caches``; "warm" means the same files read again on the same mount.

Besides wall times, a few passes also record what they cost the daemon: its CPU time per file
(``/proc/PID/stat``) and, for bundlefs, the FUSE requests per file from the counters the daemon
publishes in its stats xattr, together with the open mode it served (kept as notes: strings).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.datasets import Dataset
from bench.systems import Mounted, PackInfo, System, daemon_cpu_seconds, mounted, vm_hwm_bytes

MB = 1_000_000
Log = Callable[[str], None]

# A reader that takes longer than this has hung (e.g. a wedged FUSE daemon); give up on it.
READER_TIMEOUT_S = 900.0
BENCH_ROOT = Path(__file__).resolve().parent.parent
STATS_XATTR = "user.bundlefs.stats"  # JSON counters on a bundlefs mount root


def _nested() -> Any:  # dict[str, dict[str, dict[str, list]]], every level made on first use
    return defaultdict(lambda: defaultdict(lambda: defaultdict(list)))


@dataclass
class Samples:
    """samples[dataset][system][metric] -> list of values, plus notes and errors.

    Notes are facts that are strings, not figures (e.g. which open mode bundlefs served):
    notes[dataset][system][key] -> the distinct values seen, in order.
    """

    data: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=_nested)
    notes: dict[str, dict[str, dict[str, list[str]]]] = field(default_factory=_nested)
    errors: list[str] = field(default_factory=list)

    def add(self, dataset: str, system: str, metric: str, value: float) -> None:
        self.data[dataset][system][metric].append(value)

    def note(self, dataset: str, system: str, key: str, value: str) -> None:
        values = self.notes[dataset][system][key]
        if value not in values:
            values.append(value)

    def to_json(self) -> dict[str, dict[str, dict[str, list[float]]]]:
        return json.loads(json.dumps(self.data))

    def notes_json(self) -> dict[str, dict[str, dict[str, list[str]]]]:
        return json.loads(json.dumps(self.notes))


def drop_caches() -> None:
    """Write back dirty pages, then drop page cache, dentries and inodes (needs root)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


@dataclass
class ReadResult:
    seconds: float
    files: int
    bytes: int
    first_pass_bytes: int  # bytes of each reader's first pass over its share, summed
    cpu_seconds: float = 0.0  # the readers' own CPU time while reading, summed (bench.reader)

    @property
    def files_per_s(self) -> float:
        return self.files / self.seconds if self.seconds > 0 else float("inf")

    @property
    def files_per_cpu_s(self) -> float:
        """Files per second of the readers' own CPU time: what a loaded machine's other work
        moves least (a reader preempted waits in wall time, not in CPU time)."""
        return self.files / self.cpu_seconds if self.cpu_seconds > 0 else float("inf")

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds > 0 else float("inf")


def run_readers(
    root: Path,
    list_path: Path,
    readers: int,
    mode: str = "fs",
    min_seconds: float = 0.0,
    bundlefs_source: Path | None = None,
) -> ReadResult:
    """Run ``readers`` worker processes over the list (interleaved shares), all started together.

    ``min_seconds`` > 0 makes each reader repeat its share until that long has passed; only
    meaningful for warm runs (a second pass of a cold run would be warm).
    """
    procs: list[subprocess.Popen[str]] = []
    # cwd is not the repository: `-m` puts cwd first on sys.path, and the reader must import
    # bundlefs from the snapshot when one is given. PYTHONPATH supplies bench (and bundlefs).
    path = [str(bundlefs_source)] if bundlefs_source else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(BENCH_ROOT)])}
    try:
        for i in range(readers):
            cmd = [sys.executable, "-m", "bench.reader", "--mode", mode, "--root", str(root)]
            cmd += ["--list", str(list_path), "--start", str(i), "--step", str(readers)]
            cmd += ["--min-seconds", str(min_seconds)]
            procs.append(
                subprocess.Popen(
                    cmd,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    cwd="/",
                    env=env,
                )
            )
        # Wait until every worker has started up (imports, opening the bundle) before any of
        # them begins: start-up is not what we measure.
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "ready":
                p.wait(timeout=30)
                raise RuntimeError(f"reader failed to start: {p.stderr.read() if p.stderr else ''}")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=READER_TIMEOUT_S)
            if p.returncode != 0:
                raise RuntimeError(f"reader failed ({p.returncode}): {err[-2000:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    t0 = min(o["t0"] for o in outs)
    t1 = max(o["t1"] for o in outs)
    return ReadResult(
        t1 - t0,
        sum(o["files"] for o in outs),
        sum(o["bytes"] for o in outs),
        sum(o["first_pass_bytes"] for o in outs),
        sum(o.get("cpu", 0.0) for o in outs),
    )


def daemon_stats(root: Path) -> dict[str, Any] | None:
    """The bundlefs daemon's stats xattr, or None when it cannot be read."""
    try:
        stats = json.loads(os.getxattr(root, STATS_XATTR))
    except (OSError, ValueError):
        return None
    return stats if isinstance(stats, dict) else None


def _request_counts(stats: dict[str, Any] | None) -> dict[str, int] | None:
    """The per-operation request counters of a stats dict (None: a daemon without them)."""
    req = stats.get("requests") if stats else None
    if not isinstance(req, dict):
        return None
    return {str(op): int(n) for op, n in req.items() if isinstance(n, int | float)}


class RequestProbe:
    """The FUSE requests a bundlefs daemon served during one timed pass, per operation.

    Reading the counters is itself a request or more (``os.getxattr`` retries with a bigger
    buffer after ERANGE), counted before or after the reply depending on the daemon. So the probe
    reads them twice back to back before the pass: that difference is what one reading costs, and
    it is subtracted from the pass's difference, whichever way the daemon counts.
    """

    def __init__(self, root: Path, first: dict[str, int], second: dict[str, int]) -> None:
        self.root = root
        self.first = first
        self.second = second

    @classmethod
    def start(cls, root: Path) -> RequestProbe | None:
        first = _request_counts(daemon_stats(root))
        second = _request_counts(daemon_stats(root)) if first is not None else None
        return None if first is None or second is None else cls(root, first, second)

    def finish(self) -> dict[str, int] | None:
        """Requests per operation since ``start``, net of our own counter readings."""
        third = _request_counts(daemon_stats(self.root))
        if third is None:
            return None
        a, b = self.first, self.second
        ops = sorted(set(a) | set(b) | set(third))
        return {
            op: max(0, third.get(op, 0) - b.get(op, 0) - (b.get(op, 0) - a.get(op, 0)))
            for op in ops
        }


def timed_cmd(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=READER_TIMEOUT_S)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({r.returncode}): {r.stderr[-1000:]}")
    return seconds, r.stdout


class Bench:
    """Shared state of one run: where things go, the samples, and the logger."""

    def __init__(
        self, workdir: Path, samples: Samples, log: Log, cache_bytes: int, warm_seconds: float
    ) -> None:
        self.workdir = workdir
        self.warm_seconds = warm_seconds
        self.samples = samples
        self.log = log
        self.cache_bytes = cache_bytes
        self.packs: dict[str, dict[str, PackInfo]] = defaultdict(dict)

    def mnt(self, system: System, dataset: Dataset) -> Path:
        return self.workdir / "mnt" / f"{dataset.name}-{system.name}"

    def dest(self, system: System, dataset: Dataset) -> Path:
        return self.workdir / "archives" / dataset.name / system.name

    def list_file(self, dataset: Dataset, name: str, rels: list[str]) -> Path:
        p = self.workdir / "lists" / f"{dataset.name}-{name}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(r + "\n" for r in rels))
        return p

    def fail(self, what: str, system: System, dataset: Dataset, e: BaseException) -> None:
        msg = f"{dataset.name}/{system.name}: {what} failed: {e}"
        self.samples.errors.append(msg)
        self.log("ERROR " + msg)

    # ---------------------------------------------------------------- pack

    def pack(self, systems: list[System], dataset: Dataset, rounds: int) -> list[System]:
        """Pack ``rounds`` times per system (interleaved); returns the systems that packed."""
        ok = list(systems)
        for r in range(rounds):
            for system in rotate(ok, r):
                if system not in ok:
                    continue
                drop_caches()  # every packer starts from a cold source tree
                try:
                    info = system.pack(dataset.root, self.dest(system, dataset))
                except Exception as e:  # noqa: BLE001 - one broken system must not stop the run
                    self.fail("pack", system, dataset, e)
                    ok.remove(system)
                    continue
                self.packs[dataset.name][system.name] = info
                s, d, n = self.samples, dataset.name, system.name
                if system.is_fuse:
                    s.add(d, n, "pack_s", info.seconds)
                    s.add(d, n, "pack_mbps", dataset.total_bytes / MB / info.seconds)
                s.add(d, n, "archive_mb", info.archive_bytes / MB)
                s.add(d, n, "archive_ratio", info.archive_bytes / dataset.total_bytes)
                if info.index_bytes is not None:
                    s.add(d, n, "index_bytes_per_file", info.index_bytes / len(dataset.files))
                for k, v in info.detail.items():
                    s.add(d, n, f"pack_{k}", v)
                if system.is_fuse:
                    self.log(
                        f"  pack {d:6} {n:14} {info.seconds:7.2f} s "
                        f"{dataset.total_bytes / MB / max(info.seconds, 1e-9):8.1f} MB/s "
                        f"archive {info.archive_bytes / MB:8.1f} MB"
                    )
        return ok

    # ---------------------------------------------------------------- tree datasets

    def _mount(self, system: System, dataset: Dataset) -> AbstractContextManager[Mounted]:
        info = self.packs[dataset.name][system.name]
        return mounted(system, info.archive, self.mnt(system, dataset))

    def _record_mount(self, system: System, dataset: Dataset, m: Mounted) -> None:
        if system.is_fuse:
            self.samples.add(dataset.name, system.name, "mount_ready_ms", m.ready_seconds * 1000)

    def _add_rss(self, system: System, dataset: Dataset, peak: list[int]) -> None:
        if not peak:
            return
        self.samples.add(dataset.name, system.name, "rss_peak_mb", max(peak) / MB)
        if system.name == "bundlefs":  # only bundlefs has a configured cache to subtract
            beyond = (max(peak) - self.cache_bytes) / MB
            self.samples.add(dataset.name, system.name, "rss_beyond_cache_mb", beyond)

    def _record_rss(self, system: System, dataset: Dataset, m: Mounted, peak: list[int]) -> None:
        if m.pid is not None:
            hwm = vm_hwm_bytes(m.pid)
            if hwm is not None:
                peak.append(hwm)

    def _probe(self, system: System, dataset: Dataset, m: Mounted) -> RequestProbe | None:
        """Start counting bundlefs's requests (None for other systems and older daemons)."""
        if system.name != "bundlefs":
            return None
        stats = daemon_stats(m.root)
        if stats is None:
            return None
        for key in ("open_mode", "open_mode_reason"):
            if isinstance(stats.get(key), str):
                self.samples.note(dataset.name, system.name, key, stats[key])
        return RequestProbe.start(m.root)

    def _record_requests(
        self, system: System, dataset: Dataset, prefix: str, probe: RequestProbe | None, files: int
    ) -> None:
        """``{prefix}_req_per_file`` and ``{prefix}_req_{op}_per_file`` for every operation."""
        per_op = probe.finish() if probe is not None else None
        if per_op is None or files <= 0:
            return
        d, n, s = dataset.name, system.name, self.samples
        s.add(d, n, f"{prefix}_req_per_file", sum(per_op.values()) / files)
        for op, count in per_op.items():
            s.add(d, n, f"{prefix}_req_{op}_per_file", count / files)

    def verify(self, system: System, dataset: Dataset, sample: list[str]) -> None:
        """Untimed correctness check: entry count and content of a few files match the source."""
        with self._mount(system, dataset) as m:
            _s, out = timed_cmd(["find", str(m.root), "-type", "f"])
            served = len(out.splitlines())
            if served != len(dataset.files):
                raise RuntimeError(
                    f"serves {served} regular files, source has {len(dataset.files)}"
                )
            for rel in sample[:25]:
                a = hashlib.sha256((dataset.root / rel).read_bytes()).hexdigest()
                b = hashlib.sha256((m.root / rel).read_bytes()).hexdigest()
                if a != b:
                    raise RuntimeError(f"content of {rel} differs from the source")

    def tree_round(self, system: System, dataset: Dataset, sample_list: Path, expect: int) -> None:
        """One round of metadata + random-read measurements for one system on one dataset."""
        d, n, s = dataset.name, system.name, self.samples
        peak: list[int] = []

        with self._mount(system, dataset) as m:
            self._record_mount(system, dataset, m)
            drop_caches()
            t, out = timed_cmd(["find", str(m.root)])
            s.add(d, n, "find_cold_s", t)
            t, _ = timed_cmd(["find", str(m.root)])
            s.add(d, n, "find_warm_s", t)
            self._record_rss(system, dataset, m, peak)

        with self._mount(system, dataset) as m:
            self._record_mount(system, dataset, m)
            drop_caches()
            t, _ = timed_cmd(["du", "-s", str(m.root)])
            s.add(d, n, "du_cold_s", t)
            self._record_rss(system, dataset, m, peak)

        with self._mount(system, dataset) as m:
            self._record_mount(system, dataset, m)
            drop_caches()
            probe = self._probe(system, dataset, m)
            # The daemon's own CPU, read as close around the pass as possible.
            cpu0 = daemon_cpu_seconds(m.pid) if m.pid is not None else None
            r = run_readers(m.root, sample_list, 1)
            cpu1 = daemon_cpu_seconds(m.pid) if m.pid is not None else None
            self._record_requests(system, dataset, "rand_cold_1", probe, r.files)
            self._check_bytes(r, expect, system, dataset)
            s.add(d, n, "rand_cold_1_fps", r.files_per_s)
            s.add(d, n, "rand_cold_1_mbps", r.mb_per_s)
            if cpu0 is not None and cpu1 is not None and r.files:
                s.add(d, n, "cold_cpu_us_per_file", (cpu1 - cpu0) / r.files * 1e6)
            self._record_rss(system, dataset, m, peak)

        with self._mount(system, dataset) as m:
            self._record_mount(system, dataset, m)
            drop_caches()
            r = run_readers(m.root, sample_list, 2)
            self._check_bytes(r, expect, system, dataset)
            s.add(d, n, "rand_cold_2_fps", r.files_per_s)
            s.add(d, n, "rand_cold_2_mbps", r.mb_per_s)
            # The sample has just been read once on this mount: now it is warm. Cat-style
            # readers keep the metric names of earlier runs; Python open() ones are "_pyopen".
            for mode, tag in (("fs", ""), ("pyopen", "_pyopen")):
                for readers in (1, 2):
                    probe = self._probe(system, dataset, m) if readers == 1 else None
                    r = run_readers(
                        m.root, sample_list, readers, mode=mode, min_seconds=self.warm_seconds
                    )
                    self._record_requests(
                        system, dataset, f"rand_warm_{readers}{tag}", probe, r.files
                    )
                    self._check_bytes(r, expect, system, dataset)
                    s.add(d, n, f"rand_warm_{readers}{tag}_fps", r.files_per_s)
                    if mode == "fs":
                        s.add(d, n, f"rand_warm_{readers}_mbps", r.mb_per_s)
            self._record_rss(system, dataset, m, peak)

        self._add_rss(system, dataset, peak)

    def api_round(self, system: System, dataset: Dataset, sample_list: Path, expect: int) -> None:
        """bundlefs's Python API (no FUSE): cold (dropped caches) then warm, 1 and 2 readers."""
        d, n, s = dataset.name, system.name, self.samples
        bundle = self.packs[d][n].archive
        drop_caches()
        src = getattr(system, "source", None)
        r = run_readers(bundle, sample_list, 1, mode="api", bundlefs_source=src)
        self._check_bytes(r, expect, system, dataset)
        s.add(d, n, "api_cold_1_fps", r.files_per_s)
        for readers in (1, 2):
            r = run_readers(
                bundle,
                sample_list,
                readers,
                mode="api",
                min_seconds=self.warm_seconds,
                bundlefs_source=src,
            )
            self._check_bytes(r, expect, system, dataset)
            s.add(d, n, f"api_warm_{readers}_fps", r.files_per_s)
            s.add(d, n, f"api_warm_{readers}_mbps", r.mb_per_s)

    def _check_bytes(self, r: ReadResult, expect: int, system: System, dataset: Dataset) -> None:
        # Cheap per-run correctness: a system that returns short files must not look fast.
        if r.first_pass_bytes != expect:
            raise RuntimeError(
                f"{dataset.name}/{system.name}: read {r.first_pass_bytes} bytes, "
                f"the source has {expect}"
            )

    # ---------------------------------------------------------------- large files

    def seq_round(self, system: System, dataset: Dataset, files_list: Path, expect: int) -> None:
        """Sequential whole-file reads of the large files, cold then warm, one reader."""
        d, n, s = dataset.name, system.name, self.samples
        peak: list[int] = []
        with self._mount(system, dataset) as m:
            self._record_mount(system, dataset, m)
            drop_caches()
            r = run_readers(m.root, files_list, 1)
            self._check_bytes(r, expect, system, dataset)
            s.add(d, n, "seq_cold_mbps", r.mb_per_s)
            r = run_readers(m.root, files_list, 1, min_seconds=self.warm_seconds)
            self._check_bytes(r, expect, system, dataset)
            s.add(d, n, "seq_warm_mbps", r.mb_per_s)
            self._record_rss(system, dataset, m, peak)
        self._add_rss(system, dataset, peak)


def rotate(items: list[System], r: int) -> list[System]:
    """Round-robin order: round r starts with item r, so no system is always first or last."""
    if not items:
        return []
    k = r % len(items)
    return items[k:] + items[:k]
