"""``Supervisor``: several worker processes serving one mount, started, replaced and stopped.

One Python process serves FUSE requests on one core; a cold file costs it two requests of Python
CPU, so readers in parallel (a DataLoader's workers, ``cp -r``) wait on that core. The mount's
state is the immutable bundle and no per-file state (inode = handle, no ``open`` under no_open),
so any process can answer any request. After the kernel handshake, the supervisor forks
``workers`` processes; each clones the FUSE session onto a descriptor of its own
(``worker.clone_session``) and runs the ordinary loop (``worker.serve``). The kernel hands each
request to one of them.

The supervisor itself runs no event loop, starts no thread and reads nothing of the bundle after
the fork (a fork of a threaded process could inherit a held lock): it waits for signals. It
replaces a worker that dies (the kernel ends the requests that worker had read with
ECONNABORTED, so no reader hangs), fans a stop signal out to every worker, and performs the one
unmount. Workers stop with it (``PR_SET_PDEATHSIG``) and unmount, so none outlives the mount.
Counters are in shared memory (``stats.MountCounters``), so any worker answers the stats
attribute for all.

It is libfuse's ``fuse_loop_mt.c`` role (with ``clone_fd``), in processes rather than threads.

May import: ``bundlefs.core``, ``bundlefs.mount.stats``, ``bundlefs.mount.tuning``,
``bundlefs.mount.worker``, ``bundlefs.mount.operations`` (type only).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from bundlefs.core.libc import set_parent_death_signal
from bundlefs.mount import tuning, worker
from bundlefs.mount.stats import MountCounters

if TYPE_CHECKING:
    from bundlefs.mount.operations import BundleOperations

log = logging.getLogger("bundlefs")

_SIGNALS = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1}
# SIGALRM is the supervisor's own timer: how a wait for the signals above times out.
_WAITED = _SIGNALS | {signal.SIGALRM}
IDLE_WAIT = 5.0  # seconds the supervisor waits for a signal before looking at the clock again
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
STOP_GRACE = 10.0  # seconds a stopping worker gets to finish its requests before SIGKILL
# A worker that keeps dying is a bug or a broken machine, not bad luck: after this many deaths
# within the window the mount stops instead of restarting forever.
RESTART_LIMIT = 10
RESTART_WINDOW = 60.0


def _wait_for_signal(timeout: float) -> int | None:
    """The next of ``_SIGNALS`` to arrive (they are blocked) within ``timeout`` seconds, or None.

    Not ``signal.sigtimedwait``: where its wait is interrupted (EINTR: the process stopped and
    continued, as by Ctrl-Z, a cgroup freeze, or a debugger, strace or py-spy attaching) and the
    time is up by then, CPython 3.11 returns a siginfo it never filled in. Seen: si_signo 1
    (SIGHUP: the supervisor stopped the mount) and 43126496 (it failed, and the mount with it).
    Here a one-shot timer's SIGALRM is the timeout, and ``sigwaitinfo`` retries an interrupted
    wait by itself (PEP 475). A SIGALRM still pending from an earlier timer only ends one wait
    early.
    """
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        signo = signal.sigwaitinfo(_WAITED).si_signo
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return None if signo == signal.SIGALRM else signo


class Supervisor:
    """``workers`` processes serving ``ops`` until the mount ends; ``run`` returns the exit code.

    ``worker_setup(slot)`` runs in each new worker before it serves (e.g. the index-residency
    thread in worker 0).
    """

    def __init__(
        self,
        ops: BundleOperations,
        pyfuse3: ModuleType,
        workers: int,
        *,
        cache_size: int,
        worker_setup: Callable[[int], None] | None = None,
        auto_unmount: bool = True,
    ) -> None:
        self.ops = ops
        self.pyfuse3 = pyfuse3
        self.counters = MountCounters(workers)
        # The supervisor's own stats (SIGUSR1, the last log line) are the workers' totals.
        ops.mount_stats.share(self.counters)
        self.cache_size = cache_size
        self.worker_setup = worker_setup
        self.auto_unmount = auto_unmount  # False: leave a dead supervisor's mount (debugging)
        self._children: dict[int, int] = {}  # pid -> slot
        self._deaths: collections.deque[float] = collections.deque()
        self._stopping = False
        self._stop_deadline = 0.0
        self._exit_code = 0

    @property
    def pids(self) -> list[int]:
        return sorted(self._children)

    def run(self, on_started: Callable[[], None]) -> int:
        """Fork the workers, call ``on_started`` (readiness), then supervise until the end."""
        signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)
        for slot in range(self.counters.workers):
            self._start(slot)
        log.info(
            "serving with %d worker processes (pids %s)",
            self.counters.workers,
            " ".join(map(str, self.pids)),
        )
        on_started()
        while self._children:
            timeout = (
                max(0.05, self._stop_deadline - time.monotonic()) if self._stopping else IDLE_WAIT
            )
            signo = _wait_for_signal(timeout)
            if self._stopping and time.monotonic() >= self._stop_deadline:
                self._kill_all(signal.SIGKILL)  # after any wake: signals may come faster
            if signo is None:
                continue
            if signo == signal.SIGCHLD:
                self._reap()
            elif signo == signal.SIGUSR1:
                log.info("stats %s", json.dumps(self.ops.stats(), sort_keys=True))
            else:
                self.stop(f"received {signal.Signals(signo).name}")
        return self._exit_code

    def stop(self, reason: str, code: int = 0) -> None:
        """Ask every worker to finish (SIGTERM); SIGKILL what is left after ``STOP_GRACE``."""
        if self._stopping:
            return
        log.info("%s, stopping %d worker processes", reason, len(self._children))
        self._stopping = True
        self._exit_code = code
        self._stop_deadline = time.monotonic() + STOP_GRACE
        self._kill_all(signal.SIGTERM)

    def _kill_all(self, signum: int) -> None:
        for pid in self._children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _reap(self) -> None:
        while self._children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self._children.clear()
                return
            if pid == 0:
                return
            slot = self._children.pop(pid, None)
            if slot is None:
                continue  # not a worker (a helper a library started): nothing to do
            self._worker_ended(pid, slot, status)

    def _worker_ended(self, pid: int, slot: int, status: int) -> None:
        code = os.waitstatus_to_exitcode(status)
        if self._stopping:
            return
        if code == worker.ENDED_UNMOUNTED:
            self.stop("the file system was unmounted")
            return
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
        now = time.monotonic()
        self._deaths.append(now)
        while self._deaths and self._deaths[0] < now - RESTART_WINDOW:
            self._deaths.popleft()
        self.counters.retire(slot)
        if len(self._deaths) > RESTART_LIMIT:
            log.error(
                "worker %d (pid %d) %s; %d workers died within %.0f s, giving up",
                slot, pid, how, len(self._deaths), RESTART_WINDOW,
            )  # fmt: skip
            self.stop("too many worker deaths", code=1)
            return
        new = self._start(slot)
        log.warning("worker %d (pid %d) %s; replaced by pid %d", slot, pid, how, new)

    def _start(self, slot: int) -> int:
        supervisor = os.getpid()
        pid = os.fork()
        if pid:
            self._children[pid] = slot
            # Said here too, so a stats request served before the worker starts sees it whole.
            counters = self.counters.slot(slot)
            counters.started(pid, time.time_ns())
            counters.set_cache_capacity(self.cache_size // self.counters.workers)
            return pid
        code = 1
        try:
            code = self._serve_as_worker(slot, supervisor)
        except BaseException:
            log.exception("worker %d failed", slot)
        finally:
            try:
                logging.shutdown()  # flush the log; then leave without the parent's exit handlers
            finally:
                os._exit(code)  # whatever happens: a worker must never run the supervisor's code

    def _serve_as_worker(self, slot: int, supervisor: int) -> int:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _WAITED)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: the supervisor decides
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # stats: the supervisor reports the sum
        # SIGTERM, not SIGKILL: a worker whose supervisor was killed unmounts (below) instead of
        # leaving it to fusermount3's auto_unmount helper, which decides from whether the mount
        # is dead when the last daemon process's socket closes, and that races the kernel's
        # release of the other FUSE descriptors (seen: 1 kill in 6 left the mount, 2 cores busy).
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != supervisor:
            return 1  # the supervisor died before the line above: nobody to serve for
        # Loads inline (no threads reporting back to the loop): receive with a blocking read.
        blocking = self.ops.loads_inline and worker.supports_blocking_receive(self.pyfuse3)
        worker.clone_session(self.pyfuse3.get_session_fd(), blocking=blocking)
        if self.ops.loads_inline:
            tuning.reuse_freed_buffers()
        counters = self.counters.slot(slot)
        counters.started(os.getpid(), time.time_ns())
        self.ops.mount_stats.share(self.counters, slot)
        self.ops.bundle.cache.resize(self.cache_size // self.counters.workers)
        counters.publish_cache(self.ops.bundle.cache)
        if self.worker_setup is not None:
            self.worker_setup(slot)
        ended = worker.serve(
            self.ops,
            self.pyfuse3,
            stop_signals=(signal.SIGTERM,),
            stats_signal=None,
            blocking=blocking,
        )
        if os.getppid() != supervisor and self.auto_unmount:
            log.warning("worker %d: the supervisor died; unmounting", slot)
            self.pyfuse3.close(unmount=True)  # lazy for root, fusermount3 -u -z otherwise
        return ended
