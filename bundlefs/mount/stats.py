"""``MountCounters``: a mount's counters, in memory every worker process of the mount shares.

A mount may be served by several worker processes (``bundlefs.mount.supervisor``), and a request
for the stats attribute reaches whichever worker the kernel hands it to; the answer must still be
the whole mount's. So the counters live in one shared anonymous mapping, made before the workers
are forked: one slot of 64-bit fields per worker, written only by that worker (no locks: a slot
has one writer, and a reader summing while a field is written sees the old or the new value),
plus a *retired* slot into which the supervisor folds the counts of a worker that died, so totals
never go backwards when a worker is replaced. A single-process mount uses the same type with one
slot.

Request and error counts are incremented where they happen. Cache figures are the worker's own
``RecordCache`` counters, copied into its slot after each read (``publish_cache``), so that a
stats request answered by another worker sees them. ``MountStats`` is one process's view: the slot
it counts into, the bounded set of damaged records it has logged, and the figures the stats
xattr, ``SIGUSR1`` and the last log line report.

May import: the standard library, ``bundlefs.read.cache``, ``bundlefs.storage``.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass

from bundlefs.read.cache import RecordCache
from bundlefs.storage.store import FailedRead

# The requests counted per operation (the names of the FUSE handlers).
REQUESTS = (
    "lookup", "getattr", "readlink", "opendir", "readdir", "releasedir", "open", "read",
    "release", "statfs", "access", "listxattr", "getxattr",
)  # fmt: skip
# Cache fields: cumulative ones are summed into the retired slot when a worker goes; the gauges
# (what the cache holds now) die with it.
_CACHE_TOTALS = ("cache_hits", "cache_misses", "cache_evictions", "bytes_decompressed")
_CACHE_GAUGES = ("cache_capacity", "cache_bytes", "cache_records")
_ERRORS = ("eio_count", "damage_eio_count", "outage_eio_count")
_IDENTITY = ("pid", "started_ns", "restarts")
FIELDS = _IDENTITY + _ERRORS + _CACHE_TOTALS + _CACHE_GAUGES + REQUESTS
_INDEX = {name: i for i, name in enumerate(FIELDS)}
_CUMULATIVE = _ERRORS + _CACHE_TOTALS + REQUESTS
_WIDTH = len(FIELDS)
_WORD = 8

REQUEST_INDEX = {name: _INDEX[name] for name in REQUESTS}
EIO = _INDEX["eio_count"]
DAMAGE_EIO = _INDEX["damage_eio_count"]
OUTAGE_EIO = _INDEX["outage_eio_count"]


class WorkerCounters:
    """One worker's slot: ``values[i]`` is the field ``FIELDS[i]``, a shared 64-bit integer."""

    def __init__(self, values: memoryview, index: int) -> None:
        self.values = values
        self.index = index

    def count(self, field: int) -> None:
        self.values[field] += 1

    def get(self, name: str) -> int:
        return int(self.values[_INDEX[name]])

    def publish_cache(self, cache: RecordCache) -> None:
        """Copy the worker's cache counters into its slot (plain int reads: no lock needed)."""
        v = self.values
        v[_INDEX["cache_capacity"]] = cache.capacity
        v[_INDEX["cache_bytes"]] = cache.size
        v[_INDEX["cache_records"]] = len(cache)
        v[_INDEX["cache_hits"]] = cache.hits
        v[_INDEX["cache_misses"]] = cache.misses
        v[_INDEX["cache_evictions"]] = cache.evictions
        v[_INDEX["bytes_decompressed"]] = cache.bytes_loaded

    def set_cache_capacity(self, capacity: int) -> None:
        self.values[_INDEX["cache_capacity"]] = capacity

    def started(self, pid: int, started_ns: int) -> None:
        self.values[_INDEX["pid"]] = pid
        self.values[_INDEX["started_ns"]] = started_ns

    def requests(self) -> dict[str, int]:
        return {name: int(self.values[i]) for name, i in REQUEST_INDEX.items()}

    def as_dict(self) -> dict[str, int]:
        return {name: int(self.values[i]) for i, name in enumerate(FIELDS)}


@dataclass(frozen=True)
class WorkerView:
    """What ``MountCounters.workers`` reports of one live worker."""

    slot: int
    pid: int
    started_ns: int
    restarts: int
    rss_bytes: int | None
    requests: int
    cache_bytes: int


