"""What a ``RemoteShardStore`` holds of its objects: the memory tier over the optional disk cache,
read as one (``HeldRanges``), with the hit counters ``bundlefs info`` shows.

May import: the standard library, ``bundlefs.storage.objectstore.{tiers, disk_cache, inflight}``.
"""

from __future__ import annotations

import threading

from bundlefs.storage.objectstore.disk_cache import DiskRecordCache
from bundlefs.storage.objectstore.inflight import Fetch
from bundlefs.storage.objectstore.tiers import MemoryTier


class HeldRanges:
    """The memory tier (``memory``) over the disk cache (``disk``, None: none). Thread-safe."""

    def __init__(self, memory: MemoryTier, disk: DiskRecordCache | None) -> None:
        self.memory, self.disk = memory, disk
        self._lock = threading.Lock()  # the counters'
        self.counts = {
            "memory_hits": 0,
            "disk_hits": 0,
            "disk_misses": 0,
            "disk_hit_bytes": 0,
            "disk_skipped_bytes": 0,
        }

    def get(self, name: str, offset: int, end: int, nowait: bool) -> bytes | None:
        """Bytes ``offset … end`` if held whole, else None (``WouldBlock``: see the disk cache)."""
        data = self.memory.get(name, offset, end)
        if data is not None:
            with self._lock:
                self.counts["memory_hits"] += 1
            return data
        if self.disk is None:
            return None
        data = self.disk.get(name, offset, end, nowait)
        with self._lock:
            if data is None:
                self.counts["disk_misses"] += 1
            else:
                self.counts["disk_hits"] += 1
                self.counts["disk_hit_bytes"] += len(data)
        return data

    def piece(self, name: str, pos: int, end: int) -> bytes:
        """Bytes from ``pos`` up to ``end`` or the end of the first held piece holding ``pos``;
        empty if none does."""
        for tier in (self.memory, self.disk):
            held = tier.find(name, pos) if tier is not None else None
            if held is not None:
                data = self.get(name, pos, min(held[1], end), False)
                if data:
                    return data
        return b""

    def find(self, name: str, pos: int) -> tuple[int, int] | None:
        """A held piece holding byte ``pos``, as (start, stop)."""
        piece = self.memory.find(name, pos)
        if piece is None and self.disk is not None:
            piece = self.disk.find(name, pos)
        return piece

    def next_start(self, name: str, pos: int) -> int | None:
        """The first held piece start at or after ``pos``."""
        starts = [self.memory.next_start(name, pos)]
        if self.disk is not None:
            starts.append(self.disk.next_start(name, pos))
        found = [s for s in starts if s is not None]
        return min(found) if found else None

    def keep(self, fetch: Fetch, full_piece: int) -> None:
        """What a GET brought: in memory, and on disk except the full-size pieces of a stream at
        full speed (``full_piece`` bytes and more), which stay in memory only. Writing them held
        a ``cat`` of 400 MB to the page cache's and the disk's pace (~110 MB/s and a third of the
        daemon's CPU here, 340 MB/s without), and a large file read through once would evict the
        records the disk cache is for. A stream's first, smaller pieces and every reader's own
        fetches are kept."""
        self.memory.put(fetch.name, fetch.start, fetch.data)
        if self.disk is None:
            return
        if fetch.read_ahead and len(fetch.data) >= full_piece:
            with self._lock:
                self.counts["disk_skipped_bytes"] += len(fetch.data)
            return
        self.disk.put(fetch.name, fetch.start, fetch.data)

    def discard(self, name: str, offset: int, end: int) -> None:
        self.memory.discard(name, offset, end)
        if self.disk is not None:
            self.disk.discard(name, offset, end)

    def forked(self) -> None:
        """In a child after ``fork()``: locks another thread held then would stay held."""
        self._lock = threading.Lock()
        self.memory = MemoryTier(self.memory.limit)
        if self.disk is not None:
            self.disk.forked()
