"""Paths as ``os`` takes them, and the values the path API gives back.

``Path`` (``str``, ``bytes`` or path-like), the bytes a tree lookup takes (``as_bytes``), the
``BundleStat`` that ``stat`` returns (``entry_stat``), the ``BundleDirEntry`` that ``scandir``
yields (it holds the tree, not the ``Bundle``), and shell-pattern matching for ``glob``.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.read.tree``.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from typing import AnyStr, Generic

from bundlefs.core import format as fmt
from bundlefs.errors import EntryNotFound, NotADirectory
from bundlefs.read.tree import TreeModel

Path = str | bytes | os.PathLike
StrPath = str | os.PathLike[str]
BytesPath = bytes | os.PathLike[bytes]


def shown(path: Path) -> str | bytes:
    """``path`` as an error's ``filename``: as the caller gave it, like ``os`` does."""
    return os.fspath(path)


def as_bytes(path: Path) -> tuple[bytes, bool]:
    """The path as bytes, and whether the caller gave text (so results go back as text)."""
    path = os.fspath(path)
    if isinstance(path, str):
        return os.fsencode(path), True
    return path, False


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
    # A regular file's content digest, SHA-256's first 16 bytes (format version 5), or None.
    digest: bytes | None = None

    @property
    def st_mtime(self) -> float:
        """The modification time in seconds (``st_mtime_ns`` is exact)."""
        return self.st_mtime_ns / 1e9


def entry_stat(tree: TreeModel, entry: fmt.Entry) -> BundleStat:
    """What ``os.stat`` would say of an entry of ``tree``."""
    uid, gid = tree.owner(entry)
    return BundleStat(
        entry.mode,
        entry.ino,
        entry.nlink,
        uid,
        gid,
        entry.size,
        entry.mtime_ns,
        entry.blocks,
        tree.content_type(entry),
        entry.user_data or None,  # the format stores none rather than an empty one
        entry.rdev,
        entry.digest or None,
    )


@dataclass(frozen=True, slots=True)
class BundleDirEntry(Generic[AnyStr]):
    """One item of ``scandir``: like ``os.DirEntry``, without I/O (``str`` or ``bytes`` names, as
    the path given to ``scandir`` was)."""

    name: AnyStr
    path: AnyStr
    entry: fmt.Entry
    _tree: TreeModel

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
        return entry_stat(self._tree, self._resolved(follow_symlinks))

    def inode(self) -> int:
        """Its inode number in the bundle (as the mount shows it)."""
        return self.entry.ino

    def _resolved(self, follow: bool) -> fmt.Entry:
        if follow and self.entry.is_symlink:
            try:
                return self._tree.resolve(as_bytes(self.path)[0], follow_last=True)
            except (EntryNotFound, NotADirectory):
                return self.entry
        return self.entry


def glob_match(path: list[str], pattern: list[str]) -> bool:
    """Whether a path's parts match a pattern's: ``*`` within one part, ``**`` any depth."""
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(glob_match(path[i:], rest) for i in range(len(path) + 1))
    if not path:
        return False
    return fnmatch.fnmatchcase(path[0], head) and glob_match(path[1:], rest)
