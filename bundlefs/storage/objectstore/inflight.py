"""The GETs of a ``RemoteShardStore`` on their way, and the threads that send the background ones.

Single-flight: a reader of bytes that a GET in flight will bring waits for it instead of sending
its own. Background GETs (read-ahead pieces, prefetches) run on a small pool; ``close`` cancels
the pieces not started yet, and their waiters wake with ``EIO`` instead of waiting for ever.

May import: the standard library, ``bundlefs.errors``.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from bundlefs.errors import ShardUnavailable

log = logging.getLogger(__name__)

READ_AHEAD_THREADS = 4  # read-ahead GETs at once: a stream's window is ~4 pieces

# Where a GET that needs bytes up to ``end`` may stop, at most ``stop``, given what is held.
Clip = Callable[[str, int, int], int]


class Fetch:
    """One GET in flight: readers of bytes inside it wait for it instead of sending their own."""

    __slots__ = ("name", "start", "stop", "done", "data", "error", "background", "read_ahead")

    def __init__(self, name: str, start: int, stop: int, background: bool = False) -> None:
        self.name, self.start, self.stop = name, start, stop
        self.done = threading.Event()
        self.data = b""
        self.error: OSError | None = None
        self.background = background  # counted in the bytes in flight ahead
        self.read_ahead = False  # a sequential stream's piece: kept in memory only

    def slice(self, offset: int, end: int) -> bytes:
        error = self.error
        if isinstance(error, ShardUnavailable):  # a missing object stays one (storage/store.py)
            raise ShardUnavailable(error.errno, error.strerror, error.filename)
        if error is not None:
            # A copy for each waiter: one exception raised in several threads shares a traceback.
            raise OSError(error.errno, error.strerror, *error.args[2:])
        data = self.data
        if offset == self.start and end - offset >= len(data):
            return data
        return data[offset - self.start : end - self.start]


class InFlight:
    """The GETs on their way, by object. Thread-safe.

    ``get`` does one GET (the store's ``Fetcher``); ``arrived`` keeps what it brought (the
    store's tiers); ``clip`` says where a new GET should stop so as not to fetch bytes already
    held (this registry adds the bytes already on their way).
    """

    def __init__(
        self, get: Callable[[Fetch], bytes], arrived: Callable[[Fetch], None], clip: Clip
    ) -> None:
        self._get, self._arrived, self._held_clip = get, arrived, clip
        self._lock = threading.Lock()
        self._fetches: dict[str, list[Fetch]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self.ahead = 0  # bytes of background GETs in flight
        self.counts = {"shared": 0, "prefetches": 0, "prefetch_bytes": 0}

    def covering(self, name: str, pos: int) -> Fetch | None:
        """The GET in flight that brings byte ``pos`` of ``name``, if any."""
        with self._lock:
            return self._covering(name, pos, pos + 1)

    def piece(self, name: str, pos: int, end: int) -> bytes:
        """Bytes from ``pos`` up to ``end`` or the end of the GET that brings ``pos``: one in
        flight (waited for), else a new one of only the gap up to the next bytes held or on
        their way (a read that is part of no stream fetches what it touches, nothing more)."""
        with self._lock:
            fetch = self._covering(name, pos, pos + 1)
            if fetch is not None:
                self.counts["shared"] += 1
                mine = False
            else:
                fetch = self._register(name, pos, self._clip(name, pos + 1, end))
                mine = True
        if mine:
            self._run(fetch)
        else:
            fetch.done.wait()
        return fetch.slice(pos, min(end, fetch.stop))

    def start_background(self, name: str, start: int, stop: int, *, read_ahead: bool) -> None:
        """Start a GET of ``start … stop`` on the pool, unless it is on its way or held."""
        with self._lock:
            if self._closed or self._covering(name, start, start + 1) is not None:
                return
            # Not into bytes another thread's plan has put on their way meanwhile.
            stop = self._clip(name, start + 1, stop)
            if stop <= start:
                return
            fetch = self._register(name, start, stop, background=True)
            fetch.read_ahead = read_ahead
            self.counts["prefetches"] += 1
            self.counts["prefetch_bytes"] += stop - start
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    READ_AHEAD_THREADS, thread_name_prefix="bundlefs-fetch"
                )
            pool = self._pool
        try:
            future = pool.submit(self._run, fetch)
        except RuntimeError:  # closed meanwhile
            self._abandon(fetch)
            return
        # close() cancels the pieces not yet started: their waiters must wake, not wait for ever.
        future.add_done_callback(lambda f: self._abandon(fetch) if f.cancelled() else None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    # -- inside (callers of the underscored ones hold the lock) ---------------------------------

    def _covering(self, name: str, offset: int, end: int) -> Fetch | None:
        for fetch in self._fetches.get(name, ()):
            if fetch.start <= offset and end <= fetch.stop:
                return fetch
        return None

    def _clip(self, name: str, end: int, stop: int) -> int:
        """Where a GET needed up to ``end`` should stop, at most ``stop``: not into bytes held
        (``clip``) or on their way."""
        stop = self._held_clip(name, end, stop)
        on_way = [f.start for f in self._fetches.get(name, ()) if f.start >= end]
        return min([stop, *on_way])

    def _register(self, name: str, start: int, stop: int, background: bool = False) -> Fetch:
        fetch = Fetch(name, start, stop, background)
        self._fetches.setdefault(name, []).append(fetch)
        if background:
            self.ahead += stop - start
        return fetch

    def _unregister(self, fetch: Fetch) -> None:
        with self._lock:
            fetches = self._fetches.get(fetch.name, [])
            if fetch in fetches:
                fetches.remove(fetch)
                if fetch.background:
                    self.ahead -= fetch.stop - fetch.start

    def _run(self, fetch: Fetch) -> None:
        """Do the GET of ``fetch``, keep the bytes, and wake its waiters (even on failure)."""
        # Whatever happens, the waiters wake and the fetch leaves the list: a GET that died of
        # anything else (a back-end's ValueError, KeyboardInterrupt) once left every later
        # reader of its bytes waiting for ever.
        try:
            fetch.data = self._get(fetch)
            log.debug(
                "GET %s %d+%d (%s)",
                fetch.name,
                fetch.start,
                fetch.stop - fetch.start,
                "ahead" if fetch.background else "read",
            )
            if fetch.data:
                self._arrived(fetch)
        except FileNotFoundError as e:
            fetch.error = ShardUnavailable(errno.ENOENT, "no such object on the store", e.filename)
        except OSError as e:
            fetch.error = e
        except BaseException as e:
            fetch.error = OSError(errno.EIO, f"the fetch failed: {e!r}")
            raise
        finally:
            self._unregister(fetch)
            fetch.done.set()

    def _abandon(self, fetch: Fetch) -> None:
        """A background fetch that will never run (the store closed): fail its waiters."""
        fetch.error = OSError(errno.EIO, "the bundle was closed")
        self._unregister(fetch)
        fetch.done.set()
