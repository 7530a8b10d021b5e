"""A delta pack's unchanged files whose base's entry values the builder copies, put a run at a
time: ``CopiedFiles`` (``builder.EntryBuilder._copied_run`` decides which files are those).

May import: ``bundlefs.core``, ``bundlefs.storage``, ``bundlefs.packing.options``,
``bundlefs.packing.sources.base``.
"""

from __future__ import annotations

from operator import attrgetter

from bundlefs.core import integrity
from bundlefs.packing.options import PackProgress
from bundlefs.packing.sources.base import Stat
from bundlefs.storage.index_writer import IndexWriter

_SIZE, _CTIME, _INODE = attrgetter("st_size"), attrgetter("st_ctime_ns"), attrgetter("st_ino")


class CopiedFiles:
    """A delta pack's unchanged files whose base's values ``EntryBuilder._copied_run`` copies,
    not put yet: ``values`` and ``stats``, put at once (``put``), with the source records
    ``EntryBuilder._record_source`` would put (``record``): each stat's ctime and inode, where
    the stats have a ctime (all of a run's, from a directory, or none: made up by another
    source). A call per file was ~1 µs of the ~8 µs a pack with nothing changed spends on one."""

    __slots__ = ("counts", "index", "progress", "record", "stats", "values")

    def __init__(
        self, index: IndexWriter, record: bool, counts: integrity.TreeCounts, progress: PackProgress
    ) -> None:
        self.index, self.record, self.counts, self.progress = index, record, counts, progress
        self.values: list[bytes] = []
        self.stats: list[Stat] = []

    def put(self, end: int) -> None:
        """Put the files held, the last at inode ``end - 1``, and count them; hold none."""
        values, stats = self.values, self.stats
        if not values:
            return
        ino = end - len(values)
        if self.record and hasattr(stats[0], "st_ctime_ns"):
            ctimes, inodes = list(map(_CTIME, stats)), list(map(_INODE, stats))
            self.index.put_copied_run(ino, values, ctimes, inodes)
        else:
            self.index.put_copied_run(ino, values, None, [])
        self.counts.files += len(values)
        self.counts.data_bytes += sum(map(_SIZE, stats))
        self.progress.files += len(values)
        values.clear()
        stats.clear()
