"""Adapters for the systems under test.

Each system packs a source directory into an archive and serves the archive at a mount point:

- ``raw``: the source directory itself, no packing, no FUSE (the ceiling).
- ``squashfuse_ll``: ``mksquashfs SRC IMG -comp lz4 -noappend``, served by ``squashfuse_ll``.
- ``ratarmount``: ``tar -cf`` of the source, served by ratarmount from its own virtualenv.
- ``bundlefs``: ``bundlefs pack`` / ``bundlefs mount --foreground``.

Every daemon is started in the foreground as our own child process so that the bench knows its
PID (for the VmHWM and CPU readings) and can always clean it up; in the foreground none of the
three forks, so the process we start is the one that serves. The tests' mount harness
(``tests/support/mounting.py``) starts and stops them: readiness is the mount point appearing in
the mount table plus a successful ``stat`` of the mount root (with a deadline), the same check
for every system; teardown escalates from ``fusermount3 -u`` to a lazy unmount and a kill: a
benchmark must never leave a mount behind.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.mounting import Mount, start_daemon, stop_mount, unmount

# How long a daemon may take to make its mount usable before we give up on it.
MOUNT_TIMEOUT_S = 120.0
INDEX_BUILD_TIMEOUT_S = 3600.0

Log = Callable[[str], None]


class SystemUnavailable(RuntimeError):
    """The system cannot run on this machine (not installed and not installable)."""


@dataclass
class PackInfo:
    """What a pack produced: the archive path and the byte counts the report needs."""

    archive: Path
    seconds: float
    archive_bytes: int
    index_bytes: int | None
    # For ratarmount the first mount builds its SQLite index; reported as part of pack.
    detail: dict[str, float]


@dataclass
class Mounted:
    """A live mount: where it is, which process serves it and how long it took to be ready."""

    root: Path
    pid: int | None
    ready_seconds: float
    daemon: Mount | None = None  # None: no daemon (raw)


def _tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for fn in files:
            p = os.path.join(dirpath, fn)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)  # type: ignore[call-overload]


def vm_hwm_bytes(pid: int) -> int | None:
    """Peak resident set size of ``pid`` (VmHWM), or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _proc_stat_fields(pid: int) -> list[str] | None:
    """Fields 3 onwards of ``/proc/PID/stat`` (field N is at index N - 3), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # Field 2 is the command name in parentheses, which may itself hold spaces or parentheses.
    return text.rpartition(")")[2].split()


def daemon_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of ``pid`` and its descendants, threads included; None if gone.

    Descendants too: with ``auto_unmount`` libfuse leaves a ``fusermount3`` child watching the
    daemon (idle, but a system that served from child processes would be counted whole). Fields
    16 and 17 add the children already exited and reaped.
    """
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _proc_stat_fields(int(entry.name))
            if fields is not None:
                parents[int(entry.name)] = int(fields[1])  # field 4: the parent's PID
    if pid not in parents:
        return None
    tree: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += [child for child, parent in parents.items() if parent == p]
    ticks = 0
    for p in tree:
        fields = _proc_stat_fields(p)
        if fields is not None:  # fields 14-17: utime, stime, cutime, cstime in clock ticks
            ticks += sum(int(f) for f in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


@contextmanager
def mounted(
    system: System, archive: Path, mnt: Path, timeout: float = MOUNT_TIMEOUT_S
) -> Iterator[Mounted]:
    """Mount for the duration of the block; always unmount (even on errors or Ctrl-C)."""
    m = system.mount(archive, mnt, timeout)
    try:
        yield m
    finally:
        system.unmount(m)


class System:
    """Base adapter. Subclasses override ``pack``, ``daemon_cmd`` and optionally ``ensure``."""

    name = "?"
    is_fuse = True

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def ensure(self, log: Log) -> None:
        """Install what this system needs, or raise SystemUnavailable."""

    def env(self) -> dict[str, str] | None:
        """Environment for this system's processes (None: inherit ours)."""
        return None

    def archive_path(self, dest_dir: Path) -> Path:
        raise NotImplementedError

    def pack(self, src: Path, dest_dir: Path) -> PackInfo:
        raise NotImplementedError

    def daemon_cmd(self, archive: Path, mnt: Path) -> list[str]:
        raise NotImplementedError

    def mount(self, archive: Path, mnt: Path, timeout: float = MOUNT_TIMEOUT_S) -> Mounted:
        """Start the daemon in the foreground and wait until the mount is usable."""
        unmount(mnt)
        try:
            daemon = start_daemon(
                self.daemon_cmd(archive, mnt),
                mnt,
                bundle=archive,
                log_path=mnt.with_name(mnt.name + ".log"),
                env=self.env(),
                notify=False,  # the peers do not speak sd_notify: one readiness check for all
                timeout=timeout,
                watchdog=None,  # a bench run may hold a mount for an hour
                cwd="/",  # never pick up a package from the bench's working directory
            )
        except RuntimeError as e:
            raise RuntimeError(f"{self.name}: {e}") from None
        return Mounted(mnt, daemon.pid, daemon.ready_seconds, daemon)

    def unmount(self, m: Mounted) -> None:
        """Unmount and reap the daemon; escalate to lazy unmount and SIGKILL if needed."""
        if m.daemon is not None:
            stop_mount(m.daemon)


class RawDir(System):
    """The source directory itself: the ceiling every FUSE system is compared against."""

    name = "raw"
    is_fuse = False

    def archive_path(self, dest_dir: Path) -> Path:
        raise NotImplementedError  # raw has no archive; pack returns the source itself

    def pack(self, src: Path, dest_dir: Path) -> PackInfo:
        return PackInfo(src, 0.0, _tree_bytes(src), None, {})

    def mount(self, archive: Path, mnt: Path, timeout: float = MOUNT_TIMEOUT_S) -> Mounted:
        return Mounted(archive, None, 0.0)

    def unmount(self, m: Mounted) -> None:
        pass


class Squashfuse(System):
    """mksquashfs with lz4, served by the low-level (multi-threaded) squashfuse_ll."""

    name = "squashfuse_ll"

    def ensure(self, log: Log) -> None:
        _apt_ensure({"mksquashfs": "squashfs-tools", "squashfuse_ll": "squashfuse"}, log)

    def archive_path(self, dest_dir: Path) -> Path:
        return dest_dir / "archive.sqfs"

    def pack(self, src: Path, dest_dir: Path) -> PackInfo:
        img = self.archive_path(dest_dir)
        _remove(img)
        dest_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        r = _run(["mksquashfs", str(src), str(img), "-comp", "lz4", "-noappend", "-no-progress"])
        seconds = time.perf_counter() - t0
        return PackInfo(img, seconds, img.stat().st_size, _squashfs_index_bytes(r.stdout), {})

    def daemon_cmd(self, archive: Path, mnt: Path) -> list[str]:
        return ["squashfuse_ll", "-f", str(archive), str(mnt)]


def _squashfs_index_bytes(mksquashfs_stdout: str) -> int | None:
    """Compressed inode + directory table sizes from mksquashfs's summary (its metadata)."""
    total = 0
    found = False
    for label in ("Inode table size", "Directory table size"):
        m = re.search(rf"^{label} (\d+) bytes", mksquashfs_stdout, re.MULTILINE)
        if m:
            total += int(m.group(1))
            found = True
    return total if found else None


class Ratarmount(System):
    """An uncompressed tar served by ratarmount (installed into its own virtualenv)."""

    name = "ratarmount"

    @property
    def venv(self) -> Path:
        return self.workdir / "ratarmount-venv"

    @property
    def exe(self) -> Path:
        return self.venv / "bin" / "ratarmount"

    def ensure(self, log: Log) -> None:
        _apt_ensure({"tar": "tar"}, log)
        if self.exe.exists():
            return
        log(f"installing ratarmount into {self.venv}")
        try:
            # Its own venv: ratarmount's dependencies must not leak into the project's.
            _run([sys.executable, "-m", "venv", "--clear", str(self.venv)])
            _run([str(self.venv / "bin" / "pip"), "install", "-q", "ratarmount"])
        except subprocess.CalledProcessError as e:
            raise SystemUnavailable(f"ratarmount install failed: {e.stderr[-1000:]}") from e

    def archive_path(self, dest_dir: Path) -> Path:
        return dest_dir / "archive.tar"

    def index_path(self, archive: Path) -> Path:
        return archive.with_name(archive.name + ".index.sqlite")

    def pack(self, src: Path, dest_dir: Path) -> PackInfo:
        tar = self.archive_path(dest_dir)
        index = self.index_path(tar)
        _remove(tar)
        _remove(index)
        dest_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        _run(["tar", "-cf", str(tar), "-C", str(src), "."])
        t_tar = time.perf_counter() - t0
        # ratarmount's index is built by the first mount; that is part of "packing" for it and
        # must not be charged to the later mount-ready measurements.
        t1 = time.perf_counter()
        # Indexing a big tar takes a while: allow far longer than a normal mount.
        with mounted(self, tar, dest_dir / "index-build-mnt", timeout=INDEX_BUILD_TIMEOUT_S):
            pass  # mounting was the work: ratarmount has written its index once it is ready
        t_index = time.perf_counter() - t1
        return PackInfo(
            tar,
            t_tar + t_index,
            tar.stat().st_size + index.stat().st_size,
            index.stat().st_size,
            {"tar_seconds": t_tar, "index_seconds": t_index},
        )

    def daemon_cmd(self, archive: Path, mnt: Path) -> list[str]:
        return [
            str(self.exe),
            "-f",
            "--index-file",
            str(self.index_path(archive)),
            str(archive),
            str(mnt),
        ]


class Bundlefs(System):
    """bundlefs pack / bundlefs mount --foreground from the project's virtualenv."""

    name = "bundlefs"

    def __init__(
        self,
        workdir: Path,
        cache_size: str = "64MiB",
        jobs: int | None = None,
        source: Path | None = None,
    ) -> None:
        super().__init__(workdir)
        self.cache_size = cache_size
        # A directory holding a ``bundlefs`` package to run instead of the installed one (a
        # snapshot of a commit, so that edits in progress in the work tree are not measured).
        self.source = source
        self.jobs = jobs or os.cpu_count() or 1
        self.help: dict[str, str] = {"pack": "", "mount": ""}

    @property
    def cli(self) -> list[str]:
        exe = Path(sys.executable).with_name("bundlefs")
        if self.source is None and exe.exists():
            return [str(exe)]
        return [sys.executable, "-m", "bundlefs"]

    def env(self) -> dict[str, str] | None:
        if self.source is None:
            return None
        # PYTHONPATH is searched before the editable install's finder, so the snapshot wins.
        return {**os.environ, "PYTHONPATH": str(self.source)}

    def ensure(self, log: Log) -> None:
        _apt_ensure({"fusermount3": "fuse3"}, log)
        r = subprocess.run(
            [*self.cli, "--help"], capture_output=True, text=True, env=self.env(), cwd="/"
        )
        if r.returncode != 0:
            raise SystemUnavailable(f"bundlefs CLI not usable: {r.stderr.strip()[-500:]}")
        for sub in ("pack", "mount"):
            r = subprocess.run(
                [*self.cli, sub, "--help"], capture_output=True, text=True, env=self.env(), cwd="/"
            )
            if r.returncode != 0:
                raise SystemUnavailable(f"'bundlefs {sub}' not usable: {r.stderr.strip()[-500:]}")
            self.help[sub] = r.stdout
        if "--foreground" not in self.help["mount"]:
            raise SystemUnavailable(
                "'bundlefs mount' has no --foreground (the bench needs the PID)"
            )
        self._compile(log)

    def _compile(self, log: Log) -> None:
        """Byte-compile the package to be measured, as ``pip install`` does for a user.

        Otherwise every mount and pack would compile our modules again (~60 ms here) wherever
        bytecode is not written (PYTHONDONTWRITEBYTECODE, a read-only tree), which users with an
        installed package never pay, while the peers' Python (ratarmount) is compiled.
        """
        where = "import bundlefs, os; print(os.path.dirname(bundlefs.__file__))"
        r = subprocess.run(
            [sys.executable, "-c", where],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd="/",
        )
        if r.returncode != 0:
            raise SystemUnavailable(f"cannot import bundlefs: {r.stderr.strip()[-500:]}")
        package = r.stdout.strip()
        r = subprocess.run(
            [sys.executable, "-m", "compileall", "-q", package], capture_output=True, text=True
        )
        if r.returncode != 0:
            log(f"bundlefs: could not byte-compile {package}: {r.stdout.strip()[-300:]}")

    def archive_path(self, dest_dir: Path) -> Path:
        return dest_dir / "archive.bundle"

    def pack(self, src: Path, dest_dir: Path) -> PackInfo:
        bundle = self.archive_path(dest_dir)
        _remove(bundle)
        dest_dir.mkdir(parents=True, exist_ok=True)
        cmd = [*self.cli, "pack", str(src), str(bundle), "--force", "--quiet"]
        if "--jobs" in self.help["pack"]:
            # mksquashfs uses every core by default; give bundlefs the same.
            cmd += ["--jobs", str(self.jobs)]
        t0 = time.perf_counter()
        _run(cmd, env=self.env(), cwd="/")
        seconds = time.perf_counter() - t0
        index = bundle / "index" / "data.mdb"
        return PackInfo(
            bundle,
            seconds,
            _tree_bytes(bundle),
            index.stat().st_size if index.exists() else None,
            {},
        )

    def daemon_cmd(self, archive: Path, mnt: Path) -> list[str]:
        return [
            *self.cli,
            "mount",
            "--foreground",
            "--cache-size",
            self.cache_size,
            str(archive),
            str(mnt),
        ]


def _apt_ensure(binaries: dict[str, str], log: Log) -> None:
    """apt-get install the packages whose binaries are missing (we run as root)."""
    missing = sorted({pkg for exe, pkg in binaries.items() if shutil.which(exe) is None})
    if not missing:
        return
    if os.geteuid() != 0:
        raise SystemUnavailable(f"missing {missing} and not root to apt-get install them")
    log(f"apt-get install {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        _run(["apt-get", "update", "-qq"], env=env)
        _run(["apt-get", "install", "-y", "-qq", *missing], env=env)
    except subprocess.CalledProcessError as e:
        raise SystemUnavailable(f"apt-get install {missing} failed: {e.stderr[-1000:]}") from e


ALL_SYSTEMS = ("raw", "squashfuse_ll", "ratarmount", "bundlefs")


def make_system(
    name: str, workdir: Path, cache_size: str, bundlefs_source: Path | None = None
) -> System:
    if name == "raw":
        return RawDir(workdir)
    if name == "squashfuse_ll":
        return Squashfuse(workdir)
    if name == "ratarmount":
        return Ratarmount(workdir)
    if name == "bundlefs":
        return Bundlefs(workdir, cache_size=cache_size, source=bundlefs_source)
    raise ValueError(f"unknown system {name!r}; choose from {ALL_SYSTEMS}")
