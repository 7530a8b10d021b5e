"""``RemoteShardStore``: the ``ShardStore`` (storage/store.py) of a bundle on an object store.

It composes the parts beside it and is the wiring only. Ranged GETs go through a ``Fetcher``
(storage/objectstore/fetcher.py): each bounded by the store timeout (``--store-timeout``), quick
failures retried with backoff within it, then ``OSError(EIO)`` (the caller makes it the
``CorruptDataError`` of the record). The first GET that stalls or gives up declares an *outage*:
later GETs fail at once until a background probe is answered, with one WARNING when it starts,
one INFO when it ends, and the files whose reads failed named in a line at most every 10 s
(``failed_read``; storage/objectstore/outage.py). Fetched ranges are kept in a small memory tier
(storage/objectstore/tiers.py) and a bounded on-disk cache that survives restarts
(storage/objectstore/disk_cache.py), under ``ContentReader``'s decoded-record cache. Sequential
streams are found from the reads' positions, whatever their size, and read ahead with several
ranged GETs at once in a window that grows to 32 MiB (storage/objectstore/readahead.py); other
reads fetch only what they touch. Threads asking for bytes a GET in flight will bring wait for
it (single-flight, storage/objectstore/inflight.py). ``nowait`` answers only from the caches.

The store never checks record CRCs (``ShardSet`` does, on every record: the store declares
``partial_reads_cheap = False`` so the reader always loads whole records) and holds copies, so
a cached range failing its CRC is dropped (``discard``) and fetched again once.

May import: the standard library, ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``;
fsspec only through ``bundlefs.storage.objectstore.client``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.errors import BundleClosedError, ShardUnavailable, WouldBlock
from bundlefs.storage.location import Location
from bundlefs.storage.objectstore.client import (
    DEFAULT_STORE_TIMEOUT,
    error_reason,
    profile_of,
    remote_filesystem,
)
from bundlefs.storage.objectstore.disk_cache import (
    DEFAULT_DISK_CACHE_SIZE,
    DiskRecordCache,
    default_cache_dir,
)
from bundlefs.storage.objectstore.fetcher import ATTEMPTS, BACKOFF, PROBE_INTERVAL, Fetcher
from bundlefs.storage.objectstore.held import HeldRanges
from bundlefs.storage.objectstore.inflight import InFlight
from bundlefs.storage.objectstore.outage import FailedReads
from bundlefs.storage.objectstore.readahead import ReadAheadPolicy, ReadAheadSettings, Stream
from bundlefs.storage.objectstore.tiers import MemoryTier
from bundlefs.storage.store import FailedRead, ShardStoreBase

log = logging.getLogger(__name__)

# One GET asks for at most this much when access is sequential: large enough that per-request
# latency (~10-50 ms on S3) stops dominating, small enough that a wrong guess costs little.
DEFAULT_COALESCE = 8 * 1024 * 1024
# Fetched ranges held in memory (read-ahead pieces are mostly read right after they arrive);
# half as much again may be in flight ahead of sequential readers: the store's memory bound.
MEMORY_TIER = 64 * 1024 * 1024


# The counters of stats(), in the order ``bundlefs info`` shows them.
_COUNTERS = (
    "reads",
    "memory_hits",
    "disk_hits",
    "disk_misses",
    "disk_hit_bytes",
    "shared",
    "prefetches",
    "prefetch_bytes",
    "disk_skipped_bytes",
    "discards",
)


def _disk_cache(root: str, bundle_id: bytes, size: int) -> DiskRecordCache | None:
    """The bundle's disk cache under ``root`` (None: ``size`` 0, or it cannot be made)."""
    if size <= 0:
        return None
    try:
        return DiskRecordCache(os.path.join(root, "records"), bundle_id, size)
    except OSError as e:  # an unwritable cache is a slower bundle, not a broken one
        log.warning("%s: no disk cache (%s): records are fetched every time", root, e)
        return None