class MountCounters:
    """``workers`` slots and one retired slot in a shared anonymous mapping.

    Make it before forking the workers: each child then writes into the same pages.
    """

    def __init__(self, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError("a mount has at least one worker")
        self.workers = workers
        self._map = mmap.mmap(-1, (workers + 1) * _WIDTH * _WORD)  # MAP_SHARED | MAP_ANONYMOUS
        self._values = memoryview(self._map).cast("Q")
        self._slots = [self._slot(i) for i in range(workers + 1)]

    def _slot(self, i: int) -> WorkerCounters:
        return WorkerCounters(self._values[i * _WIDTH : (i + 1) * _WIDTH], i)

    def slot(self, i: int) -> WorkerCounters:
        if not 0 <= i < self.workers:
            raise IndexError(f"no worker slot {i}")
        return self._slots[i]

    def _live(self) -> Iterator[WorkerCounters]:
        return iter(self._slots[: self.workers])

    def retire(self, i: int) -> None:
        """Fold slot ``i``'s cumulative counts into the retired slot and clear it (a worker died).

        Only the supervisor calls this, after the worker is reaped: the slot has no writer then.
        """
        slot, retired = self._slots[i], self._slots[self.workers]
        restarts = slot.get("restarts") + 1
        for name in _CUMULATIVE:
            retired.values[_INDEX[name]] += slot.values[_INDEX[name]]
        for j in range(_WIDTH):
            slot.values[j] = 0
        slot.values[_INDEX["restarts"]] = restarts

    def totals(self) -> dict[str, object]:
        """The whole mount's figures: cumulative fields summed over every worker, ever."""
        summed = dict.fromkeys(_CUMULATIVE + _CACHE_GAUGES, 0)
        for slot in self._slots:  # the retired slot holds only cumulative fields
            for name in summed:
                summed[name] += int(slot.values[_INDEX[name]])
        requests = {name: summed.pop(name) for name in REQUESTS}
        return {**summed, "requests": requests}

    def workers_view(self) -> list[WorkerView]:
        views = []
        for slot in self._live():
            pid = slot.get("pid")
            if not pid:
                continue
            views.append(
                WorkerView(
                    slot=slot.index,
                    pid=pid,
                    started_ns=slot.get("started_ns"),
                    restarts=slot.get("restarts"),
                    rss_bytes=process_rss(pid),
                    requests=sum(slot.requests().values()),
                    cache_bytes=slot.get("cache_bytes"),
                )
            )
        return views


def process_rss(pid: int) -> int | None:
    """A process's resident set size in bytes, or None if it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


_MAX_LOGGED_DAMAGE = 10_000  # distinct damaged records logged; bounded so memory stays bounded
DamageKey = tuple[
    int | None, int | None, str | None, str
]  # (shard, record, path, detail) of a damaged read


class MountStats:
    """What one serving process counts, and reports for the whole mount.

    ``counters`` is the slot this process writes (the request handlers count into it); ``shared``
    the counters every worker of the mount writes (one slot until the supervisor shares more).
    ``single_process_reason`` and ``daemon_facts`` are said by the daemon, for ``info MNT``.
    """

    def __init__(self) -> None:
        self.shared = MountCounters(1)
        self.counters = self.shared.slot(0)
        self.counters.started(os.getpid(), 0)
        self.single_process_reason = ""  # why one process serves the mount, where that applies
        self.daemon_facts: dict[str, object] = {}  # pid, start, version, log, options (daemon.py)
        self._logged_damage: set[DamageKey] = set()

    @property
    def workers(self) -> int:
        """Serving processes, as the supervisor decided."""
        return self.shared.workers

    def share(self, shared: MountCounters, slot: int | None = None) -> None:
        """Report ``shared``, the counters of every worker of the mount, and count into ``slot``
        of them (a worker, after the fork; the supervisor, which serves nothing, gives none)."""
        self.shared = shared
        if slot is not None:
            self.counters = shared.slot(slot)

    def failed_read(self, failed: FailedRead, key: DamageKey) -> bool:
        """Count a read that failed on bytes that did not arrive or were wrong; whether to log it
        as damage (the first time that record fails, up to a bound).

        An object store's outage is not damage: counted apart, once per failed read (not the
        kernel's retry of it), and named by the store in a rate-limited line of its own.
        """
        if failed is not FailedRead.DAMAGE:
            if failed is FailedRead.OUTAGE:
                self.counters.count(OUTAGE_EIO)
            return False
        self.counters.count(EIO)
        self.counters.count(DAMAGE_EIO)
        if key in self._logged_damage:
            return False
        if len(self._logged_damage) < _MAX_LOGGED_DAMAGE:
            self._logged_damage.add(key)
        return True

    def figures(self, cache: RecordCache, served: dict[str, object]) -> dict[str, object]:
        """The whole mount's figures (every worker's), with ``served``: how it is served."""
        self.counters.publish_cache(cache)
        figures = self.shared.totals()
        figures.update(served, workers=self.workers)
        figures["single_process_reason"] = self.single_process_reason
        if self.workers > 1:
            figures["worker_processes"] = [
                dataclasses.asdict(w) for w in self.shared.workers_view()
            ]
        return figures
