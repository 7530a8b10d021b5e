"""``AddedTree``: the entries a ``Writer`` is given one at a time, in any order, held in a
temporary SQLite table until the builder walks them breadth first (``bundlefs.packing.writer``).

A Writer stores each file's content as it is added (in add order, through the content writer), so
what the tree keeps of a file is where that content went (the shard, offset, size, CRC and
digest of its ``StoredContent``, and its content type) with its attributes. The table is keyed by
(the parent directory's number, name): a directory's children are one range scan in bytewise name
order, the order the builder numbers them in, and a path added twice is found by one look-up.

Rules:

- a path (``split_path``) is relative and POSIX: components joined by single ``/``, none empty,
  ``.`` or ``..``, none holding a NUL or over 255 bytes (``synthetic.name_problem``); a ``str`` is
  encoded as ``os.fsencode`` encodes it (UTF-8, surrogate escapes giving back other bytes);
- the directories above a path are implied (mode 0755, the tree's default owner and mtime); a
  directory added itself takes the add's attributes, once;
- a path added twice is a ``DuplicatePathError``, a path through a file or symlink an
  ``InvalidEntryError``: both raised before anything is stored, the tree unchanged.

What an add is given is checked here too: its attributes (``entry_stat``) and its content, bytes
or a binary stream read once (``content_chunks``).

Memory: SQLite's page cache (``CACHE_KIB``), a bounded map of recently used directories' numbers,
and the numbers of the directories the builder was given but has not listed yet. The table is a
file (a few tens of bytes per entry beyond its name), removed by ``close``.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.packing.sources.base``,
``bundlefs.packing.sources.synthetic``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat as statmod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypedDict

from bundlefs.core import format as fmt
from bundlefs.errors import DuplicatePathError, InvalidEntryError, PackError
from bundlefs.packing.sources.base import READ_CHUNK, Content, SourceItem, StoredContent
from bundlefs.packing.sources.synthetic import DIR_MODE, name_problem

CACHE_KIB = 8192  # SQLite's page cache: what the table costs in memory, however large it grows
_NUMBERS_KEPT = 4096  # directories whose numbers are remembered (the map is cleared when full)
_ROOT = 0  # the root directory's number

_SCHEMA = """
CREATE TABLE entry (
    parent INTEGER NOT NULL,     -- the number of the directory holding it
    name BLOB NOT NULL,
    mode INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL, mtime INTEGER NOT NULL,
    dir INTEGER,                 -- a directory's own number; NULL for anything else
    explicit INTEGER NOT NULL,   -- 0: a directory only implied by the paths below it
    shard INTEGER, pos INTEGER, size INTEGER, crc INTEGER,  -- a file's content: where it went,
    ctype TEXT, digest BLOB,                                -- its media type and digest
    target BLOB,                 -- a symlink's
    udata BLOB,
    PRIMARY KEY (parent, name)
) WITHOUT ROWID
"""
_FIND = "SELECT dir, explicit FROM entry WHERE parent = ? AND name = ?"
_INSERT = "INSERT INTO entry VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_REDESCRIBE = (
    "UPDATE entry SET mode = ?, uid = ?, gid = ?, mtime = ?, explicit = 1, udata = ? "
    "WHERE parent = ? AND name = ?"
)
_LIST = (
    "SELECT name, mode, uid, gid, mtime, dir, shard, pos, size, crc, ctype, digest, target, udata "
    "FROM entry WHERE parent = ? ORDER BY name"
)


@dataclass(frozen=True, slots=True)
class AddedStat:
    """An added entry's status (a ``sources.base.Stat``), with its user data and, for a symlink,
    its target: what the builder records, read back from the table."""

    st_mode: int
    st_uid: int
    st_gid: int
    st_mtime_ns: int
    st_size: int = 0
    user_data: bytes | None = None  # None: the Writer's user_data callable says, if it has one
    target: bytes | None = None
    st_nlink: int = 1
    st_dev: int = 0
    st_ino: int = 0
    st_rdev: int = 0


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a new entry goes: its parent's number and its name; ``implied`` is the number of the
    implied directory already there (which only an explicit directory may describe)."""

    parent: int
    name: bytes
    implied: int | None = None


def split_path(
    path: str | bytes | os.PathLike[str] | os.PathLike[bytes],
) -> tuple[bytes, list[bytes]]:
    """``path`` as bytes and as its components; ``InvalidEntryError`` for one no bundle holds."""
    try:
        rel = os.fsencode(path)
    except TypeError:
        raise TypeError(f"a path is str, bytes or path-like, not {type(path).__name__}") from None
    if not rel:
        raise InvalidEntryError("an empty path names the root, which the Writer makes itself")
    parts = rel.split(b"/")
    why = name_problem(parts)
    if why is not None:
        raise InvalidEntryError(f"cannot add {os.fsdecode(rel)!r}: {why}")
    return rel, parts


