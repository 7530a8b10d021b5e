"""A pack split into partitions that run anywhere, merged into one bundle: everything of a
distributed pack but the executor (``bundlefs.integrations.dask`` runs the tasks on Dask).

It owns:
- *planning* (``plan_directory``, ``plan_archives``): a directory is walked once, in the driver,
  with the packer's own ``DirectorySource`` (same excludes, same errors) but nothing read, only
  lstat'ed; the tree, in depth-first name order, is cut into ranges of about equal weight (content
  bytes and entries, half each), each cut placed at the shallowest directory boundary near its
  ideal place, so directories stay whole where they fit in a share and a big one is split by
  name ranges. All names of a hard-linked file are packed by one partition. Tar shards are cut
  into runs of whole shards of about equal bytes, in order. An object-store prefix
  (``plan_objects``) is listed once, in the driver, by the packer's own ``ObjectSource`` (same
  refusals and excludes), and the tree its keys imply is cut exactly as a directory's is; each
  partition carries its share of the listing (its objects' keys, sizes and mtimes), so the tasks
  pack what the driver listed without listing again;
- *the partition source* (``PartitionSource``): a ``DirectorySource`` that delivers only its range
  of the tree plus the directories above it (with their real attributes), so each partition
  packs to a complete, valid partial bundle;
- *the task* (``pack_partition``): an ordinary ``pack`` of one partition into
  ``AREA/part-NNNNN``; a retried task finds what a killed attempt left (an unlocked
  ``.part-NNNNN.partial-PID``) and ``publish.stage`` removes it;
- *the driver's side* (``DistributedPack``): the checks before anything runs, the staging area
  (a locked temporary directory, removed at the end whatever happens), the abort marker that
  stops running tasks, and the merge of the partial bundles (``merge.merge``) and the publishing
  of the result at DEST.

The result holds exactly what a single-machine pack of the same source holds (every path, byte,
mode, owner and mtime; for tar shards, docs/cli.md says what is refused and where a directory's
description may differ), and is the same bytes for the same source, partition count and creation
time. docs/scale.md says how it scales.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.packing``.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import os
import secrets
import shutil
import stat as statmod
import time
from array import array
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bundlefs.errors import PackError
from bundlefs.packing import merge as merging
from bundlefs.packing.archive import STDIN
from bundlefs.packing.objects import ObjectSource
from bundlefs.packing.packer import (
    PackOptions,
    PackProgress,
    PackSource,
    PackSummary,
    check_destination,
    check_options,
    object_prefix,
    pack,
)
from bundlefs.packing.sources import Content, DirectorySource, SourceErrors, SourceItem
from bundlefs.packing.user_data import UserDataFile
from bundlefs.storage import publish
from bundlefs.storage.location import Location, parse_location
from bundlefs.storage.objectstore.listing import ObjectInfo
from bundlefs.storage.objectstore.upload import RemotePublisher, staging_path

# Partitions per worker when the caller gives no count: a few per worker, so a slow or
# restarted worker delays the end by a fraction of its share, not all of it.
PARTITIONS_PER_WORKER = 4
# ...but no more than the data is worth (``fit``): a task costs its start, at least one shard and
# its share of the merge, so a partition holds at least this much content or this many entries
# (153 small files on 8 workers: one partition, one shard, not 32).
PARTITION_BYTES = 256 * 1024**2
PARTITION_ENTRIES = 20_000
# How far a cut may move from its ideal place to fall on a shallower directory boundary: a
# share divided by this (a quarter), so partitions stay within 0.5 to 1.5 shares.
CUT_SLACK_DIVISOR = 4
PART_NAME = "part-%05d"
_TOKEN = "TOKEN"  # in the staging area: what a task checks to know it sees the driver's area
_ABORT = "ABORT"  # in the staging area: the pack failed; running tasks stop at their next tick

Key = tuple[bytes, ...]  # a path as its components: tuples sort in depth-first name order


def default_partitions(workers: int) -> int:
    """How many partitions for ``workers`` workers: ``PARTITIONS_PER_WORKER`` each, at least 1."""
    return max(1, workers) * PARTITIONS_PER_WORKER


def fitted_count(count: int, entries: int, data_bytes: int) -> int:
    """``count`` partitions, or fewer when the data is small: one per ``PARTITION_BYTES`` of
    content or ``PARTITION_ENTRIES`` entries, whichever allows more; at least 1."""
    by_bytes = -(-data_bytes // PARTITION_BYTES)
    by_entries = -(-entries // PARTITION_ENTRIES)
    return max(1, min(count, max(by_bytes, by_entries)))


def _key(rel: bytes) -> Key:
    return tuple(rel.split(b"/")) if rel else ()


# -- plans -----------------------------------------------------------------------------------------


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


class _Dir:
    """A directory as the planning walk saw it, kept small: ~(name length + 9) bytes a child.

    ``names`` joins the children's names with b"/" (which no name holds); ``sizes`` has per child
    its content bytes (0 for a symlink, a special file or a later name of a hard-linked file) or
    -1 for a directory, whose node is in ``subdirs`` by child position. ``entries`` and ``bytes``
    are the totals below it.
    """

    __slots__ = ("names", "sizes", "subdirs", "entries", "bytes")

    def __init__(self) -> None:
        self.names = b""
        self.sizes = array("q")
        self.subdirs: dict[int, _Dir] = {}
        self.entries = 0
        self.bytes = 0


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
    cuts = _cuts(tree, count)
    partitions = _partitions(cuts, tree, links)
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
) -> tuple[_Dir, dict[tuple[int, int], list[bytes]]]:
    """The tree's shape and sizes, and the names of each multiply-linked file."""
    pool = ThreadPoolExecutor(jobs) if jobs > 1 else None
    try:
        walker = DirectorySource(
            root, errors, excludes=excludes, pool=pool, skip=skip, read_ahead=False
        )
        walker.root()  # an unreadable root: the pack's own PackError
        top = _Dir()
        links: dict[tuple[int, int], list[bytes]] = {}
        order: list[tuple[_Dir, _Dir | None]] = [(top, None)]
        stack: list[tuple[_Dir, bytes]] = [(top, b"")]
        while stack:
            node, rel = stack.pop()
            names: list[bytes] = []
            below: list[tuple[_Dir, bytes]] = []
            for item in walker.children(rel):
                mode = item.st.st_mode
                size = 0
                if statmod.S_ISDIR(mode):
                    child = _Dir()
                    node.subdirs[len(names)] = child
                    order.append((child, node))
                    below.append((child, item.rel))
                    size = -1
                elif statmod.S_ISREG(mode):
                    size = item.st.st_size
                    if item.st.st_nlink > 1:
                        names_of = links.setdefault((item.st.st_dev, item.st.st_ino), [])
                        if names_of:
                            size = 0  # the content is stored once, with its first name
                        names_of.append(item.rel)
                names.append(item.name)
                node.sizes.append(size)
                if size > 0:
                    node.bytes += size
            node.names = b"/".join(names)
            node.entries = len(names)
            stack.extend(reversed(below))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    for node, parent in reversed(order):  # children before their parents: totals bottom up
        if parent is not None:
            parent.entries += node.entries
            parent.bytes += node.bytes
    return top, {k: v for k, v in links.items() if len(v) > 1}


