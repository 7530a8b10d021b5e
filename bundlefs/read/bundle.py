"""``Bundle``: an open bundle, read by path like a read-only file system, without FUSE.

A thin facade: it opens the index and the shards and hands the work to the two models below it —
``bundle.tree`` (read/tree.py: entries, lookups, listings, path resolution) and
``bundle.content`` (read/content.py: file bytes, the record cache). Programs use the path methods
here (``stat``, ``listdir``, ``scandir``, ``walk``, ``read``, ``open``, ``glob``…); the FUSE
adapter, ``extract`` and ``verify`` use ``tree`` and ``content`` by inode.

Synchronous and thread-safe; forked children reopen LMDB on their own (see storage/index.py).
May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.read``.
"""

from __future__ import annotations

import fnmatch
import io
import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.errors import EntryNotFound, IsADirectory, NotADirectory, NotASymlink
from bundlefs.read.cache import CacheStats, RecordCache
from bundlefs.read.content import ContentReader
from bundlefs.read.tree import DEFAULT_NAME_CACHE, TreeModel
from bundlefs.storage.index import IndexReader
from bundlefs.storage.shards import ShardSet
from bundlefs.storage.store import LocalShardStore

DEFAULT_CACHE_SIZE = 256 * 1024 * 1024

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

    def to_dict(self) -> dict[str, object]:
        """The facts ``bundlefs info --json`` prints, in its key order (docs/cli.md)."""
        c = self.config
        return {
            "path": self.path,
            "bundle_id": self.bundle_id.hex(),
            "format_version": fmt.FORMAT_VERSION,
            "files": c.file_count,
            "dirs": c.dir_count,
            "symlinks": c.symlink_count,
            "hardlinks": c.hardlink_count,
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
        }


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
            store = LocalShardStore(self.path)
        except BaseException:
            self._index.close()
            raise
        self._shards = ShardSet(store, self._index.marker)
        try:
            self.tree = TreeModel(self._index, name_cache=name_cache)
        except BaseException:
            self._shards.close()  # and the bundle directory's descriptor with it
            self._index.close()
            raise
        self.root = self.tree.root
        self.content = ContentReader(
            self._index,
            self._shards,
            RecordCache(cache_size),
            bundle_path=self.path,
            path_of=self.tree.path_of,
        )
        self._shard_bytes: int | None = None
        self._store = store
        _open_bundles.add(self)

    def _forked(self) -> None:
        self.content.forked()
        self.tree.forked()
        self._store.forked()

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._shards.close()
        self._index.close()
        self.content.cache.clear()
        self.tree.clear()

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

    @property
    def cache(self) -> RecordCache:
        return self.content.cache

    def cache_stats(self) -> CacheStats:
        return self.content.cache.stats()

    def stat_entry(self, entry: fmt.Entry) -> BundleStat:
        """What ``os.stat`` would say of an entry."""
        uid, gid = self.tree.owner(entry)
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

    # -- by path -----------------------------------------------------------------------------------

    def resolve(self, path: Path, *, follow_symlinks: bool = True) -> fmt.Entry:
        """The entry at ``path`` (relative to the bundle root; a leading ``/`` is allowed)."""
        raw, _ = _as_bytes(path)
        return self.tree.resolve(raw, follow_last=follow_symlinks)

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
        entry = self.tree.resolve(raw, follow_last=False)
        if not entry.is_symlink:
            raise NotASymlink(f"{os.fsdecode(raw)!r} is not a symbolic link")
        return os.fsdecode(entry.symlink) if text else entry.symlink

    def scandir(self, path: Path = "") -> Iterator[BundleDirEntry]:
        raw, text = _as_bytes(path)
        directory = self.tree.resolve(raw)
        if not directory.is_dir:
            raise NotADirectory(f"{os.fsdecode(raw)!r} is not a directory")
        prefix = raw.rstrip(b"/")
        for name, entry in self.tree.children(directory):
            full = prefix + b"/" + name if prefix else name
            if text:
                yield BundleDirEntry(os.fsdecode(name), os.fsdecode(full), entry, self)
            else:
                yield BundleDirEntry(name, full, entry, self)

    def listdir(self, path: Path = "") -> list:
        return [d.name for d in self.scandir(path)]

    def walk(self, top: Path = "") -> Iterator[tuple[Any, list[Any], list[Any]]]:
        """Like ``os.walk``: top-down (prune by editing ``dirs``), symlinked dirs not entered.

        Paths and names come back as ``str`` or ``bytes``, as ``top`` was given.
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

    def __iter__(self) -> Iterator[tuple[str, fmt.Entry]]:
        """Every entry but the root as (path, entry): depth first, each directory's names in
        order; a hard link's entry is the file it names."""
        return iter(self.tree)

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
        entry = self.tree.resolve(raw)
        return bytes(self.content.read_at(entry, 0, entry.size, path=os.fsdecode(raw)))

    def open(self, path: Path, mode: str = "rb") -> BundleFile:
        if mode not in ("r", "rb"):
            raise ValueError("bundles are read-only: open() takes mode 'rb' only")
        raw, _ = _as_bytes(path)
        entry = self.tree.resolve(raw)
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
        data = bytes(self._bundle.content.read_at(self._entry, self._pos, size, path=self.name))
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
