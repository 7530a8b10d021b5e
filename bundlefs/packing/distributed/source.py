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
from bundlefs.packing.sources.base import SourceErrors, SourceItem
from bundlefs.packing.sources.directory import DirectorySource, ReadIf
from bundlefs.packing.sources.known_split import Known


class PartitionSource(DirectorySource):
    """The entries of one ``Partition`` of a directory tree, with every directory above them.

    A ``DirectorySource`` that lists each directory it is asked for but probes and reads only
    the names that are in the range (or lead to it, or are moved in), so a directory split
    between partitions is read once in all. Directories above the range are delivered with their
    real attributes: the partial bundles agree on every directory they share. Being a
    ``DirectorySource`` (``names``, ``named_children`` and ``known_children`` narrowed to the
    range), it is walked
    beside a base bundle as a whole tree is (``delta.DeltaSource``: ``pack --base --dask``).
    Memory: that of a ``DirectorySource`` (one directory's names and the read-ahead window) plus
    the partition's moved names.
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
        super().__init__(root, errors, excludes=excludes, pool=pool)
        self.errors = errors  # shared with the pack: what is skipped is in its summary
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

    def names(self, rel: bytes) -> list[bytes]:
        """The names of the directory ``rel`` that are in the range or lead to it."""
        parent = key_of(rel)
        wanted = []
        for name in super().names(rel):
            child = rel + b"/" + name if rel else name
            if (
                self._reaches(parent + (name,))
                or child in self._moved_in
                or child in self._toward_moved
            ):
                wanted.append(name)
        return wanted

    def named_children(
        self, rel: bytes, names: list[bytes], read_if: ReadIf | None = None
    ) -> Iterator[SourceItem]:
        return self._kept(rel, super().named_children(rel, names, read_if))

    def known_children(
        self, rel: bytes, known: Known, read_if: ReadIf | None = None
    ) -> Iterator[SourceItem]:
        return self._kept(rel, super().known_children(rel, known, read_if))

    def split_ahead(self, rel: bytes, known: Known) -> None:
        """Nothing: the split ahead lists the whole directory, not this partition's ``names``
        (each partition would lstat, read and report the others' files)."""

    def _kept(self, rel: bytes, items: Iterator[SourceItem]) -> Iterator[SourceItem]:
        """``items`` (children of ``rel``) that are this partition's; of a run of unchanged
        files (``SourceItem.run``, regular files all), those that are."""
        parent = key_of(rel)
        for item in items:
            if item.run is not None:
                run = [
                    known
                    for known in item.run
                    if known[0] in self._moved_in
                    or (self._holds(parent + (known[1],)) and known[0] not in self._moved_out)
                ]
                if run:
                    yield SourceItem(run[-1][0], run[-1][1], run[-1][2], run=run)
                continue
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
