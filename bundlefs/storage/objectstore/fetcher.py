"""``Fetcher``: GETs of an object store with retries and backoff, counters, and the store's
outage state (one WARNING when an outage starts, one INFO when it ends, a background probe
while it lasts). The reader's ``RemoteShardStore``, the index fetch and the listing all fetch
through one; the file system it uses comes from the client (storage/objectstore/client.py).

May import: the standard library, ``bundlefs.storage.objectstore.client``.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from bundlefs.storage.objectstore.client import (
    DEFAULT_STORE_TIMEOUT,
    error_reason,
    is_denied,
    is_fatal,
    is_stall,
)

log = logging.getLogger(__name__)

# Retries of quick failures: up to 4 attempts, 0.2 + 0.4 + 0.8 s apart, all within the store
# timeout; a stalled attempt is not retried (Fetcher).
ATTEMPTS = 4
BACKOFF = 0.2
BACKOFF_MAX = 2.0
# Later GETs of an outage fail at once until a probe, one per PROBE_INTERVAL, is answered.
PROBE_INTERVAL = 2.0


class Fetcher:
    """Ranged GETs with retries and backoff, counters, and the store's outage state.

    Every GET is bounded by ``timeout`` (the store timeout, ``--store-timeout``): retries of
    quick failures (a refused connection, a 503) stop when the next one would start past it,
    and an attempt that stalls for the whole timeout (a store that accepts connections and
    never answers) is not retried. Either way the store is then *in an outage*: every later
    GET fails at once, without touching the network, until a background probe (one small GET
    every ``probe_interval`` seconds, with ``probe=True``) is answered. So a hung store costs
    the first reader one timeout, and every other uncached read (the kernel's retry of a failed
    read-ahead among them) fails in a moment instead of waiting its own timeout. One WARNING
    when an outage starts, one INFO when it ends.
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        label: str,
        *,
        attempts: int = ATTEMPTS,
        backoff: float = BACKOFF,
        log_outages: bool = True,
        timeout: float = DEFAULT_STORE_TIMEOUT,
        probe: bool = False,
        probe_interval: float = PROBE_INTERVAL,
    ) -> None:
        # Made on first use: after a fork the child must not touch the parent's network session,
        # and fsspec resets its event loop in the child only after our at-fork hook has run.
        self._factory = factory
        self._fs: Any = None
        self.label = label  # the bundle's URL, for the log
        # Off while a bundle is opened: a failed open is its own sentence, and a warning that
        # reads "fail with EIO until it is back" describes a bundle that is open and serving.
        self.log_outages = log_outages
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.timeout = timeout
        self.probe = probe
        self.probe_interval = probe_interval
        self.lock = threading.Lock()
        self.counters = {
            "requests": 0,
            "bytes_fetched": 0,
            "retries": 0,
            "failures": 0,
            "failed_fast": 0,
            "probes": 0,
        }
        self.outage = False
        self.outage_since = 0.0  # time.monotonic() of the outage's start
        self._outage_url = ""
        self._failed_during_outage = 0
        self._closed = threading.Event()
        # Called (outside the lock) when an outage ends, e.g. to log what is still unreported.
        self.on_recovered: Callable[[], None] | None = None

    @property
    def fs(self) -> Any:
        if self._fs is None:
            with self.lock:
                if self._fs is None:
                    self._fs = self._factory()
        return self._fs

    def close(self) -> None:
        self._closed.set()

    def get(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``start … end`` of ``url`` (all of it without a range); short past the end.

        Raises ``FileNotFoundError`` (no such object), ``PermissionError`` (refused) or
        ``OSError(EIO)`` naming the reason: after the retry bound, or at once in an outage of
        a probed store.
        """
        where = f"bytes {start}-{end} of {url}" if start is not None else url
        if self.outage and self.probe:
            raise self._failed_fast(where)
        first = time.monotonic()
        deadline = first + self.timeout
        last: Exception | None = None
        attempt = 0
        while True:
            if attempt:
                pause = min(self.backoff * 2 ** (attempt - 1), BACKOFF_MAX)
                if time.monotonic() + pause >= deadline:
                    break  # the next attempt would start past the store timeout
                time.sleep(pause)
                self._count("retries")
            attempt += 1
            self._count("requests")
            began = time.monotonic()
            try:
                data = self.fs.cat_file(url, start=start, end=end)
            except OSError as e:
                if e.errno == errno.EINVAL and start is not None and "range" in str(e).lower():
                    self._recovered()
                    return b""  # the range starts past the end: the object is shorter
                if is_fatal(e):
                    raise
                last = e
            except Exception as e:
                if is_denied(e):
                    raise PermissionError(errno.EACCES, error_reason(e)) from None
                if is_fatal(e):
                    raise
                last = e
            else:
                self._count("bytes_fetched", len(data))
                self._recovered()
                return bytes(data)
            # A stall is not retried: another wait as long would double the reader's.
            if is_stall(last, time.monotonic() - began, self.timeout):
                break
            if attempt >= self.attempts or self.outage:
                break
        assert last is not None
        self._gave_up(url, last, first)
        raise OSError(
            errno.EIO,
            f"cannot fetch {where} after {attempt} attempt(s): {error_reason(last)}",
        )

    def _failed_fast(self, where: str) -> OSError:
        """The error of a GET not sent because the store is in an outage (counted)."""
        with self.lock:
            self.counters["failed_fast"] += 1
            self._failed_during_outage += 1
        return OSError(
            errno.EIO,
            f"cannot fetch {where}: the object store has not answered for "
            f"{time.monotonic() - self.outage_since:.0f} s (outage; not retried until it "
            "answers again)",
        )

    def _count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counters[key] += n

    def _gave_up(self, url: str, e: Exception, since: float) -> None:
        with self.lock:
            self.counters["failures"] += 1
            if self._closed.is_set():
                return  # a read-ahead still in flight when its reader closed: nobody to tell
            if self.outage:
                self._failed_during_outage += 1
                return
            self.outage = True
            self.outage_since = since  # when the fetch that found it began
            self._outage_url = url
            self._failed_during_outage = 1
        if self.probe:
            threading.Thread(target=self._probe_loop, name="bundlefs-probe", daemon=True).start()
        if not self.log_outages:
            return
        until = (
            f"at once until it answers again (checked every {self.probe_interval:g} s)"
            if self.probe
            else "until it is back"
        )
        log.warning(
            "%s: the object store is unreachable (%s); reads of records not cached fail with "
            "EIO %s",
            self.label,
            error_reason(e),
            until,
        )

    def _probe_loop(self) -> None:
        """One small GET per interval until one is answered (the outage then ends)."""
        url = self._outage_url
        # Until the outage ends, by this probe or by any other GET that is answered (a later
        # outage starts a prober of its own).
        while self.outage and not self._closed.wait(self.probe_interval):
            self._count("probes")
            try:
                self.fs.cat_file(url, start=0, end=1)
            except Exception as e:
                # An answer, even "no such object" or "denied", is a store that answers.
                if not (is_fatal(e) or isinstance(e, PermissionError)):
                    continue
            self._recovered()
            return

    def _recovered(self) -> None:
        if self.outage:  # an unlocked peek: the common case costs nothing
            self._end_outage()

    def _end_outage(self) -> None:
        with self.lock:
            if not self.outage:
                return  # another thread ended it
            self.outage = False
            failed = self._failed_during_outage
            seconds = time.monotonic() - self.outage_since
        if self.on_recovered is not None:
            self.on_recovered()
        if self.log_outages:
            log.info(
                "%s: the object store answers again after %.0f s (%d fetches failed)",
                self.label,
                seconds,
                failed,
            )
