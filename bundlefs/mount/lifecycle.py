"""How the daemon leaves its terminal and says it is ready: the readiness pipe, becoming a daemon,
systemd's notify socket. libfuse's ``fuse_daemonize.c`` role.

In daemon mode the mounting process forks once the mount exists; the child becomes the daemon,
and the parent exits 0 only when the child reports that the kernel handshake happened, so a
script can use the mount on its very next line. Under systemd (``Type=notify``) the daemon also
sends ``READY=1`` then, and ``STOPPING=1`` as it unmounts.

May import: the standard library.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal

log = logging.getLogger("bundlefs")

READY_TIMEOUT = 60.0


class Readiness:
    """The word "ready" from the daemon to whoever waits: the parent it detached from, systemd."""

    def __init__(self) -> None:
        self._write: int | None = None  # the pipe to the waiting parent, once detached

    def detach(self) -> None:
        """Fork: the parent waits for the child's word and exits with it; the child, back from
        here, is the daemon (a new session, in /, with its standard streams on /dev/null)."""
        ready_read, ready_write = os.pipe()
        pid = os.fork()
        if pid:
            os.close(ready_write)
            # The parent must not unmount or close anything the child now owns.
            os._exit(_wait_for_child(ready_read, pid))
        os.close(ready_read)
        self._write = ready_write
        _become_daemon()

    def ready(self, status: str) -> None:
        """Tell the parent (if detached) and systemd (if it started us) that the mount serves."""
        if self._write is not None:
            with contextlib.suppress(OSError):  # the parent is gone (interrupted): serve on
                os.write(self._write, b"1")
            os.close(self._write)
            self._write = None
        notify_systemd(f"READY=1\nSTATUS={status}")


def _wait_for_child(ready_read: int, pid: int) -> int:
    ready, _, _ = select.select([ready_read], [], [], READY_TIMEOUT)
    if ready and os.read(ready_read, 1) == b"1":
        return 0
    log.error("the mount daemon did not become ready (see its log)")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    return 1


def _become_daemon() -> None:
    os.setsid()
    os.chdir("/")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def notify_systemd(message: str) -> None:
    """Send ``message`` to systemd's notify socket, if we were started with one."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    import socket  # here: ~4 ms of imports only under systemd

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as e:
        log.warning("could not notify systemd: %s", e)
