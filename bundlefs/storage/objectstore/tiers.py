"""Byte ranges of shard objects held in memory: ``RangeIndex`` (which pieces are held, found by
bisection), ``assemble`` (a range from held pieces) and ``MemoryTier`` (recent pieces, LRU,
bounded in bytes). ``DiskRecordCache`` (storage/objectstore/disk_cache.py) indexes its files with
the same ``RangeIndex``.

May import: the standard library.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable


class RangeIndex:
    """Which byte ranges of each shard are held: (start, length) pieces, found by bisection."""

    def __init__(self) -> None:
        self._starts: dict[str, list[int]] = {}
        self._lengths: dict[tuple[str, int], int] = {}

    def add(self, name: str, start: int, length: int) -> None:
        key = (name, start)
        if key not in self._lengths:
            bisect.insort(self._starts.setdefault(name, []), start)
        self._lengths[key] = length

    def remove(self, name: str, start: int) -> None:
        if self._lengths.pop((name, start), None) is None:
            return
        starts = self._starts[name]
        del starts[bisect.bisect_left(starts, start)]

    def length(self, name: str, start: int) -> int | None:
        return self._lengths.get((name, start))

    def find(self, name: str, pos: int) -> tuple[int, int] | None:
        """A piece holding byte ``pos``, as (start, stop)."""
        starts = self._starts.get(name)
        if not starts:
            return None
        i = bisect.bisect_right(starts, pos)
        # Pieces may overlap (a record fetched alone, then a window around it): look back a few.
        for j in range(i - 1, max(-1, i - 17), -1):
            start = starts[j]
            stop = start + self._lengths[(name, start)]
            if stop > pos:
                return start, stop
        return None

    def next_start(self, name: str, pos: int) -> int | None:
        """The first piece start at or after ``pos``."""
        starts = self._starts.get(name)
        if not starts:
            return None
        i = bisect.bisect_left(starts, pos)
        return starts[i] if i < len(starts) else None

    def overlapping(self, name: str, offset: int, end: int) -> list[int]:
        starts = self._starts.get(name, [])
        hi = bisect.bisect_left(starts, end)
        return [s for s in starts[max(0, hi - 17) : hi] if s + self._lengths[(name, s)] > offset]


def assemble(
    index: RangeIndex, name: str, offset: int, end: int, read: Callable[[int, int, int], bytes]
) -> bytes | None:
    """Bytes ``offset … end`` from held pieces (``read(piece_start, from, to)``), or None."""
    piece = index.find(name, offset)
    if piece is None:
        return None
    if piece[1] >= end:
        return read(piece[0], offset, end)
    parts, pos = [], offset
    while pos < end:
        piece = index.find(name, pos)
        if piece is None:
            return None
        stop = min(end, piece[1])
        parts.append(read(piece[0], pos, stop))
        pos = stop
    return b"".join(parts)


class LockedRanges:
    """The lookups of a tier whose ``RangeIndex`` (``index``) is guarded by ``_lock``."""

    index: RangeIndex
    _lock: threading.Lock

    def find(self, name: str, pos: int) -> tuple[int, int] | None:
        with self._lock:
            return self.index.find(name, pos)

    def next_start(self, name: str, pos: int) -> int | None:
        with self._lock:
            return self.index.next_start(name, pos)


class MemoryTier(LockedRanges):
    """Recently fetched ranges in memory, LRU, bounded in bytes: a coalesced window is mostly
    read right after it arrives, and this avoids a file read for each of its records."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._data: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self.index = RangeIndex()
        self._lock = threading.Lock()

    def get(self, name: str, offset: int, end: int) -> bytes | None:
        def read(start: int, lo: int, hi: int) -> bytes:
            data = self._data[(name, start)]
            self._data.move_to_end((name, start))
            return data if lo == start and hi - lo == len(data) else data[lo - start : hi - start]

        with self._lock:
            return assemble(self.index, name, offset, end, read)

    def put(self, name: str, start: int, data: bytes) -> None:
        if len(data) > self.limit or not data:
            return
        with self._lock:
            old = self._data.pop((name, start), None)
            if old is not None:
                self.bytes -= len(old)
            self._data[(name, start)] = data
            self.index.add(name, start, len(data))
            self.bytes += len(data)
            while self.bytes > self.limit:
                (old_name, old_start), old = self._data.popitem(last=False)
                self.index.remove(old_name, old_start)
                self.bytes -= len(old)

    def discard(self, name: str, offset: int, end: int) -> None:
        with self._lock:
            for start in self.index.overlapping(name, offset, end):
                self.bytes -= len(self._data.pop((name, start)))
                self.index.remove(name, start)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.index = RangeIndex()
            self.bytes = 0