# A position in the tree's depth-first order: (entries, content bytes) before it. Its weight is
# bytes * N + entries * max(B, 1) for a tree of N entries and B bytes: entries and bytes count
# half each, in integers (the same cuts on every machine).
_Pos = tuple[int, int]


class _Cutter:
    """Finds each cut: the boundary nearest its ideal place among those at the shallowest depth
    within a share / ``CUT_SLACK_DIVISOR`` of it."""

    def __init__(self, tree: _Dir, count: int) -> None:
        self.tree = tree
        self.count = count
        self.n = tree.entries
        self.unit = max(tree.bytes, 1)
        self.total = self.weight((tree.entries, tree.bytes))

    def weight(self, pos: _Pos) -> int:
        return pos[1] * self.n + pos[0] * self.unit

    def distance(self, pos: _Pos, k: int) -> int:
        """|pos - ideal cut k| in units of 1 / count of the total weight."""
        return abs(self.weight(pos) * self.count - k * self.total)

    def in_window(self, pos: _Pos, k: int) -> bool:
        return self.distance(pos, k) * CUT_SLACK_DIVISOR <= self.total

    def cut(self, k: int, after: _Pos) -> tuple[Key, _Pos] | None:
        """Cut ``k`` (1 .. count-1): the first path of the partition it starts and its position;
        None if the best boundary is not past ``after`` (the previous cut)."""
        best = self._descend(self.tree, (), (0, 0), None, k)
        if best is None or self.weight(best[1]) <= self.weight(after):
            return None
        if self.weight(best[1]) >= self.total:
            return None
        return best

    def _descend(
        self, node: _Dir, parts: Key, start: _Pos, following: tuple[Key, _Pos] | None, k: int
    ) -> tuple[Key, _Pos] | None:
        """The cut within ``node`` (whose children start at ``start``; ``following`` is the
        boundary just after it, None at the end of the tree)."""
        names = node.names.split(b"/") if len(node.sizes) else []
        pos = start
        best: tuple[int, int, _Pos] | None = None  # (distance, child, position)
        containing: tuple[int, _Pos, _Pos] | None = None  # (child, its start, its end)
        target = k * self.total
        for i, size in enumerate(node.sizes):
            sub = node.subdirs.get(i)
            if sub is not None:
                end = (pos[0] + 1 + sub.entries, pos[1] + sub.bytes)
            else:
                end = (pos[0] + 1, pos[1] + size)
            if self.in_window(pos, k):
                d = self.distance(pos, k)
                if best is None or d < best[0]:
                    best = (d, i, pos)
            if containing is None and self.weight(end) * self.count > target:
                containing = (i, pos, end)
            pos = end
        if best is not None:
            return parts + (names[best[1]],), best[2]
        if containing is None:
            return following
        i, begin, end = containing
        after = (parts + (names[i + 1],), end) if i + 1 < len(names) else following
        sub = node.subdirs.get(i)
        if sub is not None and self.weight((begin[0] + 1, begin[1])) * self.count <= target:
            # The ideal place is inside this directory's children: cut there, one level down.
            inner = self._descend(sub, parts + (names[i],), (begin[0] + 1, begin[1]), after, k)
            if inner is not None:
                return inner
        # A file (or a directory's own entry) wider than the window holds the ideal place: the
        # nearer of the boundaries around it.
        before = (parts + (names[i],), begin)
        if after is None or self.distance(before[1], k) <= self.distance(after[1], k):
            return before
        return after


