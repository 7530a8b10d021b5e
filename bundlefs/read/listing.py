"""Directory listings: a directory's children as decoded entries (``children``), and for a plain
listing their names, inode numbers and file types only (``dirents``), read from their entry values
without decoding them whole (a FUSE READDIR needs nothing else).

A full decode costs ~4–5 µs an entry in Python; reading the name and mode from a value whose
layout is known costs a tenth of that (``core.format.entry_v3.dirents``), which is what lets a
listing of a big directory keep up with the kernel (docs/performance.md, "Listing big
directories"). Values that need more (directories, whose parent is checked; LINK entries, which
list their target's inode; symlinks; versions 1 and 2) are decoded in full, checked as
``TreeModel.children`` checks them. The names are checked in bulk: valid, strictly increasing.

Synchronous and thread-safe. May import: ``bundlefs.core``, ``bundlefs.errors``,
``bundlefs.storage.index``, ``bundlefs.storage.native`` (a listing's file attributes compiled).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import cast

from bundlefs.core import format as fmt
from bundlefs.core import integrity
from bundlefs.core.format.dirents import dirents as _dirents_v3
from bundlefs.core.format.dirents import file_stats as _file_stats
from bundlefs.errors import FormatError, NotADirectory
from bundlefs.storage import native
from bundlefs.storage.index import IndexReader

Dirents = tuple[list[bytes], list[int], list[int]]  # names, inode numbers, modes
# ino, mode, nlink, uid, gid, size, mtime_ns, rdev: what a stat of the entry gives (as stored)
Stat = tuple[int, int, int, int, int, int, int, int]


def children(
    index: IndexReader, resolve: Callable[[int], fmt.Entry], directory: fmt.Entry, start: int
) -> Iterator[tuple[bytes, fmt.Entry]]:
    """(name, entry) for the children of ``directory`` from position ``start``, LINK entries
    resolved by ``resolve``: every entry decoded in full (READDIRPLUS, the library's listings).

    Validates as it goes: names strictly increasing and each child directory's parent correct.
    """
    _check_directory(directory)
    previous = None
    count = directory.size - start
    for raw in index.iter_entries(directory.first_child + start, count):
        # The rules inline, their words from core/integrity.py: this loop serves readdir.
        if previous is not None and raw.name <= previous:
            integrity.enforce(integrity.child_order(directory.ino, previous, raw.name))
        previous = raw.name
        if raw.is_dir and raw.parent != directory.ino:
            rule = integrity.child_directory_parent(raw.ino, raw.parent, directory.ino)
            integrity.enforce(rule)
        yield raw.name, (resolve(raw.ino) if raw.is_link else raw)


def dirents(
    index: IndexReader,
    resolve: Callable[[int], fmt.Entry],
    directory: fmt.Entry,
    start: int,
    count: int,
    previous: bytes | None = None,
) -> Dirents:
    """Children ``start … start+count−1`` of ``directory`` (fewer at its end) as names, inode
    numbers and modes; ``resolve`` gives a LINK entry's target (``TreeModel.entry``). ``previous``
    is the name before ``start`` where the caller has it, so the order is checked across calls."""
    first, values = _window(index, directory, start, count)
    if not values:
        return [], [], []
    count = len(values)
    if index.marker.format_version >= 3:
        names, modes, rest = _dirents_v3(values)
    else:
        names, modes, rest = [b""] * count, [0] * count, list(range(count))
    inodes = list(range(first, first + count))
    for i in rest:
        names[i], entry = _decoded(index, resolve, directory, first + i, values[i])
        inodes[i], modes[i] = entry.ino, entry.mode
    _check_names(directory.ino, names, previous)
    return names, inodes, modes


def dirent_stats(
    index: IndexReader,
    resolve: Callable[[int], fmt.Entry],
    directory: fmt.Entry,
    start: int,
    count: int,
    previous: bytes | None = None,
) -> tuple[list[bytes], list[Stat]]:
    """``dirents`` with each child's attributes (a listing with attributes: READDIRPLUS), as
    ``Stat`` tuples; a plain file's are read without a decode (compiled, ``native.file_stats``:
    0.2 µs an entry against ~1.3 here; else ``core.format.dirents``), checked as ``children``
    checks them."""
    first, values = _window(index, directory, start, count)
    if not values:
        return [], []
    version, owners = index.marker.format_version, index.owners
    compiled = None
    if version >= 3:
        types = len(index.content_types)
        compiled = native.file_stats(values, first, version, owners, types)
    names, stats, rest = compiled or _file_stats_python(values, first, version, owners)
    for i in rest:
        names[i], e = _decoded(index, resolve, directory, first + i, values[i])
        uid, gid = owners[e.owner]
        stats[i] = (e.ino, e.mode, e.nlink, uid, gid, e.size, e.mtime_ns, e.rdev)
    _check_names(directory.ino, names, previous)
    return names, cast(list[Stat], stats)  # every None filled above


def _file_stats_python(
    values: list[bytes], first: int, version: int, owners: list[tuple[int, int]]
) -> tuple[list[bytes], list[Stat | None], list[int]]:
    """``native.file_stats`` where it is not compiled: a plain file's name and attributes read
    from its value without a decode (``core.format.dirents``), the rest left for one."""
    count = len(values)
    if version < 3:
        return [b""] * count, [None] * count, list(range(count))
    names, modes, rest = _dirents_v3(values)
    files = _file_stats(values, version)
    for i in rest:
        files[i] = None
    stats: list[Stat | None] = []
    rest = []
    for i, got in enumerate(files):
        if got is None:
            stats.append(None)
            rest.append(i)
            continue
        size, mtime_ns, owner, nlink = got
        if owner >= len(owners):
            raise FormatError(f"entry {first + i} names owner {owner}, which does not exist")
        uid, gid = owners[owner]
        stats.append((first + i, modes[i], nlink, uid, gid, size, mtime_ns, 0))
    return names, stats, rest


def _window(
    index: IndexReader, directory: fmt.Entry, start: int, count: int
) -> tuple[int, list[bytes]]:
    """The first child's inode number and the values of children ``start … start+count−1`` of
    ``directory`` (fewer at its end, none past it)."""
    _check_directory(directory)
    count = min(count, directory.size - start)
    first = directory.first_child + start
    return first, list(index.values(first, count))


def _decoded(
    index: IndexReader,
    resolve: Callable[[int], fmt.Entry],
    directory: fmt.Entry,
    ino: int,
    value: bytes,
) -> tuple[bytes, fmt.Entry]:
    """(name, entry) of child ``ino`` of ``directory``, decoded in full and checked; a LINK
    entry's entry is its target's."""
    raw = index.decode(ino, value)
    if raw.is_dir and raw.parent != directory.ino:
        integrity.enforce(integrity.child_directory_parent(raw.ino, raw.parent, directory.ino))
    return raw.name, (resolve(raw.ino) if raw.is_link else raw)


def _check_directory(directory: fmt.Entry) -> None:
    if not directory.is_dir:
        raise NotADirectory(f"{directory.name!r} is not a directory", os.fsdecode(directory.name))


def _check_names(directory: int, names: list[bytes], previous: bytes | None) -> None:
    """Every name valid and the names strictly increasing, in a few passes at C speed (~0.1 µs
    a name); the first offence is then found and named by the one-name checks."""
    joined = b"".join(names)
    lengths = sorted(set(map(len, names)))  # a few distinct lengths: cheaper than min and max
    if (
        b"/" in joined
        or b"\0" in joined
        or not all(map(bytes.__lt__, names, names[1:]))
        or lengths[0] == 0
        or lengths[-1] > fmt.MAX_NAME
        or (lengths[0] <= 2 and (b"." in names or b".." in names))
        or (previous is not None and names[0] <= previous)
    ):
        before = previous
        for name in names:
            fmt.validate_name(name)
            if before is not None:
                integrity.enforce(integrity.child_order(directory, before, name))
            before = name
