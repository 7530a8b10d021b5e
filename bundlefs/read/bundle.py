"""``Bundle``: an open bundle, read by path like a read-only file system, without FUSE.

A thin facade: it opens the index and the shards and hands the work to the two models below it —
``bundle.tree`` (read/tree.py: entries, lookups, listings, path resolution) and
``bundle.content`` (read/content.py: file bytes, the record cache). Programs use the path methods
here (``stat``, ``listdir``, ``scandir``, ``walk``, ``read``, ``open``, ``glob``…); the FUSE
adapter, ``extract`` and ``verify`` use ``tree`` and ``content`` by inode.

It is also a collection of paths (``len``, ``in``, iteration), streams every file in stored order
(``iter_files``), and pickles to its location, so spawned workers reopen it (docs/python.md).

A bundle at a URL (``s3://bucket/x.bundle``; storage/location.py) opens the same way: its index
is fetched into a local cache and opened from there, and its shards are read through a
``RemoteShardStore`` (storage/remote.py, docs/storage.md); everything above the store is the same.

Synchronous and thread-safe; forked children reopen LMDB on their own (see storage/index.py).
May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.read``.
"""

from __future__ import annotations

import array
import fnmatch
import io
import os
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, AnyStr, Generic, Literal, overload

from bundlefs.core import format as fmt
from bundlefs.errors import (
    BundleClosedError,
    CorruptDataError,
    EntryNotFound,
    FormatError,
    IsADirectory,
    NotADirectory,
    NotARegularFile,
    NotASymlink,
)
from bundlefs.read.cache import CacheStats, RecordCache
from bundlefs.read.content import ContentReader
from bundlefs.read.tree import DEFAULT_NAME_CACHE, TreeModel
from bundlefs.storage.index import IndexReader
from bundlefs.storage.location import Location, parse_location
from bundlefs.storage.objectstore.outage import FailedRead
from bundlefs.storage.remote import (
    DEFAULT_STORE_TIMEOUT,
    RemoteShardStore,
    check_store_timeout,
    fetch_index,
)
from bundlefs.storage.shards import ShardSet, zstd_module
from bundlefs.storage.store import LocalShardStore

DEFAULT_CACHE_SIZE = 256 * 1024 * 1024

Path = str | bytes | os.PathLike
StrPath = str | os.PathLike[str]
BytesPath = bytes | os.PathLike[bytes]


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
    # Beyond os.stat_result (format version 2): the file's media type and the user data
    # attached at pack time (``pack --user-data`` stores a JSON object); None where there is none.
    content_type: str | None = None
    user_data: bytes | None = None
    st_rdev: int = 0  # a character or block device's number (format version 4); else 0

    @property
    def st_mtime(self) -> float:
        """The modification time in seconds (``st_mtime_ns`` is exact)."""
        return self.st_mtime_ns / 1e9


@dataclass(frozen=True, slots=True)
class BundleDirEntry(Generic[AnyStr]):
    """One item of ``scandir``: like ``os.DirEntry``, without I/O (``str`` or ``bytes`` names, as
    the path given to ``scandir`` was)."""

    name: AnyStr
    path: AnyStr
    entry: fmt.Entry
    _bundle: Bundle

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        """Whether it is a directory (or, following symlinks, a symlink to one)."""
        return self._resolved(follow_symlinks).is_dir

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        """Whether it is a regular file (or, following symlinks, a symlink to one)."""
        return self._resolved(follow_symlinks).is_file

    def is_symlink(self) -> bool:
        """Whether it is a symbolic link."""
        return self.entry.is_symlink

    def stat(self, *, follow_symlinks: bool = True) -> BundleStat:
        """What ``os.stat`` would say of it (of a symlink's target unless ``follow_symlinks``
        is false)."""
        return self._bundle.stat_entry(self._resolved(follow_symlinks))

    def inode(self) -> int:
        """Its inode number in the bundle (as the mount shows it)."""
        return self.entry.ino

    def _resolved(self, follow: bool) -> fmt.Entry:
        if follow and self.entry.is_symlink:
            try:
                return self._bundle.resolve(self.path, follow_symlinks=True)
            except (EntryNotFound, NotADirectory):
                return self.entry
        return self.entry


