"""The entries of one partition of a directory tree: ``PartitionSource``.

Each partition packs to a complete, valid partial bundle: its range of the tree plus the
directories above it, with their real attributes, so the partial bundles agree on every directory
they share and the merge joins them.

May import: ``bundlefs.packing.sources.base``, ``bundlefs.packing.distributed`` (``cutter``,
``plan``).
"""

from __future__ import annotations

import stat as statmod
from collections.abc import Iterator
from concurrent.futures import Executor

from bundlefs.packing.distributed.cutter import Key, key_of
from bundlefs.packing.distributed.plan import Partition
from bundlefs.packing.sources.base import Content, SourceErrors, SourceItem
from bundlefs.packing.sources.directory import DirectorySource


class PartitionSource:
    """The entries of one ``Partition`` of a directory tree, with every directory above them.

    An ``EntrySource`` over a ``DirectorySource``: each directory it is asked for is listed, and
    only the names that are in the range (or lead to it, or are moved in) are probed and read, so
    a directory split between partitions is read once in all. Directories above the range are
    delivered with their real attributes: the partial bundles agree on every directory they
    share. Memory: that of a ``DirectorySource`` (one directory's names and the read-ahead
    window) plus the partition's moved names.
    """

    def __init__(
        self,
        root: str,
        partition: Partition,
        errors: SourceErrors,
        *,
        excludes: tuple[str, ...] = (),
        pool: Executor | None = None,
    ) -> None:
        self.errors = errors  # shared with the pack: what is skipped is in its summary
        self._inner = DirectorySource(root, errors, excludes=excludes, pool=pool)
        self._start = partition.start
        self._end = partition.end
        self._moved_in = partition.moved_in
        self._moved_out = partition.moved_out
        self._toward_moved = frozenset(
            b"/".join(parts[:i])
            for parts in (rel.split(b"/") for rel in partition.moved_in)
            for i in range(1, len(parts))
        )

    def _holds(self, key: Key) -> bool:
        """Whether the path ``key`` is in the range."""
        return (self._start is None or self._start <= key) and (
            self._end is None or key < self._end
        )

    def _reaches(self, key: Key) -> bool:
        """Whether anything at or below the directory ``key`` is in the range: its subtree is the
        run of paths starting with ``key``."""
        if self._end is not None and key >= self._end:
            return False
        return self._start is None or self._start[: len(key)] <= key

    def root(self) -> SourceItem:
        return self._inner.root()

    def children(self, rel: bytes) -> Iterator[SourceItem]:
        parent = key_of(rel)
        wanted = []
        for name in self._inner.names(rel):
            child = rel + b"/" + name if rel else name
            if (
                self._reaches(parent + (name,))
                or child in self._moved_in
                or child in self._toward_moved
            ):
                wanted.append(name)
        for item in self._inner.named_children(rel, wanted):
            key = parent + (item.name,)
            if statmod.S_ISDIR(item.st.st_mode):
                keep = self._reaches(key) or item.rel in self._toward_moved
            else:
                # Tested again by kind: a file whose name starts the range of another partition
                # (the tree changed since the plan) is that partition's, not this one's.
                keep = item.rel in self._moved_in or (
                    self._holds(key) and item.rel not in self._moved_out
                )
            if keep:
                yield item

    def readlink(self, item: SourceItem) -> bytes:
        return self._inner.readlink(item)

    def open(self, item: SourceItem) -> Content:
        return self._inner.open(item)
