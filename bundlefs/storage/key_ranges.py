"""``KeyRanges``: the key ranges of one LMDB database whose leaves ``IndexPageGuard`` has checked
for cursor scans (storage/index_guard.py), so that a scan inside one costs a bisect instead of a
walk. (Lookups by key ask the pages themselves: ``CheckedPaths``, _native.pyx.)

May import: ``bundlefs.storage.native``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from bundlefs.storage import native

END = native.END  # above every LMDB key (at most 511 bytes): the end of a database
_MAX_RANGES = 8_192  # per database; past it the ranges are forgotten (walked again when needed)


class KeyRanges:
    """Disjoint half-open byte-string ranges ``[lo, hi)``, sorted; ``hi == END``: no end.

    Read without a lock: ``add`` builds new lists and replaces ``pairs`` in one assignment, so
    a reader sees the ranges before or after it, never a mix. Lookups that hit (nearly all of
    them) cost a bisect: ~0.5 µs where a held lock and two lists cost twice that. ``add`` copies
    the lists (46 µs at 8,192 ranges): fine for scans, a few per directory listed."""

    def __init__(self) -> None:
        self.pairs: tuple[list[bytes], list[bytes]] = ([], [])

    @property
    def starts(self) -> list[bytes]:
        return self.pairs[0]

    @property
    def ends(self) -> list[bytes]:
        return self.pairs[1]

    def covers(self, lo: bytes, hi: bytes) -> bool:
        """Whether one range holds every key from ``lo`` to ``hi`` (both included)."""
        starts, ends = self.pairs
        i = bisect_right(starts, lo) - 1
        return i >= 0 and (hi < ends[i] or ends[i] == END)

    def add(self, lo: bytes, hi: bytes) -> None:
        """Add ``[lo, hi)``, joined with every range it overlaps or touches (callers hold the
        guard's lock: one writer at a time)."""
        starts, ends = self.pairs
        if len(starts) >= _MAX_RANGES:
            starts, ends = [], []
        first = bisect_left(ends, lo)
        last = bisect_right(starts, hi)
        if first < last:
            lo, hi = min(lo, starts[first]), max(hi, ends[last - 1])
        self.pairs = (starts[:first] + [lo] + starts[last:], ends[:first] + [hi] + ends[last:])
