"""Running real bundlefs mounts from tests: a daemon subprocess per mount, always unmounted.

The daemon runs as ``python -m bundlefs mount --foreground`` in its own process group. Readiness is
``READY=1`` on a test-owned notify socket in the abstract namespace (temporary paths can exceed the
108-byte limit of socket paths). Teardown escalates ``fusermount3 -u`` → ``-u -z`` → SIGTERM →
SIGKILL, each step bounded in time; a watchdog kills a daemon that outlives its test by far, so a
wedged mount can never hang the suite.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bundlefs.mount.table import is_mountpoint, mounts

READY_TIMEOUT = 30.0
WATCHDOG_SECONDS = 600.0
_UNEXPECTED_LOG = re.compile(r"WARNING|ERROR|CRITICAL|Traceback")


@dataclass
class Mount:
    bundle: Path
    mountpoint: Path
    process: subprocess.Popen
    log_path: Path
    notify_socket: socket.socket | None = None  # kept open: the daemon also sends STOPPING=1
    allowed_log: list[str] = field(default_factory=list)  # regexes of expected WARNING/ERROR lines

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def unexpected_log_lines(self) -> list[str]:
        allowed = [re.compile(p) for p in self.allowed_log]
        return [
            line
            for line in self.log_text().splitlines()
            if _UNEXPECTED_LOG.search(line) and not any(p.search(line) for p in allowed)
        ]


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _daemon_env(notify: str, python_path: tuple[str, ...] = ()) -> dict[str, str]:
    env = dict(os.environ)
    env["NOTIFY_SOCKET"] = notify
    # The package is imported from this checkout whatever the cwd; ``python_path`` goes first
    # (a test shadows the installed pyfuse3 with a stock build that way).
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([*python_path, root, env.get("PYTHONPATH", "")])
    return env


def wait_until(predicate, timeout: float = 10.0) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def is_mounted(path: os.PathLike | str) -> bool:
    """Whether the mount table lists ``path`` (a dead daemon's mount included); never stats it."""
    return is_mountpoint(path)


def start_mount(
    bundle: Path,
    mountpoint: Path,
    *args: str,
    log_path: Path,
    python_path: tuple[str, ...] = (),
) -> Mount:
    """Start a foreground daemon and wait until it says READY=1. Cleans up if it never does."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    name = f"bundlefs-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    log = open(log_path, "wb")  # noqa: SIM115 - handed to the daemon
    command = [sys.executable, "-m", "bundlefs", "mount", "--foreground", *args]
    command += [str(bundle), str(mountpoint)]
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_daemon_env("@" + name, python_path),
        start_new_session=True,
    )
    log.close()
    mount = Mount(bundle, mountpoint, process, log_path, sock)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"mount daemon exited with {process.returncode} before it was ready:\n"
                    + _tail(mount.log_text())
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError("mount daemon not ready in time:\n" + _tail(mount.log_text()))
            ready, _, _ = select.select([sock], [], [], min(remaining, 0.2))
            if ready and b"READY=1" in sock.recv(4096):
                break
    except BaseException:
        stop_mount(mount)
        raise
    _start_watchdog(process)
    return mount


def _start_watchdog(process: subprocess.Popen) -> None:
    def kill_if_alive() -> None:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

    timer = threading.Timer(WATCHDOG_SECONDS, kill_if_alive)
    timer.daemon = True
    timer.start()


def _run(command: list[str], timeout: float = 10.0) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def stop_mount(mount: Mount) -> int | None:
    """Unmount and reap the daemon, escalating as needed. Returns the daemon's exit code."""
    path = str(mount.mountpoint)
    steps = [
        lambda: _run(["fusermount3", "-u", path]) if is_mounted(path) else True,
        lambda: _run(["fusermount3", "-u", "-z", path]) if is_mounted(path) else True,
        lambda: os.killpg(mount.pid, signal.SIGTERM),
        lambda: os.killpg(mount.pid, signal.SIGKILL),
    ]
    for step in steps:
        if mount.process.poll() is not None and not is_mounted(path):
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            step()
        with contextlib.suppress(subprocess.TimeoutExpired):
            mount.process.wait(timeout=10)
    if is_mounted(path):
        _run(["fusermount3", "-u", "-z", path])
    with contextlib.suppress(subprocess.TimeoutExpired):
        mount.process.wait(timeout=10)
    if mount.notify_socket is not None:
        mount.notify_socket.close()
    return mount.process.returncode


@contextlib.contextmanager
def mounted(
    bundle: Path,
    mountpoint: Path,
    *args: str,
    log_path: Path,
    allowed_log: list[str] = (),
    python_path: tuple[str, ...] = (),
) -> Iterator[Mount]:
    """A mount for the duration of a ``with`` block; its log must hold no unexpected warning."""
    mount = start_mount(bundle, mountpoint, *args, log_path=log_path, python_path=python_path)
    mount.allowed_log = list(allowed_log)
    try:
        yield mount
    finally:
        stop_mount(mount)
    unexpected = mount.unexpected_log_lines()
    assert not unexpected, "unexpected lines in the daemon log:\n" + "\n".join(unexpected)


def sweep_stale_mounts(root: Path, *, live_too: bool = False) -> list[str]:
    """Lazily unmount FUSE mounts below ``root``: dead ones (ENOTCONN), or all with ``live_too``.

    Live mounts under the shared temp root may belong to another pytest session running now,
    so only this session's own directory is swept with ``live_too``.
    """
    prefix = os.path.abspath(root)
    swept = []
    targets = [m.mountpoint for m in mounts() if m.fstype.startswith("fuse")]
    for target in targets:
        if not (target == prefix or target.startswith(prefix + "/")):
            continue
        if not live_too:
            try:
                os.stat(target)
                continue  # alive: not ours to touch
            except OSError:
                pass
        _run(["fusermount3", "-u", "-z", target])
        swept.append(target)
    return swept
