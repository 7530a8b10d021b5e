"""``RecordCache``: a byte-bounded, thread-safe LRU of decompressed records, with counters.

It does no I/O and knows nothing of FUSE; the reader decides what to load and when.

May import: the standard library.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CacheStats:
    capacity: int
    size: int
    entries: int
    hits: int
    misses: int
    evictions: int
    bytes_loaded: int


class RecordCache:
    """Least-recently-used records, evicted once their total size passes ``capacity`` bytes."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("cache capacity must not be negative")
        self.capacity = capacity
        self._items: OrderedDict[Hashable, bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.bytes_loaded = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size(self) -> int:
        """The bytes held now."""
        return self._size

    def resize(self, capacity: int) -> None:
        """Bound the cache to ``capacity`` bytes from now on, evicting what no longer fits."""
        if capacity < 0:
            raise ValueError("cache capacity must not be negative")
        with self._lock:
            self.capacity = capacity
            while self._size > capacity:
                _, evicted = self._items.popitem(last=False)
                self._size -= len(evicted)
                self.evictions += 1

    def __contains__(self, key: Hashable) -> bool:
        """Whether ``key`` is held, without counting a hit or a miss or refreshing it."""
        return key in self._items

    def get(self, key: Hashable, min_size: int = 0) -> bytes | None:
        """The value held for ``key``, or None; one shorter than ``min_size`` (a record's prefix
        where the caller needs more of it) counts as a miss."""
        with self._lock:
            value = self._items.get(key)
            if value is None or len(value) < min_size:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Hashable, value: bytes) -> None:
        """Hold ``value`` for ``key``. A key's values are one record, whole or a prefix of it
        (``ContentReader``): a shorter one never replaces a longer (two threads that loaded the
        same record, one only a prefix, keep the whole)."""
        with self._lock:
            self.bytes_loaded += len(value)
            if len(value) > self.capacity:
                return  # would evict everything and still not fit
            old = self._items.pop(key, None)
            if old is not None:
                if len(old) > len(value):
                    value = old
                self._size -= len(old)
            self._items[key] = value
            self._size += len(value)
            while self._size > self.capacity:
                _, evicted = self._items.popitem(last=False)
                self._size -= len(evicted)
                self.evictions += 1

    def count_loaded(self, size: int) -> None:
        """Count ``size`` bytes loaded (decompressed) but not kept: a record read straight into
        a reply (``bytes_loaded`` is the mount's ``bytes_decompressed``)."""
        with self._lock:
            self.bytes_loaded += size

    def forked(self) -> None:
        """In a child after ``fork()``: a lock another thread held then would stay held here."""
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._size = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                self.capacity,
                self._size,
                len(self._items),
                self.hits,
                self.misses,
                self.evictions,
                self.bytes_loaded,
            )
