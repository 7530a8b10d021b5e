"""Running real FUSE mounts from tests and from ``bench/``: a daemon subprocess per mount, always
unmounted.

Any FUSE daemon runs in the foreground in its own process group (``start_daemon``); bundlefs's is
``python -m bundlefs mount --foreground`` (``start_mount``, ``mounted``). Readiness is ``READY=1``
on a harness-owned notify socket in the abstract namespace (temporary paths can exceed the
108-byte limit of socket paths) for a daemon that speaks sd_notify, else the mount point in the
mount table and its root answering a ``stat`` within a deadline (the bench's peers). Teardown
escalates ``fusermount3 -u`` → ``-u -z`` → SIGTERM → SIGKILL, each step bounded in time; a
watchdog kills a daemon that outlives its test by far, so a wedged mount can never hang the suite.
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bundlefs.mount.table import is_mountpoint, mounts

READY_TIMEOUT = 30.0
WATCHDOG_SECONDS = 600.0
# Once mounted, a healthy daemon answers its first stat in milliseconds; a minute means hung.
READY_STAT_TIMEOUT = 60.0
_UNEXPECTED_LOG = re.compile(r"WARNING|ERROR|CRITICAL|Traceback")


@dataclass
class Mount:
    bundle: Path
    mountpoint: Path
    process: subprocess.Popen
    log_path: Path
    notify_socket: socket.socket | None = None  # kept open: the daemon also sends STOPPING=1
    allowed_log: list[str] = field(default_factory=list)  # regexes of expected WARNING/ERROR lines
    ready_seconds: float = 0.0  # from starting the daemon to its mount being ready

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
    """Start a foreground bundlefs daemon and wait until it says READY=1. Cleans up if it never
    does."""
    command = [sys.executable, "-m", "bundlefs", "mount", "--foreground", *args]
    command += [str(bundle), str(mountpoint)]
    env = _daemon_env("", python_path)
    return start_daemon(command, mountpoint, bundle=bundle, log_path=log_path, env=env)


def start_daemon(
    command: list[str],
    mountpoint: Path,
    *,
    bundle: Path,
    log_path: Path,
    env: dict[str, str] | None = None,
    notify: bool = True,
    timeout: float = READY_TIMEOUT,
    watchdog: float | None = WATCHDOG_SECONDS,
    cwd: str | None = None,
) -> Mount:
    """Start the FUSE daemon ``command`` (in the foreground) and wait until ``mountpoint`` serves
    ``bundle`` (whatever the daemon mounts: a bundle, or a peer's archive).

    ``notify``: ready is READY=1 on the socket this sets as ``NOTIFY_SOCKET``; otherwise ready is
    the mount point in the mount table answering a ``stat``. Cleans up if it is never ready;
    ``watchdog`` seconds later (None: never) a daemon still alive is killed.
    """
    mountpoint.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if env is None else env)
    sock = None
    if notify:
        name = f"bundlefs-test-{uuid.uuid4().hex}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind("\0" + name)
        env["NOTIFY_SOCKET"] = "@" + name
    log = open(log_path, "wb")  # noqa: SIM115 - handed to the daemon
    started = time.perf_counter()
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
        start_new_session=True,  # a Ctrl-C of ours must not kill it before it is unmounted
    )
    log.close()
    mount = Mount(bundle, mountpoint, process, log_path, sock)
    try:
        _wait_until_ready(mount, started + timeout)
    except BaseException:
        stop_mount(mount)
        raise
    mount.ready_seconds = time.perf_counter() - started
    if watchdog is not None:
        _start_watchdog(process, watchdog)
    return mount


def _wait_until_ready(mount: Mount, deadline: float) -> None:
    while True:
        if mount.process.poll() is not None:
            raise RuntimeError(
                f"mount daemon exited with {mount.process.returncode} before it was ready:\n"
                + _tail(mount.log_text())
            )
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise RuntimeError("mount daemon not ready in time:\n" + _tail(mount.log_text()))
        if mount.notify_socket is not None:
            ready, _, _ = select.select([mount.notify_socket], [], [], min(remaining, 0.2))
            if ready and b"READY=1" in mount.notify_socket.recv(4096):
                return
        elif is_mounted(mount.mountpoint):
            # The mount table first: a stat of the root would wait for ever on a hung daemon.
            _stat_with_deadline(mount.mountpoint, READY_STAT_TIMEOUT)
            return
        else:
            time.sleep(0.0005)


def _stat_with_deadline(path: Path, seconds: float) -> None:
    """``os.stat(path)`` that gives up after ``seconds``.

    The first request to a new mount is answered only once the daemon serves. A daemon that
    deadlocks would leave the calling thread waiting in the kernel for ever, so the stat runs in a
    helper thread; on a timeout the caller stops the daemon, which also releases that thread.
    """
    errors: list[OSError] = []

    def stat() -> None:
        try:
            os.stat(path)
        except OSError as e:
            errors.append(e)

    thread = threading.Thread(target=stat, name=f"stat {path}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise RuntimeError(f"stat of the new mount {path} did not return in {seconds:.0f}s: hung?")
    if errors:
        raise errors[0]


def _start_watchdog(process: subprocess.Popen, seconds: float) -> None:
    def kill_if_alive() -> None:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

    timer = threading.Timer(seconds, kill_if_alive)
    timer.daemon = True
    timer.start()


def _run(command: list[str], timeout: float = 10.0) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def unmount(path: os.PathLike | str) -> None:
    """Unmount ``path`` if the mount table lists it: normally first, lazily as the fallback."""
    if is_mounted(path) and not _run(["fusermount3", "-u", str(path)]) and is_mounted(path):
        _run(["fusermount3", "-u", "-z", str(path)])


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
    allowed_log: Sequence[str] = (),
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
    # The whole tail goes with it: a "Traceback" line alone does not say what raised.
    assert not unexpected, (
        "unexpected lines in the daemon log:\n"
        + "\n".join(unexpected)
        + "\n--- the log's last lines ---\n"
        + _tail(mount.log_text(), 60)
    )


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
