"""Ten million files (issue 13): ``python -m bench.scale [--sizes 100000,10000000] [--workdir DIR]
[--rounds R] [--stats K] [--pack-path auto|tar|source] [--squashfs-up-to N] [--keep]
[--no-docs]``.

Packs a generated tree of N small files at each size and measures how every figure grows with N:

- **The tree** (``Tree``, a pure function of N and the seed, generated in name order with O(1)
  memory per file, never on disk): ``big/`` holds N/10 files, the rest sit in ``shard-00000/``,
  ``shard-00001/``, … of 10,000 files each; files are ``sample-000001234.json`` (21-byte names),
  64 B–2 KiB (log-uniform, ~570 B on average), JSON-lines text behind a line naming the file (lz4
  ~2.4×), whole-second mtimes, one owner (1000:1000), mode 0644, directories 0755.
- **Packing** without N inodes on disk, two ways: a generated tar (``bundlefs.read.export``'s GNU
  headers) piped into ``bundlefs pack - DEST``, and the same tree as an ``EntrySource``
  (``TreeSource``) handed to ``bundlefs.pack`` in a worker process. Both are measured at sizes up to
  1,000,000 (they give the same bundle); above that only the faster at the run's smallest size
  (``--pack-path`` overrides). squashfs is ``sqfstar -comp lz4 -b 256K`` reading the same tar on
  stdin, served by ``squashfuse_ll``, up to ``--squashfs-up-to`` files (1,000,000: sqfstar's time
  grows with the square of a directory's entries). Pack time is wall time including generating the
  source; the tar generator alone is timed too.
- **Per size and system** (bundlefs and squashfuse_ll, mounted by bench.systems): index bytes per
  file; mount ready (spawn to a stat-able root) after dropped caches, warm, and for bundlefs
  without its index checksum; ``os.stat`` of K random paths on a fresh mount after dropped caches
  (*cold*), again (*kernel*: the dentry and attribute caches answer), and again after
  ``echo 2 > drop_caches`` (*daemon*: dentries and inodes dropped, so every stat is a LOOKUP the
  warm daemon answers; its page cache kept), with the daemon's CPU time per stat; ``os.scandir``
  of ``big/`` the same three ways; the daemon's VmRSS, RssAnon, RssFile and VmHWM after those
  passes (bundlefs's record cache fixed at 64 MiB). Medians over ``--rounds``; growth is the
  largest size's figure ÷ the smallest's.

Writes ``bench-results/scale-*.json`` and, unless ``--no-docs``, the section "Ten million files:
measured" of docs/scale.md (the page's frame, ``FRAME``, first if the page is missing).
Everything else lives in the work directory, removed at the end unless ``--keep``. Needs root
(drop_caches) and ``/dev/fuse``; sqfstar and squashfuse_ll are apt-get installed when missing.

May import: the standard library, ``bench`` (datasets, measure, report, run, systems) and
``bundlefs``'s public packing and reading API.
"""

from __future__ import annotations

import argparse
import datetime as dt
import errno
import json
import os
import random
import shutil
import signal
import stat as statmod
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from bench import datasets, report, run
from bench.measure import RequestProbe, Samples, drop_caches
from bench.systems import (
    Bundlefs,
    Mounted,
    Squashfuse,
    System,
    _apt_ensure,
    _squashfs_index_bytes,
    daemon_cpu_seconds,
    mounted,
)
from bundlefs import Bundle, PackOptions, pack
from bundlefs.packing.sources.base import Content, SourceItem
from bundlefs.packing.sources.synthetic import SyntheticStat
from bundlefs.read.export import header as tar_header

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "scale.md"
SECTION = "## Ten million files: measured"
DEFAULT_SIZES = (100_000, 10_000_000)
SEED = 13

# The tree.
BIG = "big"
DIR_FILES = 10_000
MIN_SIZE, MAX_SIZE = 64, 2048
POOL_BYTES = 4 * 1024 * 1024  # JSON-lines text files take their bytes from
MTIME0 = 1_700_000_000  # whole seconds; files spread over the next 2^20 s (~12 days)
OWNER = 1000
CREATED_S = 1_704_067_200  # the bundles' and the image's creation time: reproducible packs
_M64 = (1 << 64) - 1

# The run.
CACHE_SIZE = "64MiB"  # bundlefs's record cache: fixed, so RSS is comparable across sizes
COMPARE_UP_TO = 1_000_000  # both pack paths at sizes up to this; above it, the chosen one
PACK_PATHS = ("tar", "source")
# sqfstar (and tar2sqfs) add each member to its directory after a linear search of the names
# already there: one directory of n entries costs n² (here 20k, 40k, 80k entries: 6, 35, 145 s),
# so the 1,000,000-entry big/ of 10,000,000 files would take hours. Above this, no squashfs.
SQUASHFS_UP_TO = 1_000_000
FLAT = 1.5  # "flat in the file count": grows by at most this factor over the run's sizes
TARGET_FILES = 10_000_000
CHUNK = 1024 * 1024

log = report.log


# -- the tree --------------------------------------------------------------------------------------


