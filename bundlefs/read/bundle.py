"""``Bundle``: the read-only file-system model of a bundle, usable without FUSE.

Two levels of API share one implementation:
- by inode (``entry``, ``lookup``, ``children``, ``read_at``) for the FUSE adapter;
- by path (``stat``, ``listdir``, ``scandir``, ``walk``, ``read``, ``open``, ``glob``…)
  for programs.

Synchronous and thread-safe; forked children reopen LMDB on their own (see ``index``). Never imports
pyfuse3 or trio.
"""

from __future__ import annotations

import bisect
import fnmatch
import io
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.errors import (
    CorruptDataError,
    EntryNotFound,
    FormatError,
    IsADirectory,
    NotADirectory,
    NotASymlink,
    WouldBlock,
)
from bundlefs.read.cache import CacheStats, RecordCache
from bundlefs.storage.index import IndexReader
from bundlefs.storage.shards import ShardSet

DEFAULT_CACHE_SIZE = 256 * 1024 * 1024
_MAX_SYMLINK_HOPS = 40
DEFAULT_NAME_CACHE = 131_072  # names (~100 bytes each) of recently searched directories

Path = str | bytes | os.PathLike


@dataclass(frozen=True, slots=True)
class BundleStat:
    """What ``os.stat`` would say of an entry (attribute names as in ``os.stat_result``)."""

    st_mode: int
    st_ino: int
    st_nlink: int
    st_uid: int
    st_gid: int
    st_size: int
    st_mtime_ns: int
    st_blocks: int

    @property
    def st_mtime(self) -> float:
        return self.st_mtime_ns / 1e9


@dataclass(frozen=True, slots=True)
class BundleDirEntry:
    """One item of ``scandir``: like ``os.DirEntry``, without I/O."""

    name: str | bytes
    path: str | bytes
    entry: fmt.Entry
    _bundle: Bundle

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return self._resolved(follow_symlinks).is_dir

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return self._resolved(follow_symlinks).is_file

    def is_symlink(self) -> bool:
        return self.entry.is_symlink

    def stat(self, *, follow_symlinks: bool = True) -> BundleStat:
        return self._bundle.stat_entry(self._resolved(follow_symlinks))

    def inode(self) -> int:
        return self.entry.ino

    def _resolved(self, follow: bool) -> fmt.Entry:
        if follow and self.entry.is_symlink:
            try:
                return self._bundle.resolve(self.path, follow_symlinks=True)
            except (EntryNotFound, NotADirectory):
                return self.entry
        return self.entry


@dataclass(frozen=True, slots=True)
class BundleInfo:
    path: str
    config: fmt.Config
    bundle_id: bytes
    index_bytes: int
    shard_bytes: int


def _as_bytes(path: Path) -> tuple[bytes, bool]:
    """The path as bytes, and whether the caller gave text (so results go back as text)."""
    path = os.fspath(path)
    if isinstance(path, str):
        return os.fsencode(path), True
    return path, False


_DIRECTORY_CACHE = 4096  # decoded directory entries held (~0.3 KB each)
_RESOLVED_PATHS = 16_384  # whole paths → entries held by the path API (~0.3 KB each)


