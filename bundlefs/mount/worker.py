"""One serving process: pyfuse3's main loop (direct or under trio), its signals, its own session.

``serve`` runs the loop until the session ends (unmounted) or a stop signal arrives; it is the
whole life of a single-process mount and of each worker of a multi-worker one
(``bundlefs.mount.supervisor``). ``handshake`` runs the loop only until the kernel handshake
(FUSE_INIT) is done, which libfuse needs to have seen in the process that forks the workers.
``clone_session`` gives a forked worker its own descriptor on the mount's FUSE connection: the
kernel then ends the requests a dead worker had read (with ECONNABORTED) instead of leaving their
readers waiting forever, and a non-blocking descriptor lets the workers that lose the race for a
request go back to their loop instead of blocking in ``read()`` (the patched pyfuse3 treats
EAGAIN as "wait again"; third_party/pyfuse3/nonblocking.patch).

It is libfuse's ``fuse_loop.c`` role; no file-system semantics here (that is ``operations``).

May import: pyfuse3 and trio (only when called), ``bundlefs.mount.direct``,
``bundlefs.mount.kernel``, ``bundlefs.mount.operations`` (type only).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import struct
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from bundlefs.mount import direct
from bundlefs.mount.kernel import FUSE_DEVICE

if TYPE_CHECKING:
    from bundlefs.mount.operations import BundleOperations

log = logging.getLogger("bundlefs")

_FUSE_DEV_IOC_CLONE = 0x8004E500  # _IOR(229, 0, uint32_t), <linux/fuse.h>

# How a worker's loop ended: the session ended (the mount is gone), or a signal stopped it.
ENDED_UNMOUNTED = 0
ENDED_BY_SIGNAL = 3


def serve(
    ops: BundleOperations,
    pyfuse3: ModuleType,
    *,
    stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
    stats_signal: int | None = signal.SIGUSR1,
    blocking: bool = False,
) -> int:
    """Serve requests until the session ends or a stop signal arrives; how it ended.

    ``blocking``: receive with a blocking read (``pyfuse3.main(blocking=True)``, the patched
    build): one system call per request, and one worker woken per request instead of every
    idle one. Only where nothing but the loop itself needs the loop (no load threads); stop
    signals then end it from a plain signal handler, which the interrupted read lets run.
    Raises whatever ends pyfuse3's loop otherwise (the caller logs it).
    """
    if blocking:
        return _serve_blocking(pyfuse3, stop_signals)
    import trio

    stopped_by: list[int] = []
    watched = stop_signals + ((stats_signal,) if stats_signal is not None else ())

    async def watch_signals() -> None:
        with trio.open_signal_receiver(*watched) as signals:
            async for signum in signals:
                if signum == stats_signal:
                    log.info("stats %s", json.dumps(ops.stats(), sort_keys=True))
                    continue
                log.info("received %s, stopping", signal.Signals(signum).name)
                stopped_by.append(signum)
                pyfuse3.terminate()
                return

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_signals)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    trio.run(main)
    return ENDED_BY_SIGNAL if stopped_by else ENDED_UNMOUNTED


def _serve_blocking(pyfuse3: ModuleType, stop_signals: tuple[int, ...]) -> int:
    """``serve`` with a blocking receive: no event loop at all (``direct``), and stop signals
    end the loop from a plain handler, which the interrupted read lets run."""
    stopped_by: list[int] = []
    serving = False

    def stop(signum: int, _frame: object) -> None:
        stopped_by.append(signum)
        # Only while the loop runs: a signal may come after it ended (the supervisor stopping a
        # worker already leaving because the mount went away), when terminate() would find the
        # binding's trio back in place (and import it) or the session closed.
        if serving:
            pyfuse3.terminate()  # the session's exit flag: the loop ends after the read

    with direct.standing_in(pyfuse3):
        for signum in stop_signals:
            signal.signal(signum, stop)
        serving = True
        try:
            if not stopped_by:  # else stopped before the loop began
                direct.drive(pyfuse3)
        finally:
            serving = False
    return ENDED_BY_SIGNAL if stopped_by else ENDED_UNMOUNTED


def handshake(ops: BundleOperations, pyfuse3: ModuleType) -> bool:
    """Serve only until the kernel handshake is done; whether it was (False: the mount went).

    The loop stops at its first checkpoint after ``Operations.init``: pyfuse3 calls it while
    handling FUSE_INIT and writes the reply before the loop reaches that checkpoint. Nothing
    after the handshake is received here, so libfuse's per-thread splice pipe (made on the first
    receive after INIT) is never made in this process and never shared by a fork. With the
    patched binding no event loop runs (``direct``: trio is not even imported); a stock one
    runs pyfuse3's loop under trio and cancels it there.
    """
    done: list[bool] = []
    ops.on_ready = lambda: done.append(True)
    try:
        if supports_blocking_receive(pyfuse3):
            return direct.run_until(pyfuse3, lambda: bool(done))
        import trio

        async def main() -> None:
            with trio.CancelScope() as scope:

                def initialised() -> None:
                    done.append(True)
                    scope.cancel()

                ops.on_ready = initialised
                await pyfuse3.main()

        trio.run(main)
    finally:
        ops.on_ready = None
    return bool(done)


def after_handshake(callback: Callable[[], None]) -> Callable[[], None]:
    """An ``Operations.on_ready`` that runs ``callback`` once the handshake is complete.

    pyfuse3 calls ``on_ready`` while handling FUSE_INIT, before it replies; the kernel applies the
    reply (and its own read-ahead default) when it arrives. A task started there runs after the
    reply is written, so ``callback`` runs on a usable mount.
    """

    def on_ready() -> None:
        import trio

        async def run() -> None:
            callback()

        trio.lowlevel.spawn_system_task(run)

    return on_ready


def supports_blocking_receive(pyfuse3: ModuleType) -> bool:
    """Whether this binding's ``main`` takes ``blocking`` (third_party/pyfuse3)."""
    return "blocking" in (getattr(pyfuse3.main, "__doc__", None) or "")


def clone_session(session_fd: int, *, blocking: bool = False) -> None:
    """Replace ``session_fd``, in this process only, by a clone of its connection (made
    non-blocking unless ``blocking``: see ``serve``).

    A forked worker calls this first: the descriptor it inherited is shared with every other
    process of the mount (one open file, one queue of requests being processed).
    """
    clone = os.open(FUSE_DEVICE, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(clone, _FUSE_DEV_IOC_CLONE, struct.pack("I", session_fd))
        os.dup2(clone, session_fd, inheritable=False)
    finally:
        os.close(clone)
    os.set_blocking(session_fd, blocking)
