"""Planning a distributed pack: the source cut into ``Partition``s that a ``Plan`` holds.

- a directory (``plan_directory``) is walked once, in the driver, with the packer's own
  ``DirectorySource`` (same excludes, same errors) but nothing read, only lstat'ed, and its shape
  cut by ``cutter``; all names of a hard-linked file are packed by one partition;
- an object-store prefix (``plan_objects``) is listed once, in the driver, by the packer's own
  ``ObjectSource`` (same refusals and excludes), and the tree its keys imply is cut exactly as a
  directory's is; each partition carries its share of the listing (its objects' keys, sizes and
  mtimes), so the tasks pack what the driver listed without listing again;
- tar shards (``plan_archives``) are cut into runs of whole shards of about equal bytes, in order.

May import: ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.packing.sources``,
``bundlefs.packing.distributed.cutter``.
"""

from __future__ import annotations

import bisect
import os
import stat as statmod
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from bundlefs.errors import PackError
from bundlefs.packing.distributed.cutter import Key, Pos, Shape, cuts, key_of, shape_of
from bundlefs.packing.sources.base import SourceErrors
from bundlefs.packing.sources.directory import DirectorySource
from bundlefs.packing.sources.objects import ObjectSource
from bundlefs.packing.sources.streams import STDIN
from bundlefs.storage.location import Location
from bundlefs.storage.objectstore.listing import ObjectInfo

# Partitions per worker when the caller gives no count: a few per worker, so a slow or
# restarted worker delays the end by a fraction of its share, not all of it.
PARTITIONS_PER_WORKER = 4
# ...but no more than the data is worth (``fit``): a task costs its start, at least one shard and
# its share of the merge, so a partition holds at least this much content or this many entries
# (153 small files on 8 workers: one partition, one shard, not 32).
PARTITION_BYTES = 256 * 1024**2
PARTITION_ENTRIES = 20_000


def default_partitions(workers: int) -> int:
    """How many partitions for ``workers`` workers: ``PARTITIONS_PER_WORKER`` each, at least 1."""
    return max(1, workers) * PARTITIONS_PER_WORKER