@dataclass(frozen=True, slots=True)
class ShardDamage:
    """A shard file whose size is not what the shard table says, seen when the bundle opened
    (a stat, no read). The files stored in it may fail to read (EIO); ``verify`` names them."""

    shard: int
    name: str  # the file's name in the bundle directory
    expected: int  # its size by the shard table
    actual: int | None  # its size now; None: the file is missing

    def __str__(self) -> str:
        where = f"shard {self.shard} ({self.name})"
        if self.actual is None:
            return f"{where} is missing"
        if self.actual < self.expected:
            return (
                f"{where} is {self.expected - self.actual:,} bytes short: {self.actual:,} of "
                f"the {self.expected:,} its table entry says (truncated?)"
            )
        return f"{where} is {self.actual:,} bytes, not the {self.expected:,} its table entry says"

    def to_dict(self) -> dict[str, object]:
        return {
            "shard": self.shard,
            "name": self.name,
            "expected_bytes": self.expected,
            "actual_bytes": self.actual,
            "message": str(self),
        }


@dataclass(frozen=True, slots=True)
class BundleInfo:
    path: str
    config: fmt.Config
    bundle_id: bytes
    index_bytes: int
    shard_bytes: int
    meta: dict[str, str] | None = None  # the bundle's metadata (pack --meta)
    # A bundle at a URL only: where it lives, and its store's counters (RemoteShardStore.stats)
    location: str | None = None
    storage: dict[str, object] | None = None

    def to_dict(self) -> dict[str, object]:
        """The facts ``bundlefs info --json`` prints, in its key order (docs/cli.md); a bundle at
        a URL adds ``location`` and ``storage`` (docs/storage.md)."""
        c = self.config
        facts: dict[str, object] = {
            "path": self.path,
            "bundle_id": self.bundle_id.hex(),
            "format_version": c.format_version,
            "files": c.file_count,
            "dirs": c.dir_count,
            "symlinks": c.symlink_count,
            "hardlinks": c.hardlink_count,
            "specials": c.special_count,
            "entries": c.entry_count,
            "bytes": c.data_bytes,
            "stored_bytes": self.shard_bytes,
            "ratio": round(c.data_bytes / self.shard_bytes, 4) if self.shard_bytes else 0.0,
            "shards": c.shard_count,
            "index_bytes": self.index_bytes,
            "record_size": c.record_size,
            "block_size": c.block_size,
            "large_file_threshold": c.large_file_threshold,
            "compression": c.compression_name,
            "created_ns": c.created_ns,
            "content_types": c.content_type_count,
            "meta": dict(self.meta or {}),
        }
        if self.location is not None:
            facts["location"] = self.location
            facts["storage"] = dict(self.storage or {})
        return facts


def _shard_damage(store: LocalShardStore, index: IndexReader, count: int) -> list[ShardDamage]:
    """The shards whose file size differs from the shard table's (``Bundle.damaged_shards``)."""
    version = index.marker.format_version
    found = []
    for shard in range(count):
        name = fmt.shard_filename(shard, version)
        try:
            expected = index.shard_info(shard).file_size
            actual = store.file_size(name)
        except (FormatError, OSError):
            continue  # an unreadable descriptor or file: the first read (and verify) says so
        if actual != expected:
            found.append(ShardDamage(shard, name, expected, actual))
    return found


def _shown(path: Path) -> str | bytes:
    """``path`` as an error's ``filename``: as the caller gave it, like ``os`` does."""
    return os.fspath(path)


def _as_bytes(path: Path) -> tuple[bytes, bool]:
    """The path as bytes, and whether the caller gave text (so results go back as text)."""
    path = os.fspath(path)
    if isinstance(path, str):
        return os.fsencode(path), True
    return path, False


_open_bundles: weakref.WeakSet[Bundle] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # Data loaders fork workers from a process that may be reading: a load another thread had in
    # flight never finishes in the child, and a lock held at the fork stays held. (The index
    # reopens LMDB on its own: storage/index.py.)
    for bundle in list(_open_bundles):
        bundle._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _reopen(location: str, bundle_id: bytes, options: dict[str, Any]) -> Bundle:
    """Unpickling a ``Bundle``: open it again where it was, with the options it was opened with."""
    bundle = Bundle(location, **options)
    if bundle._index.marker.bundle_id != bundle_id:
        # A `pack --force` replaced it since it was pickled: a worker serving the new bundle to a
        # parent that indexed the old one would mix two datasets without a word.
        bundle.close()
        raise FormatError(f"the bundle at {location} was replaced since it was pickled")
    return bundle


