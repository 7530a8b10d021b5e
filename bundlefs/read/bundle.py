"""``Bundle``: an open bundle, read by path like a read-only file system, without FUSE.

A thin facade: it opens the bundle's parts (read/assemble.py) and hands the work to the two
models among them — ``bundle.tree`` (read/tree.py: entries, lookups, listings, path resolution)
and ``bundle.content`` (read/content.py: file bytes, the record cache). Programs use the path
methods here (``stat``, ``listdir``, ``scandir``, ``walk``, ``read``, ``open``, ``glob``…); the
FUSE adapter, ``extract`` and ``verify`` use ``tree`` and ``content`` by inode.

It is also a read-only mapping of the regular files' paths to their bytes (``b[path]``, ``in``,
``len``, ``items()`` in stored order: read/mapping.py), lists every path (``paths``), streams
every file in stored order (``iter_files``, read/stream.py) or every sample (``iter_samples``,
read/samples.py), and pickles to its location, so
spawned workers reopen it (docs/python.md).

A bundle at a URL (``s3://bucket/x.bundle``; storage/location.py) opens the same way: its index
is fetched into a local cache and opened from there, and its shards are read through a
``RemoteShardStore`` (storage/objectstore/, docs/storage.md); everything above the store is the
same.

Synchronous and thread-safe; forked children reopen LMDB on their own (see storage/index.py).
May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.read``.
"""

from __future__ import annotations

import io
import os
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal, overload

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
from bundlefs.read import stream
from bundlefs.read.assemble import BundleParts
from bundlefs.read.cache import CacheStats, RecordCache
from bundlefs.read.content import ContentReader
from bundlefs.read.facts import BundleInfo, ShardDamage, shard_bytes, shard_damage
from bundlefs.read.fileobj import BundleFile, check_mode, opened
from bundlefs.read.mapping import BundleMapping
from bundlefs.read.options import ReadKeywords, ReadOptions
from bundlefs.read.paths import (
    BundleDirEntry,
    BundleStat,
    BytesPath,
    Path,
    StrPath,
    as_bytes,
    entry_stat,
    shown,
)
from bundlefs.read.samples import StreamMethods
from bundlefs.read.tree import TreeModel
from bundlefs.storage.liveness import (
    DEFAULT_MIN_LIVE,
    Liveness,
    SharedContent,
    shard_liveness,
)
from bundlefs.storage.location import Location, parse_location
from bundlefs.storage.store import FailedRead

if TYPE_CHECKING:
    from typing_extensions import Unpack

_open_bundles: weakref.WeakSet[Bundle] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # Data loaders fork workers from a process that may be reading: a load another thread had in
    # flight never finishes in the child, and a lock held at the fork stays held. (The index
    # reopens LMDB on its own: storage/index.py.)
    for bundle in list(_open_bundles):
        bundle._parts.forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _reopen(location: str, bundle_id: bytes, options: ReadOptions) -> Bundle:
    """Unpickling a ``Bundle``: open it again where it was, with the options it was opened with."""
    bundle = Bundle(location, options=options)
    if bundle._parts.index.marker.bundle_id != bundle_id:
        # A `pack --force` replaced it since it was pickled: a worker serving the new bundle to a
        # parent that indexed the old one would mix two datasets without a word.
        bundle.close()
        raise FormatError(f"the bundle at {location} was replaced since it was pickled")
    return bundle