def fitted_count(count: int, entries: int, data_bytes: int) -> int:
    """``count`` partitions, or fewer when the data is small: one per ``PARTITION_BYTES`` of
    content or ``PARTITION_ENTRIES`` entries, whichever allows more; at least 1."""
    by_bytes = -(-data_bytes // PARTITION_BYTES)
    by_entries = -(-entries // PARTITION_ENTRIES)
    return max(1, min(count, max(by_bytes, by_entries)))


@dataclass(frozen=True)
class Partition:
    """One task's share of the source.

    A directory source: the entries from ``start`` (included; None: the first) to ``end``
    (excluded; None: past the last) in depth-first name order, paths as components; minus
    ``moved_out`` and plus ``moved_in``, names of hard-linked files whose first name another
    partition packs (relative paths). Tar shards: ``archives``, in order. An object-store
    prefix: the range as for a directory, and ``objects``, the listing's objects in it (~100
    bytes each on the wire; not in the repr).
    ``entries`` and ``data_bytes`` are what the plan expected it to hold.
    """

    index: int
    start: Key | None = None
    end: Key | None = None
    moved_in: frozenset[bytes] = frozenset()
    moved_out: frozenset[bytes] = frozenset()
    archives: tuple[str, ...] = ()
    entries: int = 0
    data_bytes: int = 0
    objects: tuple[ObjectInfo, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class Plan:
    """The partitions of a source, and what the walk that made them found and cost."""

    partitions: tuple[Partition, ...]
    entries: int  # below the root (a directory), or 0 (archives: unknown before reading them)
    data_bytes: int  # of file content (a directory), or of the archives
    skipped: tuple[str, ...] = ()  # what the walk left out (with skip_errors)
    seconds: float = 0.0


def plan_directory(
    root: str,
    count: int,
    *,
    excludes: tuple[str, ...] = (),
    skip_errors: bool = False,
    jobs: int = 4,
    skip: tuple[int, int] | None = None,
    fit: bool = False,
) -> Plan:
    """Walk the tree at ``root`` once (lstat only, ``jobs`` threads) and cut it into at most
    ``count`` partitions (fewer when cuts meet: a tree smaller than its partition count; with
    ``fit``, no more than the data is worth, ``fitted_count``).

    What the walk cannot read is a ``PackError`` (or, with ``skip_errors``, skipped and listed),
    exactly as the pack itself would say it. Memory: ~(name length + 9) bytes per entry of the
    tree, plus the names of multiply-linked files; the driver of a 10-million-file tree needs
    ~0.5 GB. Same tree, same ``count``: same partitions.
    """
    if count < 1:
        raise PackError(f"the partition count must be at least 1, not {count}")
    started = time.monotonic()
    errors = SourceErrors(skip_errors)
    tree, links = _walk(root, errors, excludes, jobs, skip)
    if fit:
        count = fitted_count(count, tree.entries, tree.bytes)
    partitions = _partitions(cuts(tree, count), tree, links)
    return Plan(
        partitions,
        tree.entries,
        tree.bytes,
        tuple(errors.skipped),
        time.monotonic() - started,
    )


def _walk(
    root: str,
    errors: SourceErrors,
    excludes: tuple[str, ...],
    jobs: int,
    skip: tuple[int, int] | None,
) -> tuple[Shape, dict[tuple[int, int], list[bytes]]]:
    """The tree's shape and sizes, and the names of each multiply-linked file."""
    pool = ThreadPoolExecutor(jobs) if jobs > 1 else None
    links: dict[tuple[int, int], list[bytes]] = {}
    try:
        walker = DirectorySource(
            root, errors, excludes=excludes, pool=pool, skip=skip, read_ahead=False
        )
        walker.root()  # an unreadable root: the pack's own PackError

        def listing(rel: bytes) -> Iterator[tuple[bytes, int]]:
            for item in walker.children(rel):
                st = item.st
                size = -1 if statmod.S_ISDIR(st.st_mode) else 0
                if statmod.S_ISREG(st.st_mode):
                    size = st.st_size
                    if st.st_nlink > 1:
                        names_of = links.setdefault((st.st_dev, st.st_ino), [])
                        if names_of:
                            size = 0  # the content is stored once, with its first name
                        names_of.append(item.rel)
                yield item.name, size

        top = shape_of(listing)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return top, {k: v for k, v in links.items() if len(v) > 1}


def _partitions(
    cuts: list[tuple[Key, Pos]], tree: Shape, links: dict[tuple[int, int], list[bytes]]
) -> tuple[Partition, ...]:
    """The ranges between the cuts, with hard-linked files' names moved to one partition."""
    keys = [key for key, _ in cuts]
    count = len(cuts) + 1
    moved_in: list[set[bytes]] = [set() for _ in range(count)]
    moved_out: list[set[bytes]] = [set() for _ in range(count)]
    for names in links.values():
        ordered = sorted(names, key=key_of)
        owner = bisect.bisect_right(keys, key_of(ordered[0]))
        for rel in ordered[1:]:
            where = bisect.bisect_right(keys, key_of(rel))
            if where != owner:
                moved_out[where].add(rel)
                moved_in[owner].add(rel)
    bounds: list[Pos] = [(0, 0)] + [pos for _, pos in cuts] + [(tree.entries, tree.bytes)]
    return tuple(
        Partition(
            index=i,
            start=keys[i - 1] if i > 0 else None,
            end=keys[i] if i < len(keys) else None,
            moved_in=frozenset(moved_in[i]),
            moved_out=frozenset(moved_out[i]),
            entries=bounds[i + 1][0] - bounds[i][0],
            data_bytes=bounds[i + 1][1] - bounds[i][1],
        )
        for i in range(count)
    )


def plan_objects(
    location: Location,
    count: int,
    *,
    created_ns: int,
    excludes: tuple[str, ...] = (),
    skip_errors: bool = False,
    fit: bool = False,
) -> Plan:
    """List the objects below ``location`` once and cut the tree their keys imply into at most
    ``count`` partitions (with ``fit``, no more than the data is worth), as ``plan_directory``
    cuts a directory tree (by bytes and entries, "directories" — key prefixes — whole where
    they fit, keys in order).

    A key a bundle cannot hold is a ``PackError`` (or, with ``skip_errors``, skipped and listed)
    here, once, as the pack itself would say it; the partitions hold only what is packed.
    Memory: the listing's tree (~200 bytes plus the name per object) and each partition's share
    of it. Same listing, same ``count``: same partitions.
    """
    if count < 1:
        raise PackError(f"the partition count must be at least 1, not {count}")
    started = time.monotonic()
    errors = SourceErrors(skip_errors)
    source = ObjectSource(location, errors, created_ns=created_ns, excludes=excludes)
    source.root()  # the listing: an unreachable store or a refused key fails here
    top = shape_of(lambda rel: ((name, size) for name, size, _, _ in source.listing(rel)))
    if fit:
        count = fitted_count(count, top.entries, top.bytes)
    found = cuts(top, count)
    shares = _shares(source, [key for key, _ in found])
    partitions = tuple(
        replace(p, objects=tuple(share))
        for p, share in zip(_partitions(found, top, {}), shares, strict=True)
    )
    return Plan(
        partitions, top.entries, top.bytes, tuple(errors.skipped), time.monotonic() - started
    )


def _shares(source: ObjectSource, keys: list[Key]) -> list[list[ObjectInfo]]:
    """The listing's objects, split at the cut ``keys``: one share per partition."""
    shares: list[list[ObjectInfo]] = [[] for _ in range(len(keys) + 1)]
    pending = [b""]
    while pending:
        rel = pending.pop()
        for name, size, mtime_ns, marked in source.listing(rel):
            child_rel = rel + b"/" + name if rel else name
            key = child_rel.decode("utf-8", "surrogateescape")
            share = shares[bisect.bisect_right(keys, key_of(child_rel))]
            if size >= 0:
                share.append(ObjectInfo(key, size, mtime_ns))
                continue
            pending.append(child_rel)
            if marked:  # it may be empty, there by its marker only: the marker goes with its place
                share.append(ObjectInfo(key + "/", 0, 0))
    return shares


def plan_archives(paths: Sequence[str], count: int, *, fit: bool = False) -> Plan:
    """Tar shards (or any archives) cut into at most ``count`` runs of whole archives, in order,
    of about equal bytes: each cut at the archive boundary nearest its ideal place. With
    ``fit``, no more runs than their bytes are worth (``fitted_count``)."""
    if count < 1:
        raise PackError(f"the partition count must be at least 1, not {count}")
    started = time.monotonic()
    if STDIN in paths:
        raise PackError("a tar on stdin cannot be packed in partitions: give the archive's path")
    sizes = []
    for path in paths:
        try:
            sizes.append(os.stat(path).st_size)
        except OSError as e:
            raise PackError(f"cannot read the archive {path}: {e.strerror}") from None
    total = sum(sizes)
    if fit:
        count = fitted_count(count, 0, total)
    weights = sizes if total else [1] * len(sizes)
    total = sum(weights)
    ends = []  # cumulative weight after each archive
    running = 0
    for w in weights:
        running += w
        ends.append(running)
    cuts: list[int] = []  # index of the first archive of each partition but the first
    for k in range(1, count):
        ideal = k * total  # in units of 1 / count
        best = min(range(1, len(paths)), key=lambda i: abs(ends[i - 1] * count - ideal), default=0)
        if best and (not cuts or best > cuts[-1]):
            cuts.append(best)
    starts = [0, *cuts]
    stops = [*cuts, len(paths)]
    partitions = tuple(
        Partition(index=i, archives=tuple(paths[a:b]), data_bytes=sum(sizes[a:b]))
        for i, (a, b) in enumerate(zip(starts, stops, strict=True))
    )
    return Plan(partitions, 0, sum(sizes), (), time.monotonic() - started)