class Bundle:
    """An open bundle. Use as a context manager, or call ``close()``.

    Picklable: the pickle holds the bundle's location, its ``bundle_id`` and the constructor's
    options, and unpickling opens the bundle again there (a fresh cache; ``hold_index_resident``
    is not carried over). So a torch ``DataLoader`` with ``multiprocessing_context="spawn"`` or
    ``"forkserver"`` can hand a bundle to its workers. Unpickling fails with ``FormatError`` if
    another bundle has replaced it at that location since; pickling a closed bundle raises
    ``BundleClosedError`` (a copy that is open where the original is closed would hide a bug).

    ``path`` may be a URL (``s3://bucket/x.bundle``): ``storage_options`` go to its fsspec
    back-end (credentials, endpoint; merged over ``BUNDLEFS_STORAGE_OPTIONS``), ``disk_cache``
    is the local cache directory (the fetched index and, up to ``disk_cache_size`` bytes, fetched
    records; default ``$XDG_CACHE_HOME/bundlefs``; size 0 keeps no records on disk), and
    ``store_timeout`` bounds in seconds what a read waits for an unanswering store (default 20;
    docs/storage.md, "Outages"). They mean nothing to a local bundle. A URL pickles with its
    options, so workers reopen it remotely.
    """

    def __init__(
        self,
        path: Path,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        name_cache: int = DEFAULT_NAME_CACHE,
        check_index: bool = True,
        storage_options: dict[str, Any] | None = None,
        disk_cache: str | os.PathLike[str] | None = None,
        disk_cache_size: int | None = None,
        store_timeout: float | None = None,
    ) -> None:
        self.location: Location = parse_location(os.fsdecode(os.fspath(path)), storage_options)
        self.path = self.location.path if self.location.is_local else self.location.url
        self._options: dict[str, Any] = {
            "cache_size": cache_size,
            "name_cache": name_cache,
            "check_index": check_index,
        }
        self._closed = False
        store: LocalShardStore | RemoteShardStore
        if self.location.is_local:
            # For pickling: absolute now, because the process may change directory before it
            # pickles, and a spawned child starts wherever it starts.
            self._location = os.path.abspath(self.path)
            self._index = IndexReader(self.path, check_checksum=check_index)
        else:
            self._location = self.location.url
            self._options.update(
                storage_options=dict(storage_options or {}),
                disk_cache=os.fspath(disk_cache) if disk_cache is not None else None,
                disk_cache_size=disk_cache_size,
                store_timeout=store_timeout,
            )
            timeout = DEFAULT_STORE_TIMEOUT if store_timeout is None else store_timeout
            check_store_timeout(timeout)
            # fetch_index has checked the index against the marker (a download always, a cached
            # copy when check_index): no second CRC pass over it here.
            local = fetch_index(self.location, disk_cache, check=check_index, timeout=timeout)
            self._index = IndexReader(local, check_checksum=False)
        self.config = self._index.config
        try:
            if self.config.record_codec == fmt.COMPRESSION_ZSTD:
                zstd_module()  # a missing binding is refused at open, not at the first read
            if self.location.is_local:
                store = LocalShardStore(self.path)
            else:
                store = self._remote_store(disk_cache, disk_cache_size, timeout)
        except BaseException:
            self._index.close()
            raise
        self._shards = ShardSet(store, self._index.marker, self._index.shard_info)
        try:
            self._tree = TreeModel(self._index, name_cache=name_cache)
        except BaseException:
            self._shards.close()  # and the bundle directory's descriptor with it
            self._index.close()
            raise
        self._root = self._tree.root
        self._content = ContentReader(
            self._index,
            self._shards,
            RecordCache(cache_size),
            bundle_path=self.path,
            path_of=self._tree.path_of,
        )
        self._shard_bytes: int | None = None
        self._store = store
        # A truncated (or missing, or grown) shard is said at once, not by the first read that
        # fails: one stat per shard. A bundle at a URL is not asked (a request per shard);
        # ``verify`` checks it.
        self.damaged_shards: list[ShardDamage] = (
            _shard_damage(store, self._index, self.config.shard_count)
            if isinstance(store, LocalShardStore)
            else []
        )
        _open_bundles.add(self)

    @property
    def tree(self) -> TreeModel:
        """The tree by inode (read/tree.py): entries, lookups, listings, path resolution —
        what the FUSE adapter, ``extract`` and ``verify`` use; the path methods are built on it."""
        return self._tree

    @property
    def content(self) -> ContentReader:
        """File bytes by entry (read/content.py): ``read_at``, ``iter_content``, and the record
        cache behind them."""
        return self._content

    @property
    def root(self) -> fmt.Entry:
        """The root directory's entry."""
        return self._root

    def _remote_store(
        self,
        disk_cache: str | os.PathLike[str] | None,
        disk_cache_size: int | None,
        store_timeout: float,
    ) -> RemoteShardStore:
        marker = self._index.marker
        # The shards' sizes bound coalesced GETs to each object (one index get per shard).
        sizes = {
            fmt.shard_filename(i, marker.format_version): self._index.shard_info(i).file_size
            for i in range(self.config.shard_count)
        }
        return RemoteShardStore(
            self.location,
            marker.bundle_id,
            shard_sizes=sizes,
            disk_cache=disk_cache,
            disk_cache_size=disk_cache_size,
            store_timeout=store_timeout,
        )

    def _forked(self) -> None:
        self._content.forked()
        self._tree.forked()
        self._store.forked()

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, tuple[str, bytes, dict[str, Any]]]:
        if self._closed:
            raise BundleClosedError(f"cannot pickle the closed bundle {self.path}")
        return _reopen, (self._location, self._index.marker.bundle_id, dict(self._options))

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def close(self) -> None:
        """Close the index and the shards; later use raises ``BundleClosedError``. Idempotent."""
        self._closed = True
        self._shards.close()
        self._index.close()
        self._content.cache.clear()
        self._tree.clear()

    # -- facts about the bundle --------------------------------------------------------------------

    def info(self) -> BundleInfo:
        """Facts about the bundle: counts, sizes, layout, compression, metadata (as `info`)."""
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
            self._tree.meta(),
            location=None if self.location.is_local else self.location.url,
            storage=self.storage_stats(),
        )

    def storage_stats(self) -> dict[str, object] | None:
        """A bundle at a URL: its store's counters (requests, bytes fetched, cache hits…,
        docs/storage.md); None for a local bundle."""
        if isinstance(self._store, RemoteShardStore):
            return self._store.stats()
        return None

    def storage_failed_read(self, error: CorruptDataError) -> FailedRead:
        """A read failed with ``error``: damage, or the object store's outage (then the store
        names the file in its log; ``OUTAGE_RETRY`` is the same read retried by the kernel, not
        to be counted again). Always ``DAMAGE`` for a local bundle."""
        if isinstance(self._store, RemoteShardStore) and error.unreadable:
            # Bytes the store did not deliver (a checksum mismatch is damage, outage or not).
            return self._store.failed_read(error.path, error.shard, error.record)
        return FailedRead.DAMAGE

    def hold_index_resident(self) -> int:
        """Keep the whole index in memory (mapped) until ``close``; returns its size in bytes.

        For a long-lived reader (the mount): cold lookups then cost no disk reads. ``OSError``
        where the kernel cannot (Linux < 5.14).
        """
        return self._index.hold_resident()

    @property
    def cache(self) -> RecordCache:
        """The in-memory cache of decompressed records (``cache_size`` bytes)."""
        return self._content.cache

    def cache_stats(self) -> CacheStats:
        """The record cache's counters: hits, misses, evictions, bytes held."""
        return self._content.cache.stats()

    def stat_entry(self, entry: fmt.Entry) -> BundleStat:
        """What ``os.stat`` would say of an entry."""
        uid, gid = self._tree.owner(entry)
        return BundleStat(
            entry.mode,
            entry.ino,
            entry.nlink,
            uid,
            gid,
            entry.size,
            entry.mtime_ns,
            entry.blocks,
            self._tree.content_type(entry),
            entry.user_data or None,  # the format stores none rather than an empty one
            entry.rdev,
        )

    # -- by path -----------------------------------------------------------------------------------

    def resolve(self, path: Path, *, follow_symlinks: bool = True) -> fmt.Entry:
        """The entry at ``path`` (relative to the bundle root; a leading ``/`` is allowed)."""
        raw, _ = _as_bytes(path)
        return self._resolve(raw, path, follow_symlinks)

    def _resolve(self, raw: bytes, path: Path, follow_last: bool = True) -> fmt.Entry:
        """``tree.resolve``, its errors naming ``path`` as the caller gave it (str or bytes), as
        ``os`` names it in ``filename``: not the symlink target it ended at."""
        try:
            return self._tree.resolve(raw, follow_last=follow_last)
        except (EntryNotFound, NotADirectory) as e:
            e.filename = os.fspath(path)
            raise

    def stat(self, path: Path, *, follow_symlinks: bool = True) -> BundleStat:
        """Like ``os.stat``: a ``BundleStat`` of the entry at ``path`` (a symlink's target unless
        ``follow_symlinks`` is false)."""
        return self.stat_entry(self.resolve(path, follow_symlinks=follow_symlinks))

    def lstat(self, path: Path) -> BundleStat:
        """Like ``os.lstat``: ``stat`` without following a final symlink."""
        return self.stat(path, follow_symlinks=False)

    def exists(self, path: Path) -> bool:
        """Like ``os.path.exists``: whether ``path`` names an entry (not a dangling symlink)."""
        try:
            self.resolve(path)
        except (EntryNotFound, NotADirectory):
            return False
        return True

    def isdir(self, path: Path) -> bool:
        """Like ``os.path.isdir``: whether ``path`` is a directory (symlinks followed)."""
        try:
            return self.resolve(path).is_dir
        except (EntryNotFound, NotADirectory):
            return False

    def isfile(self, path: Path) -> bool:
        """Like ``os.path.isfile``: whether ``path`` is a regular file (symlinks followed)."""
        try:
            return self.resolve(path).is_file
        except (EntryNotFound, NotADirectory):
            return False

    def islink(self, path: Path) -> bool:
        """Like ``os.path.islink``: whether ``path`` is a symbolic link."""
        try:
            return self.resolve(path, follow_symlinks=False).is_symlink
        except (EntryNotFound, NotADirectory):
            return False

    @overload
    def readlink(self, path: StrPath) -> str: ...
    @overload
    def readlink(self, path: BytesPath) -> bytes: ...
    def readlink(self, path: Path) -> str | bytes:
        """Like ``os.readlink``: a symlink's target, ``str`` or ``bytes`` as ``path`` was."""
        raw, text = _as_bytes(path)
        entry = self._resolve(raw, path, False)
        if not entry.is_symlink:
            raise NotASymlink(f"{os.fsdecode(raw)!r} is not a symbolic link", _shown(path))
        return os.fsdecode(entry.symlink) if text else entry.symlink

    @overload
    def scandir(self, path: StrPath = "") -> Iterator[BundleDirEntry[str]]: ...
    @overload
    def scandir(self, path: BytesPath) -> Iterator[BundleDirEntry[bytes]]: ...
    def scandir(self, path: Path = "") -> Iterator[BundleDirEntry[Any]]:
        """Like ``os.scandir``: the entries of a directory, in bytewise name order, without
        I/O. Names and paths are ``str`` or ``bytes``, as ``path`` was given."""
        raw, text = _as_bytes(path)
        directory = self._resolve(raw, path)
        if not directory.is_dir:
            raise NotADirectory(f"{os.fsdecode(raw)!r} is not a directory", _shown(path))
        prefix = raw.rstrip(b"/")
        for name, entry in self._tree.children(directory):
            full = prefix + b"/" + name if prefix else name
            if text:
                yield BundleDirEntry(os.fsdecode(name), os.fsdecode(full), entry, self)
            else:
                yield BundleDirEntry(name, full, entry, self)

    @overload
    def listdir(self, path: StrPath = "") -> list[str]: ...
    @overload
    def listdir(self, path: BytesPath) -> list[bytes]: ...
    def listdir(self, path: Path = "") -> list[Any]:
        """Like ``os.listdir``: the names in a directory (bytewise order), ``str`` or ``bytes``
        as ``path`` was given."""
        return [d.name for d in self.scandir(path)]

    @overload
    def walk(self, top: StrPath = "") -> Iterator[tuple[str, list[str], list[str]]]: ...
    @overload
    def walk(self, top: BytesPath) -> Iterator[tuple[bytes, list[bytes], list[bytes]]]: ...
    def walk(self, top: Path = "") -> Iterator[tuple[Any, list[Any], list[Any]]]:
        """Like ``os.walk``: top-down (prune by editing ``dirs``), symlinked dirs not entered.

        Paths and names come back as ``str`` or ``bytes``, as ``top`` was given. Unlike
        ``os.walk``, a missing ``top`` raises ``EntryNotFound`` rather than yielding nothing.
        """
        pending: list[Any] = [os.fspath(top)]
        while pending:  # iterative: bundles may nest deeper than Python's recursion limit
            current = pending.pop()
            dirs: list[Any] = []
            files: list[Any] = []
            links = set()
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

    # -- the bundle as a collection of paths ------------------------------------------------------

    def __len__(self) -> int:
        """The number of paths: every entry but the root (a hard link's every name counts)."""
        return self.config.entry_count - 1  # inode numbers are 1 … entry_count, the root is 1

    def __contains__(self, path: object) -> bool:
        """Whether ``path`` names an entry, as ``os.path.lexists``: a dangling symlink is in the
        bundle, the root is not (it is not among the paths iteration yields)."""
        if not isinstance(path, (str, bytes, os.PathLike)):
            return False
        try:
            return self.resolve(path, follow_symlinks=False).ino != fmt.ROOT_INO
        except (EntryNotFound, NotADirectory):
            return False

    def __iter__(self) -> Iterator[str]:
        """Every path but the root, in the index's order: breadth first, each directory's names
        in bytewise order (inode order: one forward scan of the index). ``bundle.tree`` yields
        (path, entry) pairs instead."""
        for path, _entry in self._breadth_first():
            yield path

    def _breadth_first(self) -> Iterator[tuple[str, fmt.Entry]]:
        """(path, entry) in inode order, links resolved to their file; a deque of the
        directories still to list is all it holds."""
        pending: deque[tuple[str, fmt.Entry]] = deque([("", self.root)])
        while pending:
            top, directory = pending.popleft()
            for name, entry in self._tree.children(directory):
                path = top + "/" + os.fsdecode(name) if top else os.fsdecode(name)
                yield path, entry
                if entry.is_dir:
                    pending.append((path, entry))

    def iter_files(self) -> Iterator[tuple[str, bytes]]:
        """(path, content) of every regular file, in the order the content is stored.

        The streaming read of a whole bundle (what WebDataset users do with tar shards): the
        files come in shard-stream order, so each record is read and decompressed once (through
        the record cache) however the bundle was packed — a directory pack stores content in
        inode order, an archive pack in the archive's order. A hard-linked file comes once per
        name, each name right after the other, from one read. Each file's CRC is checked
        (``CorruptDataError``); each file is held whole in memory, so read large ones with
        ``open``. Symlinks and directories are not yielded.
        """
        # One scan of the index first, to learn where each file is stored: 24 bytes a file in
        # three arrays, not a tuple and a path string each (~200 bytes).
        keys = array.array("Q")  # shard << 48 | offset: the stream position (format §3)
        files = array.array("Q")  # the inode holding the content (a hard link's target)
        names = array.array("Q")  # the inode of the name (a LINK entry's own)
        dirs = array.array("Q")  # the index in ``dir_paths`` of the directory holding it
        dir_paths: list[str] = []
        pending: deque[tuple[int, fmt.Entry]] = deque()
        dir_paths.append("")
        pending.append((0, self.root))
        in_order = True
        while pending:
            slot, directory = pending.popleft()
            for i, (_name, entry) in enumerate(self._tree.children(directory)):
                if entry.is_dir:
                    top = dir_paths[slot]
                    name = os.fsdecode(entry.name)
                    dir_paths.append(top + "/" + name if top else name)
                    pending.append((len(dir_paths) - 1, entry))
                elif entry.is_file:
                    key = entry.shard << 48 | entry.offset
                    in_order = in_order and (not keys or keys[-1] <= key)
                    keys.append(key)
                    files.append(entry.ino)
                    names.append(directory.first_child + i)  # children are a contiguous range
                    dirs.append(slot)
        order: Iterable[int] = range(len(keys))
        if not in_order:  # stable: a file's names keep their inode order
            order = sorted(order, key=keys.__getitem__)
        last_ino, last_data = 0, b""
        for i in order:
            top = dir_paths[dirs[i]]
            name = os.fsdecode(self._tree.stored_entry(names[i]).name)
            path = top + "/" + name if top else name
            if files[i] != last_ino:
                entry = self._tree.entry(files[i])
                last_ino = entry.ino
                last_data = bytes(self._content.read_at(entry, 0, entry.size, path=path))
            yield path, last_data

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
        """The whole content of the file at ``path``, checked against its CRC32C
        (``CorruptDataError`` if it does not match)."""
        raw, _ = _as_bytes(path)
        entry = self._resolve(raw, path)
        return bytes(self._content.read_at(entry, 0, entry.size, path=os.fsdecode(raw)))

    @overload
    def open(self, path: Path, mode: Literal["rb", "br"] = "rb") -> BundleFile: ...

    @overload
    def open(
        self,
        path: Path,
        mode: Literal["r", "rt", "tr"],
        *,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> io.TextIOWrapper: ...

    @overload
    def open(
        self,
        path: Path,
        mode: str,
        *,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> BundleFile | io.TextIOWrapper: ...

    def open(
        self,
        path: Path,
        mode: str = "rb",
        *,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> BundleFile | io.TextIOWrapper:
        """A read-only file: ``"rb"`` (the default) a seekable ``BundleFile``, ``"r"``/``"rt"``
        text, as the built-in ``open`` gives it (``io.TextIOWrapper`` over a buffered reader;
        ``encoding``, ``errors`` and ``newline`` as there, the locale's encoding by default).

        The default stays binary, unlike the built-in's: that is what data tools hand files to.
        Any writing mode raises ``ValueError``.
        """
        if mode not in _TEXT_MODES and mode not in _BINARY_MODES:
            raise ValueError(f"bundles are read-only: open() takes 'r', 'rt' or 'rb', not {mode!r}")
        binary = "b" in mode
        if binary and (encoding is not None or errors is not None or newline is not None):
            raise ValueError("binary mode doesn't take an encoding, errors or newline argument")
        raw, _ = _as_bytes(path)
        entry = self._resolve(raw, path)
        if entry.is_dir:
            raise IsADirectory(f"{os.fsdecode(raw)!r} is a directory", _shown(path))
        if entry.is_special:
            raise NotARegularFile(f"{os.fsdecode(raw)!r} is not a regular file", _shown(path))
        file = BundleFile(self, entry, os.fsdecode(raw))
        if binary:
            return file
        return io.TextIOWrapper(
            io.BufferedReader(file),
            encoding=io.text_encoding(encoding),
            errors=errors,
            newline=newline,
        )


_TEXT_MODES = ("r", "rt", "tr")
_BINARY_MODES = ("rb", "br")


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
        """True: a bundle file is read-only and readable."""
        return True

    def seekable(self) -> bool:
        """True: any offset can be read (only the records it touches are loaded)."""
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to ``offset`` from the start, the current position or the end (``whence``);
        returns the new position."""
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
        """The current position."""
        return self._pos

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes from the current position (all the rest if negative)."""
        if self.closed:
            raise ValueError("read of a closed file")
        if size is None or size < 0:
            size = max(0, self._entry.size - self._pos)
        data = bytes(self._bundle.content.read_at(self._entry, self._pos, size, path=self.name))
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        """The rest of the file."""
        return self.read(-1)

    def readinto(self, buffer) -> int:
        """Read into ``buffer``; returns the number of bytes read (0 at the end)."""
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    @property
    def size(self) -> int:
        """The file's size in bytes."""
        return self._entry.size

    def fileno(self) -> int:
        """Raises ``io.UnsupportedOperation``: a file inside a bundle has no descriptor."""
        raise io.UnsupportedOperation("a bundle file has no file descriptor")