class Bundle(BundleMapping, StreamMethods):
    """An open bundle. Use as a context manager, or call ``close()``.

    ``path`` is a directory or a URL (``s3://bucket/x.bundle``). The options are the fields of
    ``ReadOptions`` and ``RemoteOptions`` (read/options.py; the latter mean nothing to a local
    bundle), as keywords (``Bundle(path, cache_size=…, storage_options=…)``) or as one value
    (``options=ReadOptions(…)``, which keywords given too override).

    Picklable to its location, ``bundle_id`` and options: unpickling opens it again there (a
    fresh cache; not ``hold_index_resident``), so spawned data-loader workers can take it; it
    raises ``FormatError`` if another bundle has replaced it there since. Pickling a closed
    bundle raises ``BundleClosedError`` (an open copy of a closed bundle would hide a bug).
    """

    def __init__(
        self, path: Path, *, options: ReadOptions | None = None, **keywords: Unpack[ReadKeywords]
    ) -> None:
        options = (options or ReadOptions()).with_keywords(**keywords)
        self.location: Location = parse_location(
            os.fsdecode(os.fspath(path)), options.remote.storage_options
        )
        self.options = options if not self.location.is_local else options.local()
        self._closed = False
        self._parts = parts = BundleParts.open(self.location, options)
        self._index, self._tree, self._content = parts.index, parts.tree, parts.content
        self.path = parts.path
        # For pickling: absolute now, as the process may change directory before it pickles.
        self._where = os.path.abspath(self.path) if self.location.is_local else self.location.url
        self.config = self._index.config
        self._shard_bytes: int | None = None
        # A truncated (or missing, or grown) shard is said at once, not by the first failed read.
        self.damaged_shards: list[ShardDamage] = shard_damage(self._parts)
        _open_bundles.add(self)

    @property
    def tree(self) -> TreeModel:
        """The tree by inode (read/tree.py): the path methods, the mount and ``extract`` use it."""
        return self._tree

    @property
    def content(self) -> ContentReader:
        """File bytes by entry (read/content.py), through the record cache."""
        return self._content

    @property
    def root(self) -> fmt.Entry:
        """The root directory's entry."""
        return self._tree.root

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, tuple[str, bytes, ReadOptions]]:
        if self._closed:
            raise BundleClosedError(f"cannot pickle the closed bundle {self.path}")
        return _reopen, (self._where, self._index.marker.bundle_id, self.options)

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def close(self) -> None:
        """Close the index and the shards; later use raises ``BundleClosedError``. Idempotent."""
        self._closed = True
        self._parts.close()

    # -- facts about the bundle --------------------------------------------------------------------

    def info(self, *, dead: bool = False, min_live: float = DEFAULT_MIN_LIVE) -> BundleInfo:
        """Facts about the bundle: counts, sizes, layout, compression, metadata (as `info`).

        ``dead``: also how many stored bytes no file of this bundle uses, and how many shards are
        less live than ``min_live``, and how many files share an earlier file's bytes (dedup)
        (``info --dead``; one pass over the index, ~1.5 s per million files, no shard read)."""
        if self._shard_bytes is None:
            self._shard_bytes = shard_bytes(self._index)
        liveness = None
        if dead:
            shared = SharedContent()
            liveness = Liveness.of(shard_liveness(self._index, shared), min_live, shared)
        return BundleInfo.of(self._parts, self._shard_bytes, liveness)

    def storage_stats(self) -> dict[str, object] | None:
        """A bundle at a URL: its store's counters (docs/storage.md); None for a local one."""
        return self._parts.storage_stats()

    def storage_failed_read(self, error: CorruptDataError) -> FailedRead:
        """A read failed with ``error``: damage, or the object store's outage (named in the
        store's log; ``OUTAGE_RETRY``: the same read retried, not to be counted again)."""
        return self._parts.failed_read(error)

    def hold_index_resident(self) -> int:
        """Keep the whole index in memory (mapped) until ``close``, for a long-lived reader (the
        mount); returns its size in bytes. ``OSError`` where the kernel cannot (Linux < 5.14)."""
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
        return entry_stat(self._tree, entry)

    # -- by path -----------------------------------------------------------------------------------

    def resolve(self, path: Path, *, follow_symlinks: bool = True) -> fmt.Entry:
        """The entry at ``path`` (relative to the bundle root; a leading ``/`` is allowed)."""
        raw, _ = as_bytes(path)
        return self._resolve(raw, path, follow_symlinks)

    def _resolve(self, raw: bytes, path: Path, follow_last: bool = True) -> fmt.Entry:
        """``tree.resolve``, its errors naming ``path`` as the caller gave it, as ``os`` does."""
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

    def du(self, path: Path = "", *, follow_symlinks: bool = False) -> fmt.TreeTotals:
        """What lies below ``path``: files (each inode once), directories (itself excluded),
        the files' bytes, entries of every kind; a file is one file of its size. Stored in a
        version 5 bundle (one lookup); added up by a walk of the subtree in older ones."""
        return self._tree.totals(self.resolve(path, follow_symlinks=follow_symlinks))

    def _found(self, path: Path, follow_symlinks: bool = True) -> fmt.Entry | None:
        """The entry at ``path``, or None where there is none (as ``os.path``'s tests take it)."""
        try:
            return self.resolve(path, follow_symlinks=follow_symlinks)
        except (EntryNotFound, NotADirectory):
            return None

    def exists(self, path: Path) -> bool:
        """Like ``os.path.exists``: whether ``path`` names an entry (not a dangling symlink)."""
        return self._found(path) is not None

    def isdir(self, path: Path) -> bool:
        """Like ``os.path.isdir``: whether ``path`` is a directory (symlinks followed)."""
        return (entry := self._found(path)) is not None and entry.is_dir

    def isfile(self, path: Path) -> bool:
        """Like ``os.path.isfile``: whether ``path`` is a regular file (symlinks followed)."""
        return (entry := self._found(path)) is not None and entry.is_file

    def islink(self, path: Path) -> bool:
        """Like ``os.path.islink``: whether ``path`` is a symbolic link."""
        return (entry := self._found(path, False)) is not None and entry.is_symlink

    @overload
    def readlink(self, path: StrPath) -> str: ...
    @overload
    def readlink(self, path: BytesPath) -> bytes: ...
    def readlink(self, path: Path) -> str | bytes:
        """Like ``os.readlink``: a symlink's target, ``str`` or ``bytes`` as ``path`` was."""
        raw, text = as_bytes(path)
        entry = self._resolve(raw, path, False)
        if not entry.is_symlink:
            raise NotASymlink(f"{os.fsdecode(raw)!r} is not a symbolic link", shown(path))
        return os.fsdecode(entry.symlink) if text else entry.symlink

    @overload
    def scandir(self, path: StrPath = "") -> Iterator[BundleDirEntry[str]]: ...
    @overload
    def scandir(self, path: BytesPath) -> Iterator[BundleDirEntry[bytes]]: ...
    def scandir(self, path: Path = "") -> Iterator[BundleDirEntry[Any]]:
        """Like ``os.scandir``: the entries of a directory, in bytewise name order, without
        I/O. Names and paths are ``str`` or ``bytes``, as ``path`` was given."""
        raw, text = as_bytes(path)
        directory = self._resolve(raw, path)
        if not directory.is_dir:
            raise NotADirectory(f"{os.fsdecode(raw)!r} is not a directory", shown(path))
        prefix = raw.rstrip(b"/")
        for name, entry in self._tree.children(directory):
            full = prefix + b"/" + name if prefix else name
            if text:
                yield BundleDirEntry(os.fsdecode(name), os.fsdecode(full), entry, self._tree)
            else:
                yield BundleDirEntry(name, full, entry, self._tree)

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
        return stream.walk(self.scandir, os.fspath(top))

    # -- every path; the mapping of files is read/mapping.py ---------------------------------------

    def paths(self) -> Iterator[str]:
        """Every path but the root (directories, symlinks, every name of a hard link), in the
        index's order: breadth first, each directory's names in bytewise order (one forward scan
        of the index). ``bundle.tree`` yields (path, entry) pairs instead."""
        for path, _entry in stream.breadth_first(self._tree):
            yield path

    def lexists(self, path: Path) -> bool:
        """Like ``os.path.lexists``: whether ``path`` names an entry, a dangling symlink too."""
        return self._found(path, False) is not None

    def glob(self, pattern: str) -> list[str]:
        """Paths matching a shell pattern; ``*`` does not cross ``/``; ``**`` matches any depth."""
        return stream.glob(self.walk(""), pattern)

    def read(self, path: Path) -> bytes:
        """The whole content of the file at ``path``, checked against its CRC32C
        (``CorruptDataError`` if it does not match)."""
        raw, _ = as_bytes(path)
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
        check_mode(mode, encoding, errors, newline)
        raw, _ = as_bytes(path)
        entry = self._resolve(raw, path)
        if entry.is_dir:
            raise IsADirectory(f"{os.fsdecode(raw)!r} is a directory", shown(path))
        if entry.is_special:
            raise NotARegularFile(f"{os.fsdecode(raw)!r} is not a regular file", shown(path))
        return opened(
            BundleFile(self._content, entry, os.fsdecode(raw)), mode, encoding, errors, newline
        )