def _mix(x: int) -> int:
    """splitmix64's finaliser: a 64-bit hash, so any file's facts are one call away."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class FileFacts(NamedTuple):
    size: int
    mtime: int  # whole seconds
    offset: int  # where its text starts in the pool


class Tree:
    """The generated tree of ``files`` files: names, sizes, mtimes and bytes from (files, seed)
    (and the size of the text pool, fixed but for tests).

    Directory 0 is ``big/`` (files 0 … files/10 - 1), directory d ≥ 1 is ``shard-{d-1:05d}/``
    (10,000 consecutive files each, the last one fewer). File i is ``sample-{i:09d}.json`` in
    its directory, so name order is i order, and every fact of file i is a hash of (seed, i):
    a file is generated without generating the others.
    """

    def __init__(self, files: int, seed: int = SEED, pool_bytes: int = POOL_BYTES) -> None:
        if files < 10:
            raise ValueError("the tree needs at least 10 files")
        if pool_bytes <= MAX_SIZE:
            raise ValueError(f"the pool must be larger than {MAX_SIZE} bytes")
        self.files = files
        self.seed = seed
        self.pool_bytes = pool_bytes
        self.big = files // 10
        self.shards = -(-(files - self.big) // DIR_FILES)
        self._key = _mix(seed)
        self._pool: bytes | None = None

    @property
    def pool(self) -> bytes:
        """The text files take their bytes from (built on first use, ~0.7 s)."""
        if self._pool is None:
            rng = random.Random(f"scale-pool:{self.seed}")
            self._pool = datasets._text_bytes(rng, self.pool_bytes)
        return self._pool

    @property
    def dirs(self) -> int:
        return 1 + self.shards

    def dir_name(self, d: int) -> str:
        return BIG if d == 0 else f"shard-{d - 1:05d}"

    def dir_files(self, d: int) -> range:
        if d == 0:
            return range(self.big)
        start = self.big + (d - 1) * DIR_FILES
        return range(start, min(self.files, start + DIR_FILES))

    def dir_of(self, i: int) -> int:
        return 0 if i < self.big else 1 + (i - self.big) // DIR_FILES

    @staticmethod
    def name(i: int) -> str:
        return f"sample-{i:09d}.json"

    def path(self, i: int) -> str:
        return f"{self.dir_name(self.dir_of(i))}/{self.name(i)}"

    def facts(self, i: int) -> FileFacts:
        h = _mix(self._key ^ i)
        size = int(MIN_SIZE * (MAX_SIZE / MIN_SIZE) ** ((h & 0xFFFFF) / 0x100000))
        mtime = MTIME0 + ((h >> 20) & 0xFFFFF)
        return FileFacts(size, mtime, (h >> 40) % (self.pool_bytes - MAX_SIZE))

    def content(self, i: int, facts: FileFacts) -> bytes:
        """A line naming the file, then pool text: moderately compressible, never all alike."""
        head = b'{"file":%d,"seed":%d}\n' % (i, self.seed)
        return (head + self.pool[facts.offset : facts.offset + facts.size])[: facts.size]

    def sample(self, count: int) -> list[int]:
        """A fixed random sample of file numbers (seeded by the seed and the size)."""
        rng = random.Random(f"scale-sample:{self.seed}:{self.files}")
        return rng.sample(range(self.files), min(count, self.files))


# -- the tree as a tar stream ----------------------------------------------------------------------

_TAR_END = b"\0" * 1024  # two zero blocks end the archive


def tar_chunks(tree: Tree) -> Iterator[bytes]:
    """The tree as a tar, in name order (directories before their files), ~1 MiB at a time."""
    parts: list[bytes] = []
    held = 0
    for d in range(tree.dirs):
        directory = tree.dir_name(d).encode()
        parts.append(
            tar_header(directory + b"/", mode=0o755, uid=OWNER, gid=OWNER, mtime=MTIME0, kind=b"5")
        )
        for i in tree.dir_files(d):
            facts = tree.facts(i)
            data = tree.content(i, facts)
            name = directory + b"/" + tree.name(i).encode()
            parts.append(
                tar_header(
                    name, mode=0o644, uid=OWNER, gid=OWNER, size=facts.size, mtime=facts.mtime
                )
            )
            parts.append(data)
            parts.append(b"\0" * (-facts.size % 512))
            held += 1024 + facts.size
            if held >= CHUNK:
                yield b"".join(parts)
                parts, held = [], 0
    parts.append(_TAR_END)
    yield b"".join(parts)


# -- the tree as an EntrySource --------------------------------------------------------------------


class TreeSource:
    """``Tree`` as a ``bundlefs`` ``EntrySource``: every file delivered with its bytes (as a
    directory walk's read-ahead delivers small files), so ``open`` is never called."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self._dir_stat = SyntheticStat(statmod.S_IFDIR | 0o755, OWNER, OWNER, MTIME0 * 10**9, 0)
        self._dirs = {tree.dir_name(d).encode(): d for d in range(tree.dirs)}

    def root(self) -> SourceItem:
        return SourceItem(b"", b"", self._dir_stat)

    def children(self, rel: bytes) -> Iterator[SourceItem]:
        if not rel:
            for name in sorted(self._dirs):
                yield SourceItem(name, name, self._dir_stat)
            return
        tree = self.tree
        for i in tree.dir_files(self._dirs[rel]):
            facts = tree.facts(i)
            name = tree.name(i).encode()
            st = SyntheticStat(
                statmod.S_IFREG | 0o644, OWNER, OWNER, facts.mtime * 10**9, facts.size, 1, 0, i + 1
            )
            yield SourceItem(rel + b"/" + name, name, st, tree.content(i, facts), st, st)

    def readlink(self, item: SourceItem) -> bytes:
        raise OSError(errno.EINVAL, "the tree has no symlinks")

    def open(self, item: SourceItem) -> Content:
        raise OSError(errno.ENOENT, "every file is delivered with its bytes")


def pack_worker(dest: Path, files: int, seed: int, jobs: int) -> int:
    """``--pack-worker``: pack the tree from ``TreeSource`` into ``dest``; one JSON line out."""
    tree = Tree(files, seed)
    tree.pool  # noqa: B018 - built before the clock starts, as the tar path's is
    t0 = time.perf_counter()
    summary = pack(
        TreeSource(tree), str(dest), PackOptions(created_ns=CREATED_S * 10**9, jobs=jobs)
    )
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, **summary.to_dict()}), flush=True)
    return 0


