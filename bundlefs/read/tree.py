"""``TreeModel``: a bundle's entries as a tree — by inode, by name in a directory, by path.

It owns the inode model (entries, hard links resolved to their file, owners), lookups in a
directory, directory listings, parents, paths for error messages, path resolution with symlinks,
and the bounded caches that make those cheap. It applies the format's tree invariants
(core/integrity.py) to what it reads and fails fast with ``FormatError``.

Synchronous and thread-safe. May import: ``bundlefs.core``, ``bundlefs.errors``,
``bundlefs.storage.index``, ``bundlefs.storage.source_records``, ``bundlefs.storage.totals``,
``bundlefs.read.options``.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator

from bundlefs.core import format as fmt
from bundlefs.core import integrity
from bundlefs.errors import EntryNotFound, FormatError, NotADirectory, SymlinkLoop
from bundlefs.read import listing
from bundlefs.read.options import DEFAULT_NAME_CACHE
from bundlefs.storage.index import IndexReader
from bundlefs.storage.source_records import iter_source_records
from bundlefs.storage.totals import tree_totals

MAX_SYMLINK_HOPS = 40
_DIRECTORY_CACHE = 4096  # decoded directory entries held (~0.3 KB each)
_RESOLVED_PATHS = 16_384  # whole paths → entries held by the path API (~0.3 KB each)
# A binary search of a directory costs what reading ~16 of its names does (10,000 entries, the
# scale tree at 10M files: ~20 µs against ~1.3 µs a name); counted for at most this many.
_SEARCH_PER_SCAN_NAME = 16
_SEARCHES_HELD = 65_536
_ERROR_PATHS = 1024  # path_of results held (error paths only)


def is_plain_file(entry: fmt.Entry) -> bool:
    """A regular file's own entry (not a LINK entry naming one)."""
    return entry.is_file and not entry.is_link


def _worth_a_table(searches: dict[int, int], directory: fmt.Entry) -> bool:
    """Whether ``directory`` has been searched enough to pay for reading its names (``searches``
    counts each directory's): once its binary searches have cost about what the scan costs (a
    ski rental: never more than twice the cheaper way). Reading the names of a 10,000-entry
    directory is ~13 ms, a search ~20 µs: without this, random lookups across 900 such
    directories (the scale tree's 10,000,000 files) read a directory at each one, 12.6 ms a
    path against 0.06 with searches alone, since the cache holds only 13 of them."""
    count = searches.get(directory.ino, 0) + 1
    if count * _SEARCH_PER_SCAN_NAME < directory.size:
        if len(searches) >= _SEARCHES_HELD:
            searches.clear()  # bounded; forgetting only delays a table
        searches[directory.ino] = count
        return False
    searches.pop(directory.ino, None)
    return True