class RemoteShardStore(ShardStoreBase):
    """The shard files of a bundle on an object store (a ``ShardStore``). Thread-safe.

    ``shard_sizes`` (shard file name → size, from the index) bounds read-ahead to the object;
    ``disk_cache`` is the cache root (``default_cache_dir()`` when None); ``disk_cache_size`` 0
    keeps nothing on disk; ``coalesce`` is the largest read-ahead GET (0: no read-ahead);
    ``memory`` bounds the fetched bytes held in memory (and half of it those in flight ahead of
    readers); ``store_timeout`` bounds each fetch (``Fetcher``); ``session``: the fsspec file
    system to start with (the index's, its connection made; a child after fork makes its own).
    ``stats()`` gives the counters ``bundlefs info`` shows.
    """

    # Reading a slice of a raw record costs a round trip just as the whole record does, and only
    # a whole record can be CRC-checked: ContentReader must always load whole records.
    partial_reads_cheap = False
    # A read that misses the caches is a GET, with retries: the mount must not wait for one on
    # its event loop (a frozen store stalled every request for 80 s when it did).
    reads_may_stall = True
    # Fetched ranges are kept (memory, disk): a damaged copy is dropped and fetched again.
    holds_copies = True

    def __init__(
        self,
        location: Location,
        bundle_id: bytes,
        *,
        shard_sizes: Mapping[str, int] | None = None,
        disk_cache: str | os.PathLike[str] | None = None,
        disk_cache_size: int | None = DEFAULT_DISK_CACHE_SIZE,
        coalesce: int = DEFAULT_COALESCE,
        memory: int = MEMORY_TIER,
        attempts: int = ATTEMPTS,
        backoff: float = BACKOFF,
        filesystem: Any = None,
        store_timeout: float = DEFAULT_STORE_TIMEOUT,
        probe_interval: float = PROBE_INTERVAL,
        session: Any = None,
    ) -> None:
        self.location = location
        self._bundle_id = bundle_id
        self._sizes = dict(shard_sizes or {})
        self._attempts, self._backoff = attempts, backoff
        self._timeout, self._probe_interval = store_timeout, probe_interval
        self._filesystem = filesystem
        self._fetcher = self._new_fetcher(session)
        self._urls: dict[str, str] = {}
        size = DEFAULT_DISK_CACHE_SIZE if disk_cache_size is None else disk_cache_size
        root = self._cache_root = os.fspath(disk_cache) if disk_cache else default_cache_dir()
        disk = _disk_cache(root, bundle_id, size)
        self._held = HeldRanges(MemoryTier(memory), disk)
        settings = ReadAheadSettings(max_piece=max(1, coalesce))
        if coalesce <= 0:
            settings = dataclasses.replace(settings, max_window=0)
        self._policy = ReadAheadPolicy(
            settings.bounded(memory, disk.limit if disk is not None else None)
        )
        self._max_ahead = memory // 2  # bytes in flight ahead of readers, at most
        self._failed = FailedReads()
        self._lock = threading.Lock()
        self._inflight = self._new_inflight()
        self._closed = False
        self._counts = {"reads": 0, "discards": 0}

    def _new_inflight(self) -> InFlight:
        return InFlight(
            lambda f: self._fetcher.get(self._url(f.name), f.start, f.stop),
            lambda f: self._held.keep(f, self._policy.settings.max_piece),
            self._clip,
        )

    def _new_fetcher(self, session: Any = None) -> Fetcher:
        filesystem = self._filesystem or session
        fetcher = Fetcher(
            (lambda: filesystem) if filesystem is not None else self._new_filesystem,
            self.location.url,
            attempts=self._attempts,
            backoff=self._backoff,
            timeout=self._timeout,
            probe=True,
            probe_interval=self._probe_interval,
        )
        fetcher.on_recovered = self._outage_ended
        return fetcher

    # -- ShardStore ------------------------------------------------------------------------------

    def read(self, name: str, offset: int, length: int, *, nowait: bool = False) -> bytes:
        if self._closed:
            raise BundleClosedError("the bundle is closed")
        end = offset + length
        if length <= 0:
            return b""
        with self._lock:
            self._counts["reads"] += 1
            stream = self._policy.observe(name, offset, end)
        if stream is not None:
            # Before this read's own fetch: its bytes then come in the first piece, and the
            # pieces after it are on their way while it waits.
            self._read_ahead(name, offset, stream)
        data = self._held.get(name, offset, end, nowait)
        if data is None:
            if nowait:
                raise WouldBlock
            data = self._fetch(name, offset, end)
        return data

    def read_into(
        self, name: str, offset: int, buffer: bytearray | memoryview, *, nowait: bool = False
    ) -> int:
        data = self.read(name, offset, len(buffer), nowait=nowait)
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def prefetch(self, name: str, offset: int, length: int) -> None:
        """Start fetching these bytes in the background unless held or in flight."""
        if self._closed or length <= 0:
            return
        with contextlib.suppress(Exception):
            end = offset + length
            if self._held.memory.get(name, offset, end) is not None:
                return
            if self._held.disk is not None and self._held.disk.find(name, offset) is not None:
                return
            self._inflight.start_background(name, offset, end, read_ahead=False)

    def discard(self, name: str, offset: int, length: int) -> None:
        """Drop held copies of these bytes (they failed a record CRC): the next read fetches."""
        with self._lock:
            self._counts["discards"] += 1
        self._held.discard(name, offset, offset + length)

    def failed_read(self, path: str | None, shard: int | None, record: int | None) -> FailedRead:
        """A read of ``path`` failed because the store did not deliver its bytes: ``OUTAGE``
        (counted in ``outage_eio_count`` and named in a line at most every 10 s), or
        ``OUTAGE_RETRY`` for the same read retried by the kernel (not counted again). Decided
        by the failure, not by whether the outage is still on when the mount asks: a probe
        that ends it meanwhile must not turn the read into "damaged data"."""
        now = time.monotonic()
        with self._lock:
            counted = self._failed.note((path, shard, record), path, now)
            line = self._failed.line(now)
        if line is not None:
            log.warning("%s: %s", self.location.url, line)
        return FailedRead.OUTAGE if counted else FailedRead.OUTAGE_RETRY

    def _outage_ended(self) -> None:
        with self._lock:
            line = self._failed.flush()
        if line is not None:
            log.warning("%s: %s", self.location.url, line)

    def forked(self) -> None:
        """In a child after ``fork()``: the parent's GETs in flight never finish here, its locks
        may be held, its prober thread does not exist, and its network session belongs to its
        event loop."""
        self._lock = threading.Lock()
        self._inflight = self._new_inflight()
        self._fetcher = self._new_fetcher()
        self._held.forked()

    def close(self) -> None:
        self._closed = True
        self._fetcher.close()
        self._inflight.close()
        self._held.memory.clear()

    def _new_filesystem(self) -> Any:
        return remote_filesystem(self.location, self._timeout)

    @property
    def in_outage(self) -> bool:
        """Whether the store is in an outage (its GETs fail at once until a probe answers)."""
        return self._fetcher.outage

    @property
    def filesystem(self) -> Any:
        """The fsspec file system the store reads through."""
        return self._fetcher.fs

    def size_and_header(self, name: str, length: int) -> tuple[int, bytes]:
        """The object's size as the store says it now, and its first ``length`` bytes fetched
        now (not from a cache): what ``verify`` checks of each shard."""
        url = self._url(name)
        fs = self._fetcher.fs
        with contextlib.suppress(Exception):
            fs.invalidate_cache(url)
        try:
            size = int(fs.info(url)["size"])
            header = self._fetcher.get(url, 0, length)
        except FileNotFoundError:
            raise ShardUnavailable(errno.ENOENT, "no such object on the store", url) from None
        except OSError:
            raise
        except Exception as e:
            raise OSError(errno.EIO, error_reason(e)) from None
        return size, header

    # -- facts -------------------------------------------------------------------------------------

    def stats(self) -> dict[str, object]:
        """Counters for ``bundlefs info``: see docs/storage.md, "Reading"."""
        with self._fetcher.lock:
            fetched = dict(self._fetcher.counters)
            outage = self._fetcher.outage
        with self._lock:
            counts = {**self._counts, **self._held.counts, **self._inflight.counts}
            outage_eio = self._failed.count
        disk = self._held.disk
        return {
            "location": self.location.url,
            **fetched,
            **{key: counts[key] for key in _COUNTERS},
            "memory_bytes": self._held.memory.bytes,
            "disk_cache": self._cache_root if disk is not None else None,
            "disk_bytes": disk.bytes if disk is not None else 0,
            "disk_cache_size": disk.limit if disk is not None else 0,
            "store_timeout": self._timeout,
            "outage": outage,
            "outage_eio_count": outage_eio,
        }

    # -- inside ------------------------------------------------------------------------------------

    def _url(self, name: str) -> str:
        url = self._urls.get(name)
        if url is None:
            url = self._urls[name] = self.location.child(name)
        return url

    def _fetch(self, name: str, offset: int, end: int) -> bytes:
        """Bytes ``offset … end`` of an object that the caches do not hold whole: assembled from
        the pieces held, the GETs in flight and new GETs of only the gaps between them.

        A record often straddles the end of one read-ahead GET and the start of the next
        (pieces end on byte counts, not records). Fetching the whole record again fetched those
        bytes twice: a cold iter_files fetched 2x the stored bytes (bench.object_store).
        """
        parts: list[bytes] = []
        pos = offset
        while pos < end:
            data = self._piece(name, pos, end)
            parts.append(data)
            if not data:
                break  # the object ends here: the caller sees a short read
            pos += len(data)
        return b"".join(parts)

    def _piece(self, name: str, pos: int, end: int) -> bytes:
        """Bytes from ``pos`` up to ``end`` or the end of the first piece holding ``pos``."""
        return self._held.piece(name, pos, end) or self._inflight.piece(name, pos, end)

    def _clip(self, name: str, end: int, stop: int) -> int:
        """Where a GET needed up to ``end`` should stop, at most ``stop``: not past the object,
        nor into bytes already held (``InFlight`` adds those on their way)."""
        size = self._sizes.get(name)
        if size is not None:
            stop = min(stop, size)
        held = self._held.next_start(name, end)
        return stop if held is None else min(stop, held)

    def _covered_until(self, name: str, pos: int, limit: int) -> int:
        """How far from ``pos`` the bytes are held or on their way (up to ``limit``)."""
        while pos < limit:
            piece = self._held.find(name, pos)
            if piece is None:
                fetch = self._inflight.covering(name, pos)
                if fetch is None:
                    return pos
                piece = (fetch.start, fetch.stop)
            pos = piece[1]
        return pos

    def _read_ahead(self, name: str, offset: int, stream: Stream) -> None:
        """Keep a sequential stream's window ahead of its reader (at ``offset``) held or on its
        way: the pieces ``ReadAheadPolicy`` plans, in the background, several at once."""
        if self._fetcher.outage:
            return  # every GET would fail at once: the reader's own read reports it
        covered = self._covered_until(name, offset, offset + self._policy.settings.max_window)
        with self._lock:
            room = self._max_ahead - self._inflight.ahead
            pieces = self._policy.plan(stream, offset, covered, self._sizes.get(name), room)
        for start, stop in pieces:
            self._inflight.start_background(name, start, stop, read_ahead=True)


def list_shard_names(location: Location, fs: Any) -> list[str] | None:
    """The names of the ``shard-*`` objects at ``location`` (for ``verify``); None where the
    store cannot list (a web server)."""
    if not profile_of(location).lists:
        return None
    with contextlib.suppress(Exception):
        fs.invalidate_cache(location.path)
    names = [n.rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(location.path, detail=False)]
    return sorted(n for n in names if n.startswith(fmt.SHARD_PREFIX))