# -- running the packers ---------------------------------------------------------------------------


@dataclass
class Packed:
    """One pack: wall time, the packer's peak RSS (VmHWM of the process, from wait4) and output."""

    seconds: float
    peak_rss: int
    output: str


def _wait(proc: subprocess.Popen[bytes]) -> tuple[int, int]:
    """(exit code, peak RSS in bytes) of a child, reaped here with its resource usage."""
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024


def _packer(
    cmd: list[str], log_path: Path, feed: Tree | None, env: dict[str, str] | None
) -> Packed:
    """Run ``cmd`` (fed the tree's tar on stdin if ``feed``), its output into ``log_path``."""
    with open(log_path, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE if feed is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd="/",
            env=env,
        )
        try:
            if feed is not None:
                assert proc.stdin is not None
                try:
                    for chunk in tar_chunks(feed):
                        proc.stdin.write(chunk)
                    proc.stdin.close()
                except BrokenPipeError:
                    pass  # the packer died: its exit code and log say why
            code, peak = _wait(proc)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        seconds = time.perf_counter() - t0
    text = log_path.read_text(errors="replace")
    if code != 0:
        raise RuntimeError(f"{cmd[0]} failed ({code}): {text[-2000:]}")
    return Packed(seconds, peak, text)


def pack_bundle_tar(tree: Tree, dest: Path, system: Bundlefs) -> Packed:
    cmd = [*system.cli, "pack", "-", str(dest), "--quiet", "--created", str(CREATED_S)]
    return _packer(cmd + ["--jobs", str(system.jobs)], dest.with_suffix(".log"), tree, None)