class TreeModel:
    """The entry tree of one open index."""

    def __init__(self, index: IndexReader, *, name_cache: int = DEFAULT_NAME_CACHE) -> None:
        self._index = index
        self.root = index.entry(fmt.ROOT_INO)
        self._paths: dict[int, str] = {}
        # Decoded directory entries: every path resolution and every FUSE request on a directory
        # decodes its directories again otherwise (~7 µs each). Bounded; emptied when full.
        self._directories: dict[int, fmt.Entry] = {}
        self._resolved: dict[tuple[bytes, bool], fmt.Entry] = {}
        self._name_cache_limit = name_cache
        self._name_tables: OrderedDict[int, tuple[bytes, ...]] = OrderedDict()
        self._names_held = 0
        self._names_lock = threading.Lock()
        self._searches: dict[int, int] = {}  # binary searches per directory without a table

    def forked(self) -> None:
        """In a child after ``fork()``: a lock another thread held then would stay held here."""
        self._names_lock = threading.Lock()

    def clear(self) -> None:
        """Drop every cache (a closed bundle resolves nothing: the index raises)."""
        self._resolved.clear()
        self._directories.clear()

    # -- by inode ----------------------------------------------------------------------------------

    def entry(self, ino: int) -> fmt.Entry:
        """The entry of an inode number, with a LINK entry replaced by its target."""
        entry = self._directories.get(ino)
        if entry is not None:
            return entry
        entry = self._index.entry(ino)
        if entry.is_dir:
            self._hold_directory(entry)
        elif entry.is_link:
            target = self._index.entry(entry.target)
            integrity.enforce(integrity.link_target(ino, target.ino, is_plain_file(target)))
            return target
        return entry

    def stored_entry(self, ino: int) -> fmt.Entry:
        """The entry as stored (a LINK entry stays a LINK entry), decoded and validated."""
        return self._index.entry(ino)

    def stored_entries(self, first: int, count: int) -> Iterator[fmt.Entry]:
        """Up to ``count`` stored entries from inode ``first``, in inode order."""
        return self._index.iter_entries(first, count)

    def raw_entries(self) -> Iterator[tuple[int, bytes]]:
        """(inode, undecoded value) of every entry, in inode order (one cursor scan), for scans
        that decode only what they need (read/stream.py)."""
        return self._index.iter_raw(fmt.ROOT_INO, self._index.config.entry_count)

    @property
    def format_version(self) -> int:
        """The bundle's format version (what undecoded values are read with)."""
        return self._index.marker.format_version

    def owner(self, entry: fmt.Entry) -> tuple[int, int]:
        """(uid, gid) of an entry."""
        return self._index.owners[entry.owner]

    def content_type(self, entry: fmt.Entry) -> str | None:
        """The media type stored for a file entry (version 2), or None."""
        return self._index.content_type(entry)

    def meta(self) -> dict[str, str]:
        """The bundle's own metadata (``pack --meta``); empty for version 1."""
        return self._index.meta()

    def stored_totals(self, ino: int) -> fmt.TreeTotals | None:
        """Directory ``ino``'s totals as stored (version 5), or None before version 5."""
        return tree_totals(self._index, ino)

    def stored_sources(self) -> Iterator[tuple[bytes, bytes]]:
        """Every undecoded (key, value) of ``sources`` (version 6; nothing before or without)."""
        return iter_source_records(self._index)

    def totals(self, entry: fmt.Entry) -> fmt.TreeTotals:
        """What lies below an entry: ``_totals_below``."""
        return _totals_below(self._index, entry)

    def lookup(self, parent: fmt.Entry, name: bytes) -> fmt.Entry | None:
        """The child ``name`` of directory ``parent`` (links resolved), or None."""
        if not parent.is_dir:
            raise NotADirectory(f"{parent.name!r} is not a directory", os.fsdecode(parent.name))
        names = self._names_of(parent)
        if names is not None:
            i = bisect.bisect_left(names, name)
            if i == len(names) or names[i] != name:
                return None
            return self._child(parent, parent.first_child + i, name)
        # Binary search over the directory's name-ordered inode range, comparing raw names.
        ino = self._index.find_child(parent.first_child, parent.size, name)
        return None if ino is None else self._child(parent, ino, name)

    def _child(self, parent: fmt.Entry, ino: int, name: bytes) -> fmt.Entry:
        entry = self._directories.get(ino) or self._index.entry(ino)  # decoded and validated
        if entry.name != name:
            raise FormatError(f"entry {ino} has an inconsistent name")
        if entry.is_link:
            return self.entry(ino)
        if entry.is_dir:
            integrity.enforce(integrity.child_directory_parent(ino, entry.parent, parent.ino))
            self._hold_directory(entry)
        return entry

    def _hold_directory(self, entry: fmt.Entry) -> None:
        directories = self._directories
        if len(directories) >= _DIRECTORY_CACHE:
            directories.clear()  # simpler than LRU, and a working set this large is rare
        directories[entry.ino] = entry

    def _names_of(self, directory: fmt.Entry) -> tuple[bytes, ...] | None:
        """A directory's child names in inode order, from a bounded cache; None where not worth it.

        Once a directory is read (one cursor scan, ~1.5 µs a name), a lookup in it is a bisect
        in C (child ``i`` is inode ``first_child + i``) instead of a ~17-probe binary search
        through LMDB. A tuple of names costs ~50 bytes a name, a name → inode dict ~116 (11.6 MB
        for 100,000 names, which a daemon would hold on top of its record cache). At most
        ``name_cache`` names are held in all.
        """
        names = self._name_tables.get(directory.ino)
        if names is not None:
            with self._names_lock:
                if directory.ino in self._name_tables:
                    self._name_tables.move_to_end(directory.ino)  # least recently used goes first
            return names
        if not directory.size:
            return ()  # nothing to hold (and held empty tables would count for nothing)
        if directory.size > self._name_cache_limit // 4:
            return None
        if not _worth_a_table(self._searches, directory):
            return None
        names = tuple(
            name for _ino, name in self._index.iter_names(directory.first_child, directory.size)
        )
        for i in range(1, len(names)):  # bisect needs what the format promises: strictly sorted
            if names[i] <= names[i - 1]:  # the rule inline: a call a name was 72 -> 130 ns
                integrity.enforce(integrity.child_order(directory.ino, names[i - 1], names[i]))
        with self._names_lock:
            held = self._name_tables.get(directory.ino)
            if held is not None:
                return held  # another thread built it meanwhile
            self._name_tables[directory.ino] = names
            self._names_held += len(names)
            while self._names_held > self._name_cache_limit:
                _, evicted = self._name_tables.popitem(last=False)
                self._names_held -= len(evicted)
        return names

    def children(self, directory: fmt.Entry, start: int = 0) -> Iterator[tuple[bytes, fmt.Entry]]:
        """(name, entry) for the children of ``directory`` from position ``start``, links resolved
        and checked as they go (read/listing.py)."""
        return listing.children(self._index, self.entry, directory, start)

    def dirents(
        self, directory: fmt.Entry, start: int, count: int, previous: bytes | None = None
    ) -> listing.Dirents:
        """``children``'s names, inode numbers and modes, without whole decodes (listing.py)."""
        return listing.dirents(self._index, self.entry, directory, start, count, previous)

    def dirent_stats(
        self, directory: fmt.Entry, start: int, count: int, previous: bytes | None = None
    ) -> tuple[list[bytes], list[listing.Stat]]:
        """``dirents`` with each child's attributes, a file's without a decode (listing.py)."""
        return listing.dirent_stats(self._index, self.entry, directory, start, count, previous)

    def parent_of(self, directory: fmt.Entry) -> fmt.Entry:
        """The directory that lists ``directory`` (the root for the root)."""
        parent = self._index.entry(directory.parent)
        integrity.enforce(integrity.parent_lists(directory, parent))
        return parent

    def path_of(self, ino: int) -> str:
        """The path of an inode, for error messages.

        Files do not record their directory, so this scans entries up to ``ino`` for the directory
        whose child range holds it (decoding directories only), then follows parent pointers:
        fine for an error path, never used on a hot one.
        """
        known = self._paths.get(ino)
        if known is not None:
            return known
        names: list[bytes] = []
        current = ino
        try:
            while current != fmt.ROOT_INO:
                names.append(self._index.entry(current).name)
                parent = self._directory_holding(current)
                if parent is None or len(names) > fmt.MAX_ENTRIES:
                    return f"<inode {ino}>"
                current = parent
        except FormatError:
            return f"<inode {ino}>"
        path = "/" + "/".join(os.fsdecode(n) for n in reversed(names))
        if len(self._paths) >= _ERROR_PATHS:
            self._paths.clear()
        self._paths[ino] = path
        return path

    def _directory_holding(self, ino: int) -> int | None:
        for candidate, value in self._index.iter_raw(1, ino - 1):
            if fmt.is_directory_value(value):
                entry = fmt.decode_entry(candidate, value, self._index.marker.format_version)
                if entry.first_child <= ino < entry.first_child + entry.size:
                    return candidate
        return None

    def __iter__(self) -> Iterator[tuple[str, fmt.Entry]]:
        """Every entry but the root as (path, entry): depth first, each directory's names in
        order; a hard link's entry is the file it names."""
        pending: list[tuple[str, fmt.Entry]] = [("", self.root)]
        while pending:
            top, directory = pending.pop()
            subdirs = []
            for name, entry in self.children(directory):
                path = os.path.join(top, os.fsdecode(name)) if top else os.fsdecode(name)
                yield path, entry
                if entry.is_dir:
                    subdirs.append((path, entry))
            pending.extend(reversed(subdirs))

    # -- by path -----------------------------------------------------------------------------------

    def resolve(self, raw: bytes, *, follow_last: bool = True) -> fmt.Entry:
        """The entry at path ``raw`` (relative to the root; a leading ``/`` is allowed), through a
        bounded cache of whole paths (the bundle never changes).

        Programs read the same paths again (training epochs, repeated lookups): a hit costs
        ~0.3 µs where resolving a two-level path costs 10-12 µs. Emptied when full.
        """
        # As POSIX: a trailing "/" (or "/.") names a directory, through a final symlink too.
        as_directory = raw.endswith((b"/", b"/.")) and raw.strip(b"/.") != b""
        follow_last = follow_last or as_directory
        key = (raw, follow_last)
        entry = self._resolved.get(key)
        if entry is None:
            try:
                entry = self._resolve(raw, follow_last, 0)
            except (EntryNotFound, NotADirectory) as e:
                asked = os.fsdecode(raw)
                if e.filename == asked:
                    raise
                # Failed after a symlink: name the path asked for, as os does, and the cause.
                raise type(e)(f"{asked!r}: {e} (followed from a symbolic link)", asked) from None
            if len(self._resolved) >= _RESOLVED_PATHS:
                self._resolved.clear()
            self._resolved[key] = entry
        if as_directory and not entry.is_dir:
            raise NotADirectory(f"{os.fsdecode(raw)!r} is not a directory", os.fsdecode(raw))
        return entry

    def _resolve(self, raw: bytes, follow_last: bool, hops: int) -> fmt.Entry:
        parts = [p for p in raw.split(b"/") if p and p != b"."]
        stack = [self.root]
        for i, part in enumerate(parts):
            current = stack[-1]
            if part == b"..":
                if len(stack) > 1:
                    stack.pop()
                continue
            if not current.is_dir:
                raise NotADirectory(
                    f"{os.fsdecode(raw)!r}: a component is not a directory", os.fsdecode(raw)
                )
            child = self.lookup(current, part)
            if child is None:
                raise EntryNotFound(
                    f"{os.fsdecode(raw)!r} does not exist in the bundle", os.fsdecode(raw)
                )
            last = i == len(parts) - 1
            if child.is_symlink and (follow_last or not last):
                if hops >= MAX_SYMLINK_HOPS:
                    raise SymlinkLoop(
                        f"{os.fsdecode(raw)!r}: too many levels of symbolic links", os.fsdecode(raw)
                    )
                if child.symlink.startswith(b"/"):
                    raise EntryNotFound(
                        f"{os.fsdecode(raw)!r}: absolute symlink leads out of the bundle",
                        os.fsdecode(raw),
                    )
                base = b"/".join(e.name for e in stack[1:])
                rest = b"/".join(parts[i + 1 :])
                target = b"/".join(x for x in (base, child.symlink, rest) if x)
                return self._resolve(target, follow_last, hops + 1)
            stack.append(child)
        return stack[-1]


def _totals_below(index: IndexReader, entry: fmt.Entry) -> fmt.TreeTotals:
    """What lies below an entry (``integrity.child_totals`` added up): a directory's stored
    totals (version 5: one lookup), else a walk of its subtree that gives the same answer in
    O(subtree); a regular file is one file of its size, anything else nothing."""
    if not entry.is_dir:
        mine = integrity.child_totals(entry)
        return fmt.TreeTotals(files=mine.files, bytes=mine.bytes)
    stored = tree_totals(index, entry.ino)
    return _walked_totals(index, entry) if stored is None else stored


def _walked_totals(index: IndexReader, directory: fmt.Entry) -> fmt.TreeTotals:
    """A directory's totals added up by walking its subtree (bundles before version 5)."""
    found = fmt.TreeTotals()
    pending = [directory]
    while pending:
        below = pending.pop()
        for child in index.iter_entries(below.first_child, below.size):
            found += integrity.child_totals(child)
            if child.is_dir:
                pending.append(child)
    return found