class Attributes(TypedDict, total=False):
    """What an add may give besides the path (each optional): ``mtime`` in seconds or
    ``mtime_ns`` (default: the bundle's creation time), ``uid`` and ``gid`` (default: the
    Writer's), ``user_data`` (at most 4096 bytes; default: none, or what the Writer's
    ``user_data`` callable says)."""

    mtime: float
    mtime_ns: int
    uid: int
    gid: int
    user_data: bytes


def entry_stat(kind: int, mode: int, attributes: Attributes, defaults: AddedStat) -> AddedStat:
    """The status of a new entry of file type ``kind`` (``stat.S_IFREG`` ...), checked, with
    ``defaults``' owner and mtime where ``attributes`` give none; ``InvalidEntryError`` for a
    value a bundle cannot hold, ``TypeError`` for an unknown attribute."""
    unknown = sorted(set(attributes) - set(Attributes.__annotations__))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    if mode < 0 or statmod.S_IFMT(mode) not in (0, kind) or mode & ~(kind | 0o7777):
        raise InvalidEntryError(f"mode {mode:#o} is not the permission bits of this entry")
    uid = attributes.get("uid", defaults.st_uid)
    gid = attributes.get("gid", defaults.st_gid)
    if not (0 <= uid < 2**32 and 0 <= gid < 2**32):
        raise InvalidEntryError(f"owner {uid}:{gid} is outside 0 to 2^32 - 1")
    if "mtime" in attributes and "mtime_ns" in attributes:
        raise TypeError("give mtime (seconds) or mtime_ns, not both")
    ns = attributes.get("mtime_ns", defaults.st_mtime_ns)
    if "mtime" in attributes:
        seconds = attributes["mtime"]
        ns = seconds * 10**9 if isinstance(seconds, int) else round(seconds * 1e9)
    if not -(2**63) <= ns < 2**63:
        raise InvalidEntryError(f"mtime {ns} ns is outside what a bundle stores (1678 to 2262)")
    user_data = attributes.get("user_data")
    if user_data is not None:
        user_data = bytes(user_data)
        if len(user_data) > fmt.MAX_USER_DATA:
            raise InvalidEntryError(f"user data is over {fmt.MAX_USER_DATA} bytes")
    return AddedStat(kind | statmod.S_IMODE(mode), uid, gid, int(ns), user_data=user_data)


def check_data(data: object) -> None:
    """``TypeError`` unless ``data`` is bytes-like or has ``read``."""
    if not isinstance(data, bytes | bytearray | memoryview) and not hasattr(data, "read"):
        raise TypeError(f"data is bytes or a binary file object, not {type(data).__name__}")


def content_chunks(rel: bytes, data: Any, threshold: int) -> tuple[Iterable[bytes], int | None]:
    """``data`` (checked by ``check_data``) as chunks, and its size if it is known before it is
    stored: a stream is read ahead up to ``threshold`` + 1 bytes, so a small one's size is known
    and a larger one is placed as a large file (``fmt.Config.large_file_threshold``)."""
    if isinstance(data, bytes | bytearray | memoryview):
        whole = bytes(data)
        return (whole,), len(whole)
    head = bytearray()
    while len(head) <= threshold:
        chunk = _read(rel, data.read, threshold + 1 - len(head))
        if not chunk:
            return (bytes(head),), len(head)
        head += chunk
    return _stream(rel, data.read, bytes(head)), None


def _stream(rel: bytes, read: Callable[[int], Any], head: bytes) -> Iterator[bytes]:
    yield head
    while chunk := _read(rel, read, READ_CHUNK):
        yield chunk


def _read(rel: bytes, read: Callable[[int], Any], size: int) -> bytes:
    """One read of the caller's stream; its ``OSError`` is a ``PackError`` naming the path (so
    an ``OSError`` out of the content writer is always the bundle's own)."""
    try:
        chunk = read(size)
    except OSError as e:
        raise PackError(f"cannot read the data for {os.fsdecode(rel)}: {e.strerror or e}") from e
    if chunk is None:  # a non-blocking stream with nothing ready
        raise PackError(f"the data for {os.fsdecode(rel)} is a non-blocking stream")
    if not isinstance(chunk, bytes | bytearray):
        what = type(chunk).__name__
        raise TypeError(f"the data for {os.fsdecode(rel)} reads as {what}, not bytes")
    return bytes(chunk)


