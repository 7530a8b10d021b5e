"""A pack on a base's split of a directory's children into the files its base knows unchanged
by their lstat (runs of them, delivered unread: ``SourceItem.run``) and the rest, and the two
merged back in name order: what ``DirectorySource.probed_known`` does in Python where the
compiled ``native.known_files`` is not built.

Memory: the split of one window of at most ``KNOWN_WINDOW`` children.

May import: the standard library and ``bundlefs.packing.sources.base``.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator, Mapping

from bundlefs.packing.sources.base import CopiedRun, Reuse, SourceItem, Stat

# Names probed_known lstat's before it probes the others: the items of one window are held.
KNOWN_WINDOW = 4096

# A delta pack's files known to its base by name: the (mode, size, mtime_ns) each was packed
# with, and the ``Reuse`` to deliver it with when its lstat has them (``probed_known``).
Known = Mapping[bytes, tuple[tuple[int, int, int], Reuse]]


def split_known(
    fd: int, children: list[tuple[bytes, bytes]], known: Known
) -> tuple[CopiedRun, list[tuple[bytes, bytes]]]:
    """``children`` of the directory open at ``fd`` split as ``native.known_files`` splits
    them: (rel, name, lstat, reuse) of each regular file ``known`` holds whose lstat has its
    (mode, size, mtime_ns) and one link; (name, rel) of the others."""
    stat, get = os.stat, known.get
    quick: CopiedRun = []
    rest: list[tuple[bytes, bytes]] = []
    for name, rel in children:
        found = get(name)
        if found is not None:
            try:
                st = stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                st = None  # probed again, which reports it
            if (
                st is not None
                and st.st_nlink == 1
                and (st.st_mode, st.st_size, st.st_mtime_ns) == found[0]
            ):
                quick.append((rel, name, st, found[1]))
                continue
        rest.append((name, rel))
    return quick, rest


def run_item(run: CopiedRun) -> SourceItem:
    """One item for ``run``: the builder takes it whole (``SourceItem.run``)."""
    rel, name, st, _reuse = run[-1]
    return SourceItem(rel, name, st, run=run)


def merged(first: CopiedRun, second: Iterator[SourceItem]) -> Iterator[SourceItem]:
    """``first``'s files in runs and ``second``'s items, each in name order, merged (no name is
    in both): a run ends where an item of ``second`` comes between its files."""
    start = 0
    for item in second:
        end = bisect.bisect_left(first, item.name, lo=start, key=_name_of)
        if end > start:
            yield run_item(first[start:end])
        start = end
        yield item
    if start < len(first):
        yield run_item(first[start:])


def _name_of(known: tuple[bytes, bytes, Stat, Reuse]) -> bytes:
    return known[1]