def _cuts(tree: _Dir, count: int) -> list[tuple[Key, _Pos]]:
    cutter = _Cutter(tree, count)
    cuts: list[tuple[Key, _Pos]] = []
    last: _Pos = (0, 0)
    for k in range(1, count):
        found = cutter.cut(k, last)
        if found is not None:
            cuts.append(found)
            last = found[1]
    return cuts


def _partitions(
    cuts: list[tuple[Key, _Pos]], tree: _Dir, links: dict[tuple[int, int], list[bytes]]
) -> tuple[Partition, ...]:
    """The ranges between the cuts, with hard-linked files' names moved to one partition."""
    keys = [key for key, _ in cuts]
    count = len(cuts) + 1
    moved_in: list[set[bytes]] = [set() for _ in range(count)]
    moved_out: list[set[bytes]] = [set() for _ in range(count)]
    for names in links.values():
        ordered = sorted(names, key=_key)
        owner = bisect.bisect_right(keys, _key(ordered[0]))
        for rel in ordered[1:]:
            where = bisect.bisect_right(keys, _key(rel))
            if where != owner:
                moved_out[where].add(rel)
                moved_in[owner].add(rel)
    bounds: list[_Pos] = [(0, 0)] + [pos for _, pos in cuts] + [(tree.entries, tree.bytes)]
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
    top = _Dir()
    order: list[tuple[_Dir, _Dir | None]] = [(top, None)]
    stack: list[tuple[_Dir, bytes]] = [(top, b"")]
    while stack:
        node, rel = stack.pop()
        names: list[bytes] = []
        below: list[tuple[_Dir, bytes]] = []
        for name, size, _mtime, _marked in source.listing(rel):
            if size < 0:
                child = _Dir()
                node.subdirs[len(names)] = child
                order.append((child, node))
                below.append((child, rel + b"/" + name if rel else name))
            else:
                node.bytes += size
            names.append(name)
            node.sizes.append(size)
        node.names = b"/".join(names)
        node.entries = len(names)
        stack.extend(reversed(below))
    for node, parent in reversed(order):  # children before their parents: totals bottom up
        if parent is not None:
            parent.entries += node.entries
            parent.bytes += node.bytes
    if fit:
        count = fitted_count(count, top.entries, top.bytes)
    cuts = _cuts(top, count)
    keys = [key for key, _ in cuts]
    shares: list[list[ObjectInfo]] = [[] for _ in range(len(cuts) + 1)]
    pending = [b""]
    while pending:
        rel = pending.pop()
        for name, size, mtime_ns, marked in source.listing(rel):
            child_rel = rel + b"/" + name if rel else name
            key = child_rel.decode("utf-8", "surrogateescape")
            share = shares[bisect.bisect_right(keys, _key(child_rel))]
            if size >= 0:
                share.append(ObjectInfo(key, size, mtime_ns))
                continue
            pending.append(child_rel)
            if marked:  # it may be empty, there by its marker only: the marker goes with its place
                share.append(ObjectInfo(key + "/", 0, 0))
    partitions = tuple(
        dataclasses.replace(p, objects=tuple(share))
        for p, share in zip(_partitions(cuts, top, {}), shares, strict=True)
    )
    return Plan(
        partitions, top.entries, top.bytes, tuple(errors.skipped), time.monotonic() - started
    )


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