class AddedTree:
    """The table of added entries at ``path`` (a new file), then an ``EntrySource`` over it.

    ``root`` is the root directory's status (and the attributes implied directories take, but
    for their mode). Not thread-safe: the ``Writer`` adds one entry at a time.
    """

    def __init__(self, path: str, root: AddedStat) -> None:
        self.path = path
        self._root = root
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            for pragma in (
                "journal_mode = OFF",  # a scratch table: a crash loses nothing worth keeping
                "synchronous = OFF",
                "locking_mode = EXCLUSIVE",
                f"cache_size = -{CACHE_KIB}",
            ):
                self._db.execute(f"PRAGMA {pragma}")
            self._db.execute(_SCHEMA)
            self._db.execute("BEGIN")  # one transaction: pages beyond the cache spill to the file
        except sqlite3.Error as e:
            raise PackError(f"cannot keep the added entries in {path}: {e}") from e
        self._numbers: dict[bytes, int] = {b"": _ROOT}  # a directory's path -> its number
        self._next_number = _ROOT + 1
        self._unlisted: dict[bytes, int] = {b"": _ROOT}  # delivered, not yet listed

    def _run(self, sql: str, args: tuple[object, ...]) -> sqlite3.Cursor:
        """``sql`` executed; SQLite's failure (a full disk) is a ``PackError``."""
        try:
            return self._db.execute(sql, args)
        except sqlite3.Error as e:
            raise PackError(f"cannot keep the added entries in {self.path}: {e}") from e

    def close(self) -> None:
        """Drop the table (its file is removed)."""
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)

    # -- adding ------------------------------------------------------------------------------------

    def slot(self, rel: bytes, parts: list[bytes], *, directory: bool = False) -> Slot:
        """Where the entry at ``rel`` goes, its parents implied; ``DuplicatePathError`` if the
        path is taken (an implied directory is not taken for a ``directory``)."""
        parent = self._directory(rel, parts[:-1])
        found = self._run(_FIND, (parent, parts[-1])).fetchone()
        if found is None:
            return Slot(parent, parts[-1])
        number, explicit = found
        if directory and number is not None and not explicit:
            return Slot(parent, parts[-1], implied=number)
        how = "" if explicit else " (as a directory, implied by the paths below it)"
        raise DuplicatePathError(f"cannot add {os.fsdecode(rel)!r}: it was added already{how}")

    def put_file(
        self, slot: Slot, st: AddedStat, stored: StoredContent, content_type: str | None
    ) -> None:
        content = (stored.shard, stored.offset, stored.size, stored.crc32c, content_type)
        self._insert(slot, st, None, *content, stored.digest)

    def put_symlink(self, slot: Slot, st: AddedStat) -> None:
        self._insert(slot, st, None)

    def put_dir(self, slot: Slot, st: AddedStat) -> None:
        if slot.implied is not None:
            self._run(
                _REDESCRIBE,
                (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.user_data)
                + (slot.parent, slot.name),
            )
            return
        self._insert(slot, st, self._new_number())

    def _insert(self, slot: Slot, st: AddedStat, number: int | None, *content: object) -> None:
        shard, offset, size, crc, content_type, digest = content or (None,) * 6
        self._run(
            _INSERT,
            (slot.parent, slot.name, st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, number)
            + (int(number is not None), shard, offset, size, crc, content_type, digest, st.target)
            + (st.user_data,),
        )

    def _new_number(self) -> int:
        number = self._next_number
        self._next_number += 1
        return number

    def _directory(self, rel: bytes, parts: list[bytes]) -> int:
        """The number of the directory ``parts``, created (implied) where missing."""
        key = b"/".join(parts)
        number = self._numbers.get(key)
        if number is not None:
            return number
        number = _ROOT
        for i, name in enumerate(parts):
            found = self._run(_FIND, (number, name)).fetchone()
            if found is None:  # implied: mode 0755, the root's owner and mtime
                child, root = self._new_number(), self._root
                owner_mtime = (root.st_uid, root.st_gid, root.st_mtime_ns)
                self._run(_INSERT, (number, name, DIR_MODE, *owner_mtime, child, 0) + (None,) * 8)
                number = child
            elif found[0] is None:
                through = os.fsdecode(b"/".join(parts[: i + 1]))
                raise InvalidEntryError(
                    f"cannot add {os.fsdecode(rel)!r}: it leads through {through!r}, which is "
                    "not a directory"
                )
            else:
                number = found[0]
        if len(self._numbers) >= _NUMBERS_KEPT:
            self._numbers = {b"": _ROOT}
        self._numbers[key] = number
        return number

    # -- the EntrySource ---------------------------------------------------------------------------

    def root(self) -> SourceItem:
        return SourceItem(b"", b"", self._root)

    def children(self, rel: bytes) -> Iterator[SourceItem]:
        number = self._unlisted.pop(rel)
        prefix = rel + b"/" if rel else b""
        rows = self._run(_LIST, (number,))
        try:
            for row in rows:
                name, mode, uid, gid, mtime, directory, shard, offset, size, crc = row[:10]
                content_type, digest, target, user_data = row[10:]
                child = prefix + name
                st = AddedStat(mode, uid, gid, mtime, size or 0, user_data, target)
                if directory is not None:
                    self._unlisted[child] = directory
                    yield SourceItem(child, name, st)
                elif shard is not None:
                    stored = StoredContent(shard, offset, size, crc, st, b"", content_type, digest)
                    yield SourceItem(child, name, st, stored=stored)
                else:
                    yield SourceItem(child, name, st)
        except sqlite3.Error as e:
            raise PackError(f"cannot read the added entries in {self.path}: {e}") from e

    def readlink(self, item: SourceItem) -> bytes:
        target = getattr(item.st, "target", None)
        if target is None:
            raise OSError(errno.EINVAL, "not a symbolic link")
        return target

    def open(self, item: SourceItem) -> Content:
        # Every file item carries ``stored``: the builder never asks.
        raise OSError(errno.EINVAL, "the content was stored when it was added")