class Bundle:
    """An open bundle. Use as a context manager, or call ``close()``."""

    def __init__(
        self,
        path: Path,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        name_cache: int = DEFAULT_NAME_CACHE,
        check_index: bool = True,
    ) -> None:
        self.path = os.fsdecode(os.fspath(path))
        self._index = IndexReader(self.path, check_checksum=check_index)
        self.config = self._index.config
        try:
            self._shards = ShardSet(self.path, self._index.marker)
            self.root = self._index.entry(fmt.ROOT_INO)
        except BaseException:
            self._index.close()
            raise
        self.cache = RecordCache(cache_size)
        self._shard_bytes: int | None = None
        self._paths: dict[int, str] = {}  # path_of results: error paths only, bounded
        # Decoded directory entries: every path resolution and every FUSE request on a directory
        # decodes its directories again otherwise (~7 µs each). Bounded; emptied when full.
        self._directories: dict[int, fmt.Entry] = {}
        self._resolved: dict[tuple[bytes, bool], fmt.Entry] = {}
        self._inflight: dict[tuple[int, int], threading.Event] = {}
        self._inflight_lock = threading.Lock()
        self._name_cache_limit = name_cache
        self._name_tables: OrderedDict[int, tuple[bytes, ...]] = OrderedDict()
        self._names_held = 0
        self._names_lock = threading.Lock()

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._shards.close()
        self._index.close()
        self.cache.clear()
        self._resolved.clear()  # a closed bundle resolves nothing (BundleClosedError)

    # -- facts about the bundle --------------------------------------------------------------------

    def info(self) -> BundleInfo:
        if self._shard_bytes is None:
            self._shard_bytes = sum(
                self._index.shard_info(i).file_size for i in range(self.config.shard_count)
            )
        return BundleInfo(
            self.path,
            self.config,
            self._index.marker.bundle_id,
            self._index.marker.index_size,
            self._shard_bytes,
        )

    def hold_index_resident(self) -> int:
        """Keep the whole index in memory (mapped) until ``close``; returns its size in bytes.

        For a long-lived reader (the mount): cold lookups then cost no disk reads. ``OSError``
        where the kernel cannot (Linux < 5.14).
        """
        return self._index.hold_resident()

    def cache_stats(self) -> CacheStats:
        return self.cache.stats()

    @property
    def index(self) -> IndexReader:
        return self._index

    # -- the inode level -------------------------------------------------------------------------

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
            if not target.is_file or target.is_link:
                raise FormatError(f"hard link {ino} points to {entry.target}, not a file")
            return target
        return entry

    def owner(self, entry: fmt.Entry) -> tuple[int, int]:
        return self._index.owners[entry.owner]

    def lookup(self, parent: fmt.Entry, name: bytes) -> fmt.Entry | None:
        """The child ``name`` of directory ``parent`` (links resolved), or None."""
        if not parent.is_dir:
            raise NotADirectory(f"{parent.name!r} is not a directory")
        names = self._names_of(parent)
        if names is not None:
            i = bisect.bisect_left(names, name)
            if i == len(names) or names[i] != name:
                return None
            return self._child(parent, parent.first_child + i, name)
        # Binary search over the directory's name-ordered inode range, comparing raw names.
        lo, hi = parent.first_child, parent.first_child + parent.size - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            candidate = self._index.entry_name(mid)
            if candidate == name:
                return self._child(parent, mid, name)
            if candidate < name:
                lo = mid + 1
            else:
                hi = mid - 1
        return None

    def _child(self, parent: fmt.Entry, ino: int, name: bytes) -> fmt.Entry:
        entry = self._directories.get(ino) or self._index.entry(ino)  # decoded and validated
        if entry.name != name:
            raise FormatError(f"entry {ino} has an inconsistent name")
        if entry.is_link:
            return self.entry(ino)
        if entry.is_dir:
            if entry.parent != parent.ino:  # else a forged index aliases directories
                raise FormatError(f"directory {ino} does not name {parent.ino} as parent")
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
        names = tuple(
            name for _ino, name in self._index.iter_names(directory.first_child, directory.size)
        )
        for i in range(1, len(names)):  # bisect needs what the format promises: strictly sorted
            if names[i - 1] >= names[i]:
                raise FormatError(f"directory {directory.ino} lists names out of order")
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
        """(name, entry) for the children of ``directory`` from position ``start``, links resolved.

        Validates as it goes: names strictly increasing and each child directory's parent correct.
        """
        if not directory.is_dir:
            raise NotADirectory(f"{directory.name!r} is not a directory")
        previous = None
        count = directory.size - start
        for raw in self._index.iter_entries(directory.first_child + start, count):
            if previous is not None and raw.name <= previous:
                raise FormatError(f"directory {directory.ino} lists names out of order")
            previous = raw.name
            if raw.is_dir and raw.parent != directory.ino:
                raise FormatError(f"directory {raw.ino} does not name {directory.ino} as parent")
            yield raw.name, (self.entry(raw.ino) if raw.is_link else raw)

    def parent_of(self, directory: fmt.Entry) -> fmt.Entry:
        parent = self._index.entry(directory.parent)
        inside = parent.first_child <= directory.ino < parent.first_child + parent.size
        if not parent.is_dir or not (inside or directory.ino == fmt.ROOT_INO == parent.ino):
            raise FormatError(f"directory {directory.ino} names {directory.parent} as its parent")
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
        if len(self._paths) >= 1024:
            self._paths.clear()
        self._paths[ino] = path
        return path

    def _directory_holding(self, ino: int) -> int | None:
        for candidate, value in self._index.iter_raw(1, ino - 1):
            if fmt.is_directory_value(value):
                entry = fmt.decode_entry(candidate, value)
                if entry.first_child <= ino < entry.first_child + entry.size:
                    return candidate
        return None

    # -- reading file content ----------------------------------------------------------------------

    def _load(self, record: fmt.Record, nowait: bool = False) -> bytes:
        """A record's bytes from the cache, or loaded once even when several threads ask."""
        key = (record.shard, record.offset)
        while True:
            data = self.cache.get(key)
            if data is not None:
                return data
            with self._inflight_lock:
                waiter = self._inflight.get(key)
                if waiter is None:
                    done = self._inflight[key] = threading.Event()
            if waiter is not None:
                if nowait:
                    raise WouldBlock  # another thread is loading it: do not wait here
                waiter.wait()
                continue  # the loader has cached it (or failed: then we try ourselves)
            try:
                data = self._shards.load(record, nowait=nowait)
                self.cache.put(key, data)
                return data
            finally:
                with self._inflight_lock:
                    del self._inflight[key]
                done.set()

    def prefetch(self, entry: fmt.Entry) -> None:
        """Start reading a small file's stored bytes from disk in the background, if not cached.

        For the mount: a LOOKUP of a file is almost always followed by its READ, a request round
        trip later. Advised at the lookup, the disk read overlaps that round trip, and the READ
        then finds its bytes in the page cache and is served inline instead of in a thread.
        Only files within one record: a lookup must not start a large read nobody asked for.
        """
        if not entry.is_file or not 0 < entry.size <= self.config.record_size:
            return
        try:
            record = self._index.record_at(entry.shard, entry.offset)
        except FormatError:
            return  # the read will report it
        if record.flags & fmt.RECORD_ZEROS or entry.offset + entry.size > record.end:
            return
        if (record.shard, record.offset) in self.cache:
            return
        if record.flags & fmt.RECORD_RAW:  # a whole-file read takes only the file's own slice
            start = record.stored_offset + entry.offset - record.offset
            self._shards.prefetch(record.shard, start, entry.size)
        else:
            self._shards.prefetch(record.shard, record.stored_offset, record.stored_length)

    def read_at(
        self,
        entry: fmt.Entry,
        offset: int,
        size: int,
        *,
        path: str | None = None,
        nowait: bool = False,
        as_buffer: bool = False,
    ) -> bytes | bytearray:
        """Up to ``size`` bytes of a file from ``offset``; a whole-file read checks the file CRC.

        With ``nowait``, raise ``WouldBlock`` rather than wait for the disk (for an event loop).
        With ``as_buffer``, a read that spans records may come back as the bytearray it was
        assembled in (the FUSE reply takes any buffer; ``bytes`` would copy it once more).
        """
        if entry.is_dir:
            raise IsADirectory(f"{path or entry.name!r} is a directory")
        if not entry.is_file:
            raise FormatError(f"{path or entry.name!r} is not a regular file")
        end = min(entry.size, offset + size)
        if offset >= end:
            if not entry.size and entry.crc32c:  # the CRC32C of no bytes is 0
                raise CorruptDataError("empty file fails its checksum", path=path, bundle=self.path)
            return b""
        try:
            out = self._read_range(entry, offset, end, nowait)
            return out if as_buffer or isinstance(out, bytes) else bytes(out)
        except CorruptDataError as e:
            raise e.with_context(bundle=self.path, path=path or self.path_of(entry.ino)) from None
        except FormatError as e:
            # A location or record the index cannot back (no record, no shard) damages this file
            # only: report it like bad bytes, so callers treat it as one damaged file.
            raise CorruptDataError(
                str(e), bundle=self.path, path=path or self.path_of(entry.ino), shard=entry.shard
            ) from None

    def _read_range(
        self, entry: fmt.Entry, offset: int, end: int, nowait: bool
    ) -> bytes | bytearray:
        """The file's bytes ``offset … end``: bytes within one record, else a bytearray filled in
        place, record by record (no pieces to join, and whole raw records read straight in)."""
        whole = offset == 0 and end == entry.size
        pos, stop = entry.offset + offset, entry.offset + end
        record = self._index.record_at(entry.shard, pos)
        if stop <= record.end:
            out: bytes | bytearray = self._record_slice(record, pos, stop - pos, whole, nowait)
        else:
            # The last byte must be backed by a record before its buffer is allocated: a forged
            # size would otherwise ask for a terabyte.
            self._index.record_at(entry.shard, stop - 1)
            out = bytearray(stop - pos)
            view = memoryview(out)
            at = 0
            while True:
                take = min(stop, record.end) - pos
                self._fill(view[at : at + take], record, pos, whole, nowait)
                pos += take
                at += take
                if pos >= stop:
                    break
                record = self._index.record_at(entry.shard, pos)
        if whole and crc32c(out) != entry.crc32c:
            raise CorruptDataError("file content fails its checksum", shard=entry.shard)
        return out

    def _record_slice(
        self, record: fmt.Record, pos: int, take: int, whole: bool, nowait: bool
    ) -> bytes:
        """``take`` stream bytes from ``pos``, all inside ``record``."""
        if whole and record.flags & fmt.RECORD_RAW:
            data = self.cache.get((record.shard, record.offset))
            if data is None:
                # A whole-file read is checked by the file CRC, so a raw record's slice can be
                # read directly instead of the whole record (4.6 KB: ~9 µs, not ~124 µs).
                return self._shards.read_raw(record, pos, take, nowait=nowait)
        else:
            data = self._load(record, nowait)
        start = pos - record.offset
        return data[start : start + take]  # the record itself when it is all of it: no copy

    def _fill(
        self, view: memoryview, record: fmt.Record, pos: int, whole: bool, nowait: bool
    ) -> None:
        """Fill ``view`` with the stream bytes from ``pos``, all inside ``record``."""
        covered = pos == record.offset and len(view) == record.length
        if (
            record.flags & fmt.RECORD_RAW
            and (whole or covered)
            and (record.shard, record.offset) not in self.cache
        ):
            # Straight into the reply, checked by the file's CRC (whole) or the record's own, and
            # not cached: a read that covers whole records is a large sequential one, which the
            # kernel's page cache keeps. Measured on a cold 64 MiB file through the mount (dd,
            # 1 MiB READs): 45,000 -> 23,000 page faults in the daemon, 249-268 -> 491 MB/s.
            self._shards.read_raw_into(record, pos, view, nowait=nowait, check_record=not whole)
            return
        view[:] = self._record_slice(record, pos, len(view), whole, nowait)

    # -- the path level ----------------------------------------------------------------------------

    def resolve(self, path: Path, *, follow_symlinks: bool = True) -> fmt.Entry:
        """The entry at ``path`` (relative to the bundle root; a leading ``/`` is allowed)."""
        raw, _ = _as_bytes(path)
        return self._resolve_cached(raw, follow_symlinks)

    def _resolve_cached(self, raw: bytes, follow_last: bool) -> fmt.Entry:
        """``_resolve`` through a bounded cache of whole paths (the bundle never changes).

        Programs read the same paths again (training epochs, repeated lookups): a hit costs
        ~0.3 µs where resolving a two-level path costs 10-12 µs. Emptied when full.
        """
        key = (raw, follow_last)
        entry = self._resolved.get(key)
        if entry is None:
            entry = self._resolve(raw, follow_last, 0)
            if len(self._resolved) >= _RESOLVED_PATHS:
                self._resolved.clear()
            self._resolved[key] = entry
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
                raise NotADirectory(f"{os.fsdecode(raw)!r}: a component is not a directory")
            child = self.lookup(current, part)
            if child is None:
                raise EntryNotFound(f"{os.fsdecode(raw)!r} does not exist in the bundle")
            last = i == len(parts) - 1
            if child.is_symlink and (follow_last or not last):
                if hops >= _MAX_SYMLINK_HOPS:
                    raise EntryNotFound(f"{os.fsdecode(raw)!r}: too many levels of symbolic links")
                if child.symlink.startswith(b"/"):
                    raise EntryNotFound(
                        f"{os.fsdecode(raw)!r}: absolute symlink leads out of the bundle"
                    )
                base = b"/".join(e.name for e in stack[1:])
                rest = b"/".join(parts[i + 1 :])
                target = b"/".join(x for x in (base, child.symlink, rest) if x)
                return self._resolve(target, follow_last, hops + 1)
            stack.append(child)
        return stack[-1]

    def stat_entry(self, entry: fmt.Entry) -> BundleStat:
        uid, gid = self.owner(entry)
        return BundleStat(
            entry.mode,
            entry.ino,
            entry.nlink,
            uid,
            gid,
            entry.size,
            entry.mtime_ns,
            entry.blocks,
        )

    def stat(self, path: Path, *, follow_symlinks: bool = True) -> BundleStat:
        return self.stat_entry(self.resolve(path, follow_symlinks=follow_symlinks))

    def lstat(self, path: Path) -> BundleStat:
        return self.stat(path, follow_symlinks=False)

    def exists(self, path: Path) -> bool:
        try:
            self.resolve(path)
        except (EntryNotFound, NotADirectory):
            return False
        return True

    def isdir(self, path: Path) -> bool:
        try:
            return self.resolve(path).is_dir
        except (EntryNotFound, NotADirectory):
            return False

    def isfile(self, path: Path) -> bool:
        try:
            return self.resolve(path).is_file
        except (EntryNotFound, NotADirectory):
            return False

    def islink(self, path: Path) -> bool:
        try:
            return self.resolve(path, follow_symlinks=False).is_symlink
        except (EntryNotFound, NotADirectory):
            return False

    def readlink(self, path: Path) -> str | bytes:
        raw, text = _as_bytes(path)
        entry = self._resolve_cached(raw, False)
        if not entry.is_symlink:
            raise NotASymlink(f"{os.fsdecode(raw)!r} is not a symbolic link")
        return os.fsdecode(entry.symlink) if text else entry.symlink

    def scandir(self, path: Path = "") -> Iterator[BundleDirEntry]:
        raw, text = _as_bytes(path)
        directory = self._resolve_cached(raw, True)
        if not directory.is_dir:
            raise NotADirectory(f"{os.fsdecode(raw)!r} is not a directory")
        prefix = raw.rstrip(b"/")
        for name, entry in self.children(directory):
            full = prefix + b"/" + name if prefix else name
            if text:
                yield BundleDirEntry(os.fsdecode(name), os.fsdecode(full), entry, self)
            else:
                yield BundleDirEntry(name, full, entry, self)

    def listdir(self, path: Path = "") -> list:
        return [d.name for d in self.scandir(path)]

    def walk(self, top: Path = "") -> Iterator[tuple]:
        """Like ``os.walk``: top-down (prune by editing ``dirs``), symlinked dirs not entered."""
        pending = [top]
        while pending:  # iterative: bundles may nest deeper than Python's recursion limit
            current = pending.pop()
            dirs, files, links = [], [], set()
            for d in self.scandir(current):
                # As os.walk: a symlink to a directory is listed among the directories.
                if d.is_dir():
                    dirs.append(d.name)
                    if d.is_symlink():
                        links.add(d.name)
                else:
                    files.append(d.name)
            yield current, dirs, files
            for name in reversed(dirs):
                if name not in links:
                    pending.append(os.path.join(current, name) if current else name)

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

    def glob(self, pattern: str) -> list[str]:
        """Paths matching a shell pattern; ``*`` does not cross ``/``; ``**`` matches any depth."""
        parts = pattern.strip("/").split("/")
        out = []
        for top, dirs, files in self.walk(""):
            for name in dirs + files:
                path = os.path.join(top, name) if top else name
                if _glob_match(path.split("/"), parts):
                    out.append(path)
        return sorted(out)

    def read(self, path: Path) -> bytes:
        raw, _ = _as_bytes(path)
        entry = self._resolve_cached(raw, True)
        return self.read_at(entry, 0, entry.size, path=os.fsdecode(raw))

    def open(self, path: Path, mode: str = "rb") -> BundleFile:
        if mode not in ("r", "rb"):
            raise ValueError("bundles are read-only: open() takes mode 'rb' only")
        raw, _ = _as_bytes(path)
        entry = self._resolve_cached(raw, True)
        if entry.is_dir:
            raise IsADirectory(f"{os.fsdecode(raw)!r} is a directory")
        return BundleFile(self, entry, os.fsdecode(raw))


def _glob_match(path: list[str], pattern: list[str]) -> bool:
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_glob_match(path[i:], rest) for i in range(len(path) + 1))
    if not path:
        return False
    return fnmatch.fnmatchcase(path[0], head) and _glob_match(path[1:], rest)


class BundleFile(io.RawIOBase):
    """A seekable, read-only binary file inside a bundle."""

    def __init__(self, bundle: Bundle, entry: fmt.Entry, path: str) -> None:
        super().__init__()
        self._bundle = bundle
        self._entry = entry
        self._pos = 0
        self.name = path

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._entry.size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise OSError(22, "negative seek position")
        self._pos = pos
        return pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1) -> bytes:
        if self.closed:
            raise ValueError("read of a closed file")
        if size is None or size < 0:
            size = max(0, self._entry.size - self._pos)
        data = self._bundle.read_at(self._entry, self._pos, size, path=self.name)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    @property
    def size(self) -> int:
        return self._entry.size

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a bundle file has no file descriptor")