# -- the partition source --------------------------------------------------------------------------


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
        pool: Any = None,
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
        parent = _key(rel)
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


# -- the task --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartTask:
    """What one task packs (``source``: the directory, or None for archives and objects) and
    where to. ``prefix``: the object store's location (its storage options travel with it, out
    of the repr), and ``owner`` the driver's uid and gid, which every object is given."""

    partition: Partition
    source: str | None
    area: str  # the staging area (shared storage: the driver and every worker see it)
    token: str  # what the driver wrote in the area's TOKEN file
    prefix: Location | None = None
    owner: tuple[int, int] | None = None

    @property
    def dest(self) -> str:
        return os.path.join(self.area, PART_NAME % self.partition.index)


@dataclass(frozen=True)
class PartResult:
    """What a task reports back: small, whatever the partition held."""

    index: int
    dest: str
    files: int
    dirs: int
    data_bytes: int
    stored_bytes: int
    seconds: float
    host: str
    skipped: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    user_data_used: frozenset[bytes] = frozenset()


class PackCancelled(PackError):
    """A partition's pack stopped because the distributed pack it belongs to failed."""


class _AbortCheck:
    """The partition pack's progress callback: stops it once the driver has marked the area
    aborted, or the area is gone (at most every 0.2 s: ``pack``'s progress throttle)."""

    def __init__(self, task: PartTask) -> None:
        self.task = task

    def __call__(self, _progress: PackProgress) -> None:
        _check_area(self.task)


def _check_area(task: PartTask) -> None:
    area = task.area
    if os.path.exists(os.path.join(area, _ABORT)):
        raise PackCancelled("the distributed pack failed elsewhere; this partition stopped")
    try:
        with open(os.path.join(area, _TOKEN), encoding="ascii") as f:
            token = f.read()
    except OSError:
        token = None
    if token != task.token:
        raise PackError(
            f"the staging area {area} is not visible on worker host {os.uname().nodename}: "
            "give --staging a directory on storage the driver and every worker share"
        )


def pack_partition(task: PartTask, options: PackOptions) -> PartResult:
    """Pack one partition into ``task.dest`` (a complete bundle of its own); runs on a worker.

    ``options`` are the distributed pack's, as the driver fixed them (the creation time, no
    bundle metadata: that goes to the merge). A partial left by an attempt that was killed is
    removed (``publish.stage``); one a killed attempt had already published is replaced.
    """
    _check_area(task)
    options = dataclasses.replace(options, force=True, storage_options=None, staging=None)
    errors = SourceErrors(options.skip_errors)
    pool = None
    source: PackSource
    if task.prefix is not None:
        # The objects' fetchers: small objects are fetched ahead as in a single-machine pack.
        pool = ThreadPoolExecutor(options.jobs) if options.jobs > 1 else None
        assert options.created_ns is not None  # fixed by the driver
        source = ObjectSource(
            task.prefix,
            errors,
            created_ns=options.created_ns,
            excludes=options.excludes,
            pool=pool,
            owner=task.owner,
            objects=task.partition.objects,
        )
    elif task.source is not None:
        # The source's own readers (pack() makes its pool for the source only when it walks
        # a directory itself): reads overlap as in a single-machine pack.
        pool = ThreadPoolExecutor(options.jobs) if options.jobs > 1 else None
        source = PartitionSource(
            task.source, task.partition, errors, excludes=options.excludes, pool=pool
        )
    else:
        source = list(task.partition.archives)
    try:
        summary = pack(source, task.dest, options, progress=_AbortCheck(task))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    used: frozenset[bytes] = frozenset()
    if isinstance(options.user_data, UserDataFile):
        used = frozenset(options.user_data.used)
    c = summary.config
    return PartResult(
        index=task.partition.index,
        dest=task.dest,
        files=c.file_count,
        dirs=c.dir_count,
        data_bytes=c.data_bytes,
        stored_bytes=summary.stored_bytes,
        seconds=summary.seconds,
        host=os.uname().nodename,
        skipped=tuple(summary.skipped),
        changed=tuple(summary.changed),
        user_data_used=used,
    )