def pack_bundle_source(tree: Tree, dest: Path, system: Bundlefs) -> Packed:
    cmd = [sys.executable, "-m", "bench.scale", "--pack-worker", str(dest)]
    cmd += ["--worker-files", str(tree.files), "--seed", str(tree.seed), "--jobs", str(system.jobs)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    packed = _packer(cmd, dest.with_suffix(".log"), None, env)
    # The worker's own clock: without the interpreter start and the pool (the tar path's
    # generator builds its pool before its clock starts too).
    packed.seconds = json.loads(packed.output.strip().splitlines()[-1])["seconds"]
    return packed


def pack_squashfs(tree: Tree, image: Path) -> Packed:
    cmd = ["sqfstar", "-comp", "lz4", "-b", "256K", "-no-progress", "-mkfs-time", str(CREATED_S)]
    return _packer([*cmd, str(image)], image.with_suffix(".log"), tree, None)


def generate_seconds(tree: Tree) -> float:
    """The tar generator alone: the part of the tar path's pack time that is the source's."""
    t0 = time.perf_counter()
    for _chunk in tar_chunks(tree):
        pass
    return time.perf_counter() - t0


# -- measuring a mount -----------------------------------------------------------------------------


class ScaleBundlefs(Bundlefs):
    """``bundlefs mount --foreground --cache-size 64MiB`` plus ``extra`` options."""

    def __init__(self, workdir: Path, extra: tuple[str, ...] = ()) -> None:
        super().__init__(workdir, cache_size=CACHE_SIZE)
        self.extra = extra

    def daemon_cmd(self, archive: Path, mnt: Path) -> list[str]:
        cmd = super().daemon_cmd(archive, mnt)
        return [*cmd[:-2], *self.extra, *cmd[-2:]]


def drop_dentries() -> None:
    """``echo 2 > drop_caches``: forget dentries and inodes (a FUSE mount's included: their
    next use is a LOOKUP to the daemon), keep the page cache."""
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")


def proc_memory(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile and VmHWM of ``pid`` in bytes (empty if it is gone)."""
    keys = ("VmRSS", "RssAnon", "RssFile", "VmHWM")
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in keys:
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        return {}
    return out


def stat_pass(paths: list[str], sizes: list[int]) -> float:
    """µs per ``os.stat`` over ``paths``; every size checked against the tree's, off the clock."""
    t0 = time.perf_counter()
    got = [os.stat(p).st_size for p in paths]
    seconds = time.perf_counter() - t0
    if got != sizes:
        wrong = sum(a != b for a, b in zip(got, sizes, strict=True))
        raise RuntimeError(f"{wrong} of {len(paths)} stats gave the wrong size")
    return seconds / len(paths) * 1e6


def list_pass(directory: Path, expect: int) -> float:
    """Entries per second of one ``os.scandir`` of ``directory``, its count checked."""
    t0 = time.perf_counter()
    with os.scandir(directory) as it:
        count = sum(1 for _ in it)
    seconds = time.perf_counter() - t0
    if count != expect:
        raise RuntimeError(f"listing {directory} gave {count} entries, not {expect}")
    return count / seconds


def _ready(r: Samples, d: str, metric: str, system: System, m: Mounted) -> None:
    r.add(d, system.name, metric, m.ready_seconds * 1000)


def _cpu(
    r: Samples, d: str, metric: str, name: str, m: Mounted, before: float | None, count: int
) -> None:
    """The daemon's CPU time since ``before`` (clock ticks of 10 ms: coarse), µs per item."""
    after = daemon_cpu_seconds(m.pid or 0)
    if before is not None and after is not None:
        r.add(d, name, metric, (after - before) / count * 1e6)


def _memory(m: Mounted, worst: dict[str, int]) -> None:
    for key, value in proc_memory(m.pid or 0).items():
        worst[key] = max(worst.get(key, 0), value)


def measure_mounts(
    system: System, archive: Path, mnt: Path, tree: Tree, stats: int, r: Samples
) -> None:
    """One round of mount, stat, listing and memory measurements of one system."""
    name, d = system.name, str(tree.files)
    sample = tree.sample(stats)
    rels = [tree.path(i) for i in sample]
    sizes = [tree.facts(i).size for i in sample]
    worst: dict[str, int] = {}

    drop_caches()
    with mounted(system, archive, mnt) as m:
        _ready(r, d, "ready_cold_ms", system, m)
        paths = [f"{m.root}/{rel}" for rel in rels]
        cpu = daemon_cpu_seconds(m.pid or 0)
        r.add(d, name, "stat_cold_us", stat_pass(paths, sizes))
        _cpu(r, d, "stat_cold_cpu_us", name, m, cpu, len(paths))
        r.add(d, name, "stat_kernel_us", stat_pass(paths, sizes))
        drop_dentries()
        probe = RequestProbe.start(m.root) if name == "bundlefs" else None
        cpu = daemon_cpu_seconds(m.pid or 0)
        r.add(d, name, "stat_daemon_us", stat_pass(paths, sizes))
        _cpu(r, d, "stat_daemon_cpu_us", name, m, cpu, len(paths))
        counts = probe.finish() if probe is not None else None
        if counts is not None:
            r.add(d, name, "stat_daemon_lookups", counts.get("lookup", 0) / len(paths))
        _memory(m, worst)

    drop_caches()
    with mounted(system, archive, mnt) as m:
        _ready(r, d, "ready_cold_ms", system, m)
        big = m.root / BIG
        r.add(d, name, "list_cold_eps", list_pass(big, tree.big))
        r.add(d, name, "list_kernel_eps", list_pass(big, tree.big))
        drop_dentries()
        r.add(d, name, "list_daemon_eps", list_pass(big, tree.big))
        _memory(m, worst)

    with mounted(system, archive, mnt) as m:  # the image in the page cache: a warm mount
        _ready(r, d, "ready_warm_ms", system, m)

    for key, value in worst.items():
        r.add(d, name, f"mem_{key}_mb", value / 1e6)


def measure_unchecked(system: ScaleBundlefs, archive: Path, mnt: Path, r: Samples, d: str) -> None:
    """bundlefs's cold mount ready without its index checksum: what the CRC costs."""
    drop_caches()
    with mounted(system, archive, mnt) as m:
        _ready(r, d, "ready_nocheck_ms", system, m)


# -- one size --------------------------------------------------------------------------------------


def _choose(results: dict[str, Any], forced: str) -> str:
    """The pack path for a size above COMPARE_UP_TO: forced, or the faster at the first size."""
    if forced != "auto":
        return forced
    for facts in results.values():
        times = {p: facts["pack"][p]["seconds"] for p in PACK_PATHS if p in facts["pack"]}
        if len(times) == len(PACK_PATHS):
            return min(times, key=times.__getitem__)
    return "source"


def pack_bundles(
    tree: Tree, here: Path, paths: list[str], system: Bundlefs, keep: bool
) -> dict[str, Any]:
    """Pack the tree with bundlefs by each of ``paths``; keep the faster's bundle (or all)."""
    packers = {"tar": pack_bundle_tar, "source": pack_bundle_source}
    out: dict[str, Any] = {}
    for path in paths:
        dest = here / f"bundle-{path}"
        drop_caches()
        packed = packers[path](tree, dest, system)
        with Bundle(dest) as b:
            info = b.info()
        out[path] = {
            "seconds": packed.seconds,
            "peak_rss": packed.peak_rss,
            "index_bytes": info.index_bytes,
            "bundle_bytes": sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()),
            "bundle_id": info.bundle_id.hex(),
        }
        log(
            f"  bundlefs pack ({path}): {packed.seconds:.1f} s, "
            f"{tree.files / packed.seconds:,.0f} files/s, peak RSS "
            f"{packed.peak_rss / 1e6:,.0f} MB, index {info.index_bytes / tree.files:.1f} B/file"
        )
    chosen = min(paths, key=lambda p: out[p]["seconds"])
    for path in paths:
        if path != chosen and not keep:
            shutil.rmtree(here / f"bundle-{path}")
    return out


def measure_size(
    files: int, work: Path, args: argparse.Namespace, results: dict[str, Any]
) -> dict[str, Any]:
    """Pack the tree of ``files`` files every way this size asks for, then measure the mounts."""
    tree = Tree(files, args.seed)
    tree.pool  # noqa: B018 - built once, off every clock
    here = work / str(files)
    shutil.rmtree(here, ignore_errors=True)
    here.mkdir(parents=True)
    paths = list(PACK_PATHS) if files <= COMPARE_UP_TO else [_choose(results, args.pack_path)]
    with_squashfs = files <= args.squashfs_up_to
    out: dict[str, Any] = {"files": files, "dirs": tree.dirs, "squashfs": with_squashfs}

    log(f"== {files:,} files ({tree.big:,} in {BIG}/, {tree.shards:,} shard directories)")
    out["bytes"] = sum(tree.facts(i).size for i in range(files))
    if with_squashfs or "tar" in paths:
        out["generate_s"] = generate_seconds(tree)
        log(f"  tar generator alone: {out['generate_s']:.1f} s")
    bundlefs = ScaleBundlefs(work)
    bundlefs.ensure(log)
    out["pack"] = pack_bundles(tree, here, paths, bundlefs, args.keep)
    chosen = out["pack_path"] = min(paths, key=lambda p: out["pack"][p]["seconds"])
    ids = {out["pack"][p]["bundle_id"] for p in paths}
    out["paths_identical"] = len(ids) == 1 if len(paths) > 1 else None

    out["du"] = measure_du(here / f"bundle-{chosen}")
    du = out["du"]
    log(f"  du /: {du['call_ms']:.3f} ms in the library, {du['cli_ms']:.0f} ms as a command")
    unchecked = ScaleBundlefs(work, ("--no-index-check",))
    unchecked.help = bundlefs.help
    archives: dict[str, tuple[System, Path]] = {"bundlefs": (bundlefs, here / f"bundle-{chosen}")}
    if with_squashfs:
        image = here / "image.sqfs"
        drop_caches()
        packed = pack_squashfs(tree, image)
        out["pack"]["squashfs"] = {
            "seconds": packed.seconds,
            "peak_rss": packed.peak_rss,
            "index_bytes": _squashfs_index_bytes(packed.output),
            "bundle_bytes": image.stat().st_size,
        }
        log(f"  sqfstar: {packed.seconds:.1f} s, peak RSS {packed.peak_rss / 1e6:,.0f} MB")
        archives["squashfuse_ll"] = (Squashfuse(work), image)
    else:
        log(f"  no squashfs above {args.squashfs_up_to:,} files (--squashfs-up-to)")

    r = Samples()
    for k in range(args.rounds):
        order = list(archives) if k % 2 == 0 else list(reversed(archives))
        for name in order:
            system, archive = archives[name]
            measure_mounts(system, archive, here / f"mnt-{name}", tree, args.stats, r)
        measure_unchecked(unchecked, archives["bundlefs"][1], here / "mnt-bundlefs", r, str(files))
        log(f"  round {k + 1}/{args.rounds} done")
    out["samples"] = r.to_json()[str(files)]
    out["medians"] = report.medians(r.to_json())[str(files)]
    if not args.keep:
        shutil.rmtree(here)
    return out


def measure_du(bundle: Path, rounds: int = 5) -> dict[str, float]:
    """``du`` of the root: the library call on an open bundle (the stored totals' lookup, or the
    walk of an older bundle) and the whole ``bundlefs du`` command (interpreter start, open with
    the index check, lookup), medians of ``rounds``; the answer checked against the config."""
    calls, commands = [], []
    with Bundle(str(bundle)) as b:
        for _ in range(rounds):
            t0 = time.perf_counter()
            totals = b.du("/")
            calls.append(time.perf_counter() - t0)
        if (totals.files, totals.bytes) != (b.config.file_count, b.config.data_bytes):
            raise SystemExit(f"du / of {bundle} disagrees with its config: {totals}")
    for _ in range(rounds):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "bundlefs", "du", "--json", str(bundle)],
            check=True,
            capture_output=True,
        )
        commands.append(time.perf_counter() - t0)
    return {"call_ms": sorted(calls)[rounds // 2] * 1e3,
            "cli_ms": sorted(commands)[rounds // 2] * 1e3}  # fmt: skip


# -- the report ------------------------------------------------------------------------------------


Getter = Callable[[dict[str, Any]], float | None]  # one figure of one size's results


@dataclass(frozen=True)
class Row:
    """One line of the table: how to get a figure of one size's results, and its target."""

    label: str
    get: Getter
    fmt: str
    target: str = ""
    # Whether the target is met, from the figures of every size (smallest first).
    met: Callable[[list[float | None]], bool | None] | None = None


def _med(metric: str, system: str) -> Getter:
    return lambda s: s["medians"].get(system, {}).get(metric)


def _pack(path: str, key: str) -> Getter:
    def get(s: dict[str, Any]) -> float | None:
        p = s["pack"].get(s["pack_path"] if path == "chosen" else path)
        if p is not None and key == "rate":
            return s["files"] / p["seconds"]
        if p is None or p.get(key) is None:
            return None
        if key == "index_bytes":
            return p[key] / s["files"]
        if key in ("peak_rss", "bundle_bytes"):
            return p[key] / 1e6
        return p[key] / 60 if key == "seconds" else p[key]

    return get


def _ratio(a: Getter, b: Getter) -> Getter:
    def get(s: dict[str, Any]) -> float | None:
        x, y = a(s), b(s)
        return x / y if x is not None and y else None

    return get


def _flat(values: list[float | None]) -> bool | None:
    known = [v for v in values if v is not None]
    return known[-1] / known[0] <= FLAT if len(known) > 1 and known[0] else None


def _at_most(bound: float) -> Callable[[list[float | None]], bool | None]:
    def met(values: list[float | None]) -> bool | None:
        known = [v for v in values if v is not None]
        return all(v <= bound for v in known) if known else None

    return met


def _pack_target(sizes: list[int]) -> Callable[[list[float | None]], bool | None]:
    def met(values: list[float | None]) -> bool | None:
        at = [v for n, v in zip(sizes, values, strict=True) if n == TARGET_FILES]
        return at[0] <= 15 if at and at[0] is not None else None

    return met


def rows(sizes: list[int]) -> list[Row]:
    b, sq = "bundlefs", "squashfuse_ll"
    return [
        Row("bundlefs pack (min)", _pack("chosen", "seconds"), "{:,.2f}", "≤ 15 at 10M",
            _pack_target(sizes)),
        Row("bundlefs pack rate (files/s)", _pack("chosen", "rate"), "{:,.0f}"),
        Row("bundlefs pack, tar on stdin (min)", _pack("tar", "seconds"), "{:,.2f}"),
        Row("bundlefs pack, EntrySource (min)", _pack("source", "seconds"), "{:,.2f}"),
        Row("bundlefs pack peak RSS (MB)", _pack("chosen", "peak_rss"), "{:,.0f}"),
        Row("bundlefs pack peak RSS, tar on stdin (MB)", _pack("tar", "peak_rss"), "{:,.0f}"),
        Row("tar generator alone (min)", lambda s: s.get("generate_s", 0) / 60 or None,
            "{:,.2f}"),
        Row("sqfstar pack (min)", _pack("squashfs", "seconds"), "{:,.2f}"),
        Row("sqfstar peak RSS (MB)", _pack("squashfs", "peak_rss"), "{:,.0f}"),
        Row("bundle size (MB)", _pack("chosen", "bundle_bytes"), "{:,.1f}"),
        Row("squashfs image size (MB)", _pack("squashfs", "bundle_bytes"), "{:,.1f}"),
        Row("bundlefs index bytes per file", _pack("chosen", "index_bytes"), "{:,.1f}", "≤ 60",
            _at_most(60)),
        Row("squashfs index bytes per file", _pack("squashfs", "index_bytes"), "{:,.1f}"),
        Row("bundlefs du / in the library (ms)", lambda s: s.get("du", {}).get("call_ms"),
            "{:,.3f}", "≤ 50, flat", _at_most(50)),
        Row("bundlefs du / as a command (ms)", lambda s: s.get("du", {}).get("cli_ms"),
            "{:,.0f}"),
        Row("bundlefs mount ready, cold (ms)", _med("ready_cold_ms", b), "{:,.0f}", "flat",
            _flat),
        Row("bundlefs mount ready, cold, --no-index-check (ms)", _med("ready_nocheck_ms", b),
            "{:,.0f}", "flat", _flat),
        Row("bundlefs mount ready, warm (ms)", _med("ready_warm_ms", b), "{:,.0f}", "flat",
            _flat),
        Row("squashfuse_ll mount ready, cold (ms)", _med("ready_cold_ms", sq), "{:,.0f}"),
        Row("squashfuse_ll mount ready, warm (ms)", _med("ready_warm_ms", sq), "{:,.0f}"),
        Row("bundlefs stat, cold (µs)", _med("stat_cold_us", b), "{:,.1f}"),
        Row("squashfuse_ll stat, cold (µs)", _med("stat_cold_us", sq), "{:,.1f}"),
        Row("stat cold, bundlefs ÷ squashfuse_ll", _ratio(_med("stat_cold_us", b),
            _med("stat_cold_us", sq)), "{:,.2f}", "≤ 2", _at_most(2.0)),
        Row("bundlefs stat, daemon warm (µs)", _med("stat_daemon_us", b), "{:,.1f}"),
        Row("squashfuse_ll stat, daemon warm (µs)", _med("stat_daemon_us", sq), "{:,.1f}"),
        Row("bundlefs daemon CPU per stat, cold (µs)", _med("stat_cold_cpu_us", b), "{:,.0f}"),
        Row("squashfuse_ll daemon CPU per stat, cold (µs)", _med("stat_cold_cpu_us", sq),
            "{:,.0f}"),
        Row("bundlefs daemon CPU per stat, daemon warm (µs)", _med("stat_daemon_cpu_us", b),
            "{:,.0f}"),
        Row("squashfuse_ll daemon CPU per stat, daemon warm (µs)",
            _med("stat_daemon_cpu_us", sq), "{:,.0f}"),
        Row("bundlefs LOOKUPs per stat, daemon warm", _med("stat_daemon_lookups", b), "{:,.2f}"),
        Row("bundlefs stat, kernel cache (µs)", _med("stat_kernel_us", b), "{:,.1f}"),
        Row("squashfuse_ll stat, kernel cache (µs)", _med("stat_kernel_us", sq), "{:,.1f}"),
        Row(f"bundlefs list {BIG}/, cold (entries/s)", _med("list_cold_eps", b), "{:,.0f}"),
        Row(f"squashfuse_ll list {BIG}/, cold (entries/s)", _med("list_cold_eps", sq),
            "{:,.0f}"),
        Row(f"bundlefs list {BIG}/, daemon warm (entries/s)", _med("list_daemon_eps", b),
            "{:,.0f}"),
        Row(f"squashfuse_ll list {BIG}/, daemon warm (entries/s)", _med("list_daemon_eps", sq),
            "{:,.0f}"),
        Row(f"bundlefs list {BIG}/, kernel cache (entries/s)", _med("list_kernel_eps", b),
            "{:,.0f}"),
        Row(f"squashfuse_ll list {BIG}/, kernel cache (entries/s)", _med("list_kernel_eps", sq),
            "{:,.0f}"),
        Row("bundlefs daemon VmRSS (MB)", _med("mem_VmRSS_mb", b), "{:,.1f}", "flat", _flat),
        Row("bundlefs daemon RssAnon (MB)", _med("mem_RssAnon_mb", b), "{:,.1f}", "flat", _flat),
        Row("bundlefs daemon RssFile (MB)", _med("mem_RssFile_mb", b), "{:,.1f}"),
        Row("bundlefs daemon VmHWM (MB)", _med("mem_VmHWM_mb", b), "{:,.1f}"),
        Row("squashfuse_ll VmRSS (MB)", _med("mem_VmRSS_mb", sq), "{:,.1f}"),
    ]  # fmt: skip


def _size_label(n: int) -> str:
    for div, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if n >= div and n % div == 0:
            return f"{n // div}{suffix}"
    return f"{n:,}"


def table(results: dict[str, Any]) -> str:
    sizes = sorted(int(n) for n in results["sizes"])
    per = [results["sizes"][str(n)] for n in sizes]
    head = ["metric", *(_size_label(n) for n in sizes), "growth", "target", "met?"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(sizes) + 1) + "|---|---|"]
    for row in rows(sizes):
        values = [row.get(s) for s in per]
        if all(v is None for v in values):
            continue
        cells = [row.fmt.format(v) if v is not None else "—" for v in values]
        first, last = values[0], values[-1]
        growth = f"{last / first:,.2f}×" if len(values) > 1 and first and last else "—"
        verdict = row.met(values) if row.met is not None else None
        met = {True: "yes", False: "**no**", None: "—" if row.target else ""}[verdict]
        lines.append(
            f"| {row.label} | " + " | ".join(cells) + f" | {growth} | {row.target} | {met} |"
        )
    return "\n".join(lines)


def _projection(results: dict[str, Any]) -> str:
    """bundlefs's pack time and disk at 10M, scaled linearly from the largest size measured."""
    largest = max(int(n) for n in results["sizes"])
    s = results["sizes"][str(largest)]
    scale = TARGET_FILES / largest
    packed = s["pack"][s["pack_path"]]
    return (
        f"Scaled linearly from {largest:,} files to {TARGET_FILES:,}: bundlefs pack "
        f"~{packed['seconds'] / 60 * scale:.0f} min ({s['pack_path']}), bundle "
        f"~{packed['bundle_bytes'] * scale / 1e9:.1f} GB."
    )


def render(results: dict[str, Any]) -> str:
    sizes = sorted(int(n) for n in results["sizes"])
    meta = results["meta"]
    first = results["sizes"][str(sizes[0])]
    paths = [
        f"{_size_label(int(n))}: {s['pack_path']}"
        + (" (both paths give the same bundle)" if s.get("paths_identical") else "")
        for n, s in sorted(results["sizes"].items(), key=lambda kv: int(kv[0]))
    ]
    parts = [
        SECTION,
        "",
        f"`{' '.join(['python -m bench.scale', *meta['argv']])}` on "
        f"{meta['started']} ({meta['minutes']:.0f} min), bundlefs at `{meta['git_head']}`, "
        f"{meta['rounds']} round{'s' if meta['rounds'] != 1 else ''} (medians), "
        f"{meta['stats']:,} random paths per stat pass. "
        f"Machine: {meta['machine']}; load {meta['load_start']} at the start, "
        f"{meta['load_end']} at the end. {first['bytes'] / first['files']:,.0f} bytes per file "
        f"on average. Pack path used for the mounts: {'; '.join(paths)}.",
        "",
        table(results),
        "",
        "Growth is the largest size's figure ÷ the smallest's; *flat* means at most "
        f"{FLAT:g}×. *Cold*: a fresh mount after `echo 3 > /proc/sys/vm/drop_caches`; *kernel "
        "cache*: the same paths again on that mount, answered from the dentry and attribute "
        "caches (both daemons give the kernel long timeouts) or, for the listing, the cached "
        "directory pages; *daemon warm*: again after `echo 2 > /proc/sys/vm/drop_caches` "
        "(dentries and inodes forgotten, page cache kept), so each path is LOOKUPs the warm "
        "daemon answers. Pack times include generating the source (the tar generator runs in "
        "the bench process beside `bundlefs pack -` and `sqfstar`).",
    ]
    skipped = [n for n in sizes if not results["sizes"][str(n)].get("squashfs", True)]
    if skipped:
        parts += [
            "",
            f"No squashfs at {', '.join(_size_label(n) for n in skipped)} files (above "
            f"`--squashfs-up-to` {meta['squashfs_up_to']:,}): sqfstar's time grows with the "
            "square of a directory's entries (see above); the squashfs rows and the ratio stop "
            "at the largest size it was built for.",
        ]
    if max(sizes) < TARGET_FILES:
        parts += ["", _projection(results)]
    return "\n".join(parts) + "\n"


FRAME = """\
# Scale: ten million files

`make bench-scale` (`python -m bench.scale`, issue 13) packs a generated tree of 100,000 and of
10,000,000 small files with bundlefs (and, up to 1,000,000 files, with squashfs), mounts them, and
measures how each figure grows from the small size to the large one: pack time, index bytes per
file, mount ready, `stat` of random paths (cold, warm), listing a directory of N/10 entries and the
daemon's memory. It is not part of `make test`.

The tree is never on disk: it is a pure function of the file count and a seed, generated in name
order (`bench.scale.Tree`): `big/` holds N/10 files and the rest sit in directories of 10,000
(`shard-00000/`, …); files are `sample-000001234.json`, 64 B to 2 KiB (~570 B on average) of
JSON-lines text (lz4 ~2.4×), one owner, whole-second mtimes.

bundlefs packs it two ways, both measured up to 1,000,000 files: a tar generated on the fly into
`bundlefs pack - DEST`, and the tree handed to `bundlefs.pack` as an `EntrySource`
(`bench.scale.TreeSource`). They give the same bundle (the same bundle id), but the `EntrySource`
is ~4× faster (the tar reader parses every header with `tarfile`); both pack in ~50 MB whatever
the size (the tar reader keeps its members in a temporary table on disk since issue 27: "Bounded
memory" below; it held ~1.4 KB per member before). Above 1,000,000 files only the faster is run.

squashfs packs the same tar with `sqfstar -comp lz4 -b 256K` on stdin and is served by
`squashfuse_ll`, up to `--squashfs-up-to` files (1,000,000). sqfstar (squashfs-tools 4.5.1) adds
each member to its directory after a linear search of the names already there, so a directory of
n entries costs n²: one directory of 20,000, 40,000 and 80,000 entries took 6, 35 and 145 s here,
and the tree of 1,000,000 files (a 100,000-entry `big/`) 8.9 min against 13 s for 100,000. The
1,000,000-entry `big/` of 10,000,000 files would take hours; `tar2sqfs` (squashfs-tools-ng 1.2)
grows the same way, and `mksquashfs` needs the tree on disk. So the squashfs figures, and the
cold-`stat` ratio against squashfuse_ll, stop at 1,000,000 files.

Run it as root on an otherwise idle machine (`--sizes 100000,1000000` for a shorter trial, ~15
min with squashfs at both sizes). The default run takes ~15 minutes and ~3.5 GB of free disk in
the work directory (`--workdir`, a temporary directory under /tmp by default, removed at the end);
the measured section below says how long the last run took.

## Ten million files: measured

Written by `python -m bench.scale`.

## Packing on Dask

Written by the distributed-packing benchmark.

## Extrapolating to 1,000,000,000 files

Filled in from the measured growth above: index size, memory and pack time on N machines, and
what would break first.
"""


def write_doc(text: str) -> None:
    """Replace the section ``text`` heads in docs/scale.md, writing the page's frame first if it
    is missing (bench.dask_pack writes its section the same way)."""
    if not DOC.exists():
        DOC.write_text(FRAME)
    report.write_section(text, DOC)
    log(f"wrote the section to {DOC}")


# -- the command line ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--sizes",
        default=",".join(str(n) for n in DEFAULT_SIZES),
        help="comma-separated file counts (%(default)s)",
    )
    ap.add_argument("--workdir", type=Path, help="where to work (default: a new temporary dir)")
    ap.add_argument("--rounds", type=int, default=3, help="mount rounds per size (%(default)s)")
    ap.add_argument("--stats", type=int, default=2000, help="random paths per stat pass")
    ap.add_argument(
        "--pack-path",
        choices=("auto", *PACK_PATHS),
        default="auto",
        help="bundlefs's pack path above 1,000,000 files (auto: the faster at the smallest size)",
    )
    ap.add_argument(
        "--squashfs-up-to",
        type=int,
        default=SQUASHFS_UP_TO,
        help="build and mount squashfs only up to this many files (%(default)s): sqfstar's "
        "directories cost the square of their entries",
    )
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--no-docs", action="store_true", help="do not write docs/scale.md")
    ap.add_argument("--pack-worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--worker-files", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        args.sizes = sorted({int(s.replace("_", "")) for s in args.sizes.split(",") if s})
    except ValueError:
        ap.error(f"--sizes: not a list of numbers: {args.sizes!r}")
    if not args.sizes or min(args.sizes) < 10:
        ap.error("--sizes: every size must be at least 10")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pack_worker is not None:
        return pack_worker(args.pack_worker, args.worker_files, args.seed, args.jobs)
    signal.signal(signal.SIGTERM, run._exit_on_sigterm)
    made = args.workdir is None
    root = Path(tempfile.mkdtemp(prefix="bundlefs-scale-", dir="/tmp")) if made else args.workdir
    work = root / "scale"
    root.mkdir(parents=True, exist_ok=True)
    run.preflight(root)
    _apt_ensure({"sqfstar": "squashfs-tools", "squashfuse_ll": "squashfuse"}, log)
    started = dt.datetime.now(dt.UTC)
    t0 = time.perf_counter()
    load_start = report.load_average()
    results: dict[str, Any] = {"sizes": {}}
    try:
        for files in args.sizes:
            results["sizes"][str(files)] = measure_size(files, work, args, results["sizes"])
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            if made:
                shutil.rmtree(root, ignore_errors=True)
        else:
            log(f"kept the work directory {work}")
    results["meta"] = {
        "argv": sys.argv[1:] if argv is None else argv,
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "minutes": (time.perf_counter() - t0) / 60,
        "machine": run.machine_info(),
        "load_start": load_start,
        "load_end": report.load_average(),
        "git_head": run._cmd_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
        "rounds": args.rounds,
        "stats": args.stats,
        "squashfs_up_to": args.squashfs_up_to,
        "seed": args.seed,
        "versions": {"sqfstar": run._cmd_output(["sqfstar", "-version"])},
    }
    out_dir = REPO / "bench-results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"scale-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(results, indent=1, sort_keys=True))
    log(f"raw results: {path}")
    text = render(results)
    print(text, flush=True)
    if not args.no_docs:
        write_doc(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