# -- the driver ------------------------------------------------------------------------------------


@dataclass
class DistributedPack:
    """The driver's side of one distributed pack: made by ``prepare`` (every check a pack makes
    before reading, so a bad DEST fails before any task runs), then ``staging`` (the area),
    ``plan``, ``tasks``, the executor's runs of ``pack_partition``, and ``merge``."""

    source: str | tuple[str, ...]  # a directory (or an object-store prefix's URL), or archives
    dest: str
    options: PackOptions  # checked, the creation time fixed
    local: bool  # DEST is a local path (else a URL)
    started: float = field(default_factory=time.monotonic)
    phases: dict[str, float] = field(default_factory=dict)
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    _area_id: tuple[int, int] | None = None
    prefix: Location | None = None  # the source is the objects below it

    @classmethod
    def prepare(cls, source: PackSource, dest: str, options: PackOptions) -> DistributedPack:
        options = check_options(options)
        if isinstance(source, str | os.PathLike):
            paths = [os.fspath(source)]
        elif isinstance(source, Sequence):
            paths = [os.fspath(p) for p in source]
        else:
            raise PackError("a distributed pack packs a directory or archive files")
        if not paths:
            raise PackError("nothing to pack: no source given")
        if STDIN in paths:
            raise PackError(
                "a tar on stdin cannot be packed in partitions: give the archive's path"
            )
        location, _remote = check_destination(paths, dest, options)
        prefix = object_prefix(paths, options)
        if prefix is not None:
            return cls(
                source=paths[0],
                dest=location.path if location.is_local else dest,
                options=options,
                local=location.is_local,
                prefix=prefix,
            )
        directory = len(paths) == 1 and os.path.isdir(paths[0])
        if options.staging is not None:
            staging = os.path.abspath(options.staging)
            if not os.path.isdir(staging):
                raise PackError(f"the staging directory {options.staging} does not exist")
            if directory:
                real = os.path.realpath(paths[0])
                inside = os.path.realpath(staging)
                if inside == real or inside.startswith(real.rstrip("/") + "/"):
                    raise PackError("the staging directory cannot be inside the tree being packed")
        return cls(
            source=paths[0] if directory else tuple(paths),
            dest=location.path if location.is_local else dest,
            options=options,
            local=location.is_local,
        )

    @property
    def part_options(self) -> PackOptions:
        """What every task packs with: the bundle's metadata is the merge's to write."""
        return dataclasses.replace(self.options, meta=())

    @contextlib.contextmanager
    def staging(self) -> Iterator[str]:
        """The staging area, created (locked, as a pack's partial is: ``bundlefs gc`` removes it
        if the driver is killed) and always removed at the end.

        Beside a local DEST (the merge hard-links the partial shards into it), or in
        ``options.staging`` (a URL DEST, or workers on other machines: it must be storage every
        worker and the driver see).
        """
        if self.options.staging is not None:
            name = os.path.basename(self.dest.rstrip("/")) or "bundle"
            stand_in = os.path.join(os.path.abspath(self.options.staging), name)
        elif self.local:
            stand_in = self.dest
        else:
            stand_in = staging_path(parse_location(self.dest, self.options.storage_options), None)
        with publish.stage(stand_in + ".dask") as (area, area_id):
            self._area_id = area_id
            try:
                with open(os.path.join(area, _TOKEN), "w", encoding="ascii") as f:
                    f.write(self.token)
                yield area
            finally:
                remove_area(area)

    def plan(self, count: int, *, fit: bool = False) -> Plan:
        """The partitions: at most ``count``; with ``fit`` (the caller gave no count), no more
        than the data is worth."""
        if self.prefix is not None:
            assert self.options.created_ns is not None  # fixed by check_options
            plan = plan_objects(
                self.prefix,
                count,
                created_ns=self.options.created_ns,
                excludes=self.options.excludes,
                skip_errors=self.options.skip_errors,
                fit=fit,
            )
        elif isinstance(self.source, str):
            plan = plan_directory(
                self.source,
                count,
                excludes=self.options.excludes,
                skip_errors=self.options.skip_errors,
                jobs=self.options.jobs,
                skip=self._area_id,
                fit=fit,
            )
        else:
            plan = plan_archives(self.source, count, fit=fit)
        self.phases["listing"] = plan.seconds
        return plan

    def tasks(self, plan: Plan, area: str) -> list[PartTask]:
        if self.prefix is not None:
            owner = (os.getuid(), os.getgid())
            return [
                PartTask(p, None, area, self.token, prefix=self.prefix, owner=owner)
                for p in plan.partitions
            ]
        directory = self.source if isinstance(self.source, str) else None
        return [PartTask(p, directory, area, self.token) for p in plan.partitions]

    def merge(self, plan: Plan, results: Sequence[PartResult], area: str) -> PackSummary:
        """Merge the partial bundles (in partition order) into one in the staging area, then
        publish it at DEST: a rename beside a local DEST, an upload to a URL."""
        results = sorted(results, key=lambda r: r.index)
        directory = isinstance(self.source, str)
        # A directory's partitions never share a file (their ranges are disjoint): a clash is a
        # tree that changed while it was packed; an object prefix's neither (one listing). Tar
        # shards share directories (the root at least), whose attributes a single-machine pack
        # takes from the first member below them unless a directory member describes them: the
        # first partition's, as "first" keeps.
        options = merging.MergeOptions(
            on_clash="error" if directory else "first",
            meta=self.options.meta,
            created_ns=self.options.created_ns,
        )
        merged_dir = os.path.join(area, "merged")
        started = time.monotonic()
        merged = merging.merge([r.dest for r in results], merged_dir, options)
        self.phases["merge"] = time.monotonic() - started
        if merged.overridden:
            # A member path in shards of two partitions: a single-machine pack keeps the last
            # one (as tar -x does), the merge could keep only the first; refused, not guessed.
            first, more = merged.overridden[0], len(merged.overridden) - 1
            also = f" (and {more} more)" if more else ""
            raise PackError(
                f"{first}{also} is in tar shards of different partitions, where a single-machine "
                "pack keeps the last one: pack these shards in one partition (--partitions 1)"
            )
        started = time.monotonic()
        self._publish(merged_dir)
        self.phases["publish"] = time.monotonic() - started
        if isinstance(self.options.user_data, UserDataFile):
            for r in results:
                self.options.user_data.used |= r.user_data_used
        return PackSummary(
            self.dest,
            merged.config,
            sum(r.stored_bytes for r in results),  # the merged bundle's shards are theirs
            merged.index_bytes,
            time.monotonic() - self.started,
            _unique([*plan.skipped, *(s for r in results for s in r.skipped)]),
            _unique([s for r in results for s in r.changed]),
            dict(self.phases),
        )

    def _publish(self, merged: str) -> None:
        """Put the merged bundle at DEST, atomically (``publish``'s rename, or the store's
        marker last)."""
        force = self.options.force
        if not self.local:
            remote = RemotePublisher(parse_location(self.dest, self.options.storage_options))
            try:
                remote.publish(merged, force)
            except OSError as e:
                raise PackError(f"cannot upload the bundle to {self.dest}: {e}") from e
            return
        parent = os.path.dirname(os.path.abspath(self.dest))
        if os.stat(merged).st_dev == os.stat(parent).st_dev:
            publish.publish(merged, self.dest, force)
            return
        # --staging on another file system than DEST: the shards must be copied over, which a
        # merge of the one merged bundle does (linking where it can), publishing as it goes.
        merging.merge(
            [merged],
            self.dest,
            merging.MergeOptions(
                force=force, meta=self.options.meta, created_ns=self.options.created_ns
            ),
        )


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def abort(area: str) -> None:
    """Mark the staging area aborted: running tasks stop at their next progress tick, tasks
    that have not started stop at once."""
    with contextlib.suppress(OSError), open(os.path.join(area, _ABORT), "w"):
        pass


def remove_area(area: str, attempts: int = 5) -> None:
    """Remove the staging area; retried, in case a task that was stopping still wrote in it."""
    for _ in range(attempts):
        shutil.rmtree(area, ignore_errors=True)
        if not os.path.lexists(area):
            return
        time.sleep(0.2)
