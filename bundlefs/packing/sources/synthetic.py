"""A tree of made-up entries, for sources whose entries are not a directory on disk: archives
(tar and zip members), listed paths, generated trees.

``SyntheticStat`` is the status such a source makes up for an entry. ``SyntheticTree`` places
entries by path the way ``tar -x`` would, refusing (never following) what a bundle cannot hold:

- parent directories a path implies are created with mode 0755 and the owner and mtime of the
  first entry below them; the root too, unless an entry describes it;
- a name given twice: the last entry wins, but a directory that already has children is never
  replaced by a non-directory, and a path that leads through a symlink or a file is refused;
- a hard link is one more name of the content it names (``st_nlink`` counts the names left at
  the end, ``st_ino`` is the content's number);
- ``name_problem`` is the one set of name rules: no empty, ``.`` or ``..`` component, none over
  ``fmt.MAX_NAME`` bytes, no NUL.

The tree is then an ``EntrySource`` (``root``, ``children``, ``readlink``) whose file items carry
their ``stored`` content; ``LoadedTreeSource`` is that side of a source built on one.

Memory: none per entry. The tree is two tables of SQLite (the standard library) in a private
temporary file (``tree_table``: removed as it is opened, so a killed pack leaves none), keyed by
(parent directory's number, name) as the ``Writer``'s ``AddedTree`` is: a directory's children
are one range scan in bytewise name order. What stays in memory is SQLite's page cache
(``tree_table.CACHE_KIB``), a bounded map of recently used directories' numbers and the
directories delivered but not yet listed. A file keeps what ``detect`` needs of its first bytes
(``content_types.HeadFacts``), not the bytes. Held in a Python tree, a tar member cost ~1.4 KB
of memory: 15 GB for a tar of 10,000,000 members (docs/scale.md).

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.packing.sources`` (``base``,
``tree_table``).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import sqlite3
import stat as statmod
from collections.abc import Callable, Iterator, Sequence

from bundlefs.core import format as fmt
from bundlefs.core.content_types import HeadFacts, head_facts
from bundlefs.errors import PackError
from bundlefs.packing.sources.base import Content, SourceItem, StoredContent
from bundlefs.packing.sources.tree_table import (
    ANY_CHILD,
    DIR,
    FILE,
    FIND,
    LIST,
    NAMES,
    NODE,
    PUT,
    REDESCRIBE,
    SPECIAL,
    STORED,
    SYMLINK,
    TreeTable,
)

DIR_MODE = statmod.S_IFDIR | 0o755  # implied directories (and a root no entry describes)
_NUMBERS_KEPT = 4096  # directories whose numbers are remembered (the map is cleared when full)
_ROOT = 0  # the root directory's number


@dataclasses.dataclass(frozen=True, slots=True)
class SyntheticStat:
    """A made-up ``Stat`` (``sources.base.Stat``) of an entry that is not a file on disk."""

    st_mode: int
    st_uid: int
    st_gid: int
    st_mtime_ns: int
    st_size: int = 0
    st_nlink: int = 1
    st_dev: int = 0
    st_ino: int = 0
    st_rdev: int = 0  # a device's number
    target: bytes | None = None  # a symlink's, as the tree delivers it


def name_problem(parts: Sequence[bytes]) -> str | None:
    """Why the path ``parts`` cannot be a bundle path, or None: the name rules every source of
    made-up entries applies (a directory walk meets only names the kernel allowed)."""
    for part in parts:
        if not part:
            return "its name has an empty component ('//', or a leading '/'), which no path has"
        if part in (b".", b".."):
            return f"its name has a {os.fsdecode(part)!r} component, which no path may have"
        if len(part) > fmt.MAX_NAME:
            return f"a name in it is longer than {fmt.MAX_NAME} bytes"
        if b"\0" in part:
            return "its name holds a NUL byte"
    return None


class Dir:
    """A directory to place (its children are the tree's; ``number`` is its number there)."""

    __slots__ = ("st", "number")

    def __init__(self, st: SyntheticStat, number: int | None = None) -> None:
        self.st = st
        self.number = number


class Symlink:
    __slots__ = ("st", "target")

    def __init__(self, st: SyntheticStat, target: bytes) -> None:
        self.st = st
        self.target = target


class File:
    """One content. Placed once it gets its number in the tree; placing the same object at
    another name makes that name a hard link to it."""

    __slots__ = ("stored", "number")

    def __init__(self, stored: StoredContent | None, number: int | None = None) -> None:
        self.stored = stored
        self.number = number


class Special:
    """A FIFO or a device: its status is all there is (its mode and device number)."""

    __slots__ = ("st",)

    def __init__(self, st: SyntheticStat) -> None:
        self.st = st


Node = Dir | Symlink | File | Special
_KINDS = {Dir: DIR, File: FILE, Symlink: SYMLINK, Special: SPECIAL}


class SyntheticTree:
    """Entries placed by path, then delivered as an ``EntrySource``. ``refuse(rel, why)`` is
    called for an entry the tree will not hold (it raises, or records a skip)."""

    def __init__(self, refuse: Callable[[bytes, str], None]) -> None:
        self._refuse = refuse
        self._root: SyntheticStat | None = None
        self._table = TreeTable()
        self._next_number = _ROOT + 1
        self._numbers: dict[bytes, int] = {b"": _ROOT}  # a directory's path -> its number
        self._unlisted: dict[bytes, int] = {b"": _ROOT}  # delivered, not yet listed
        self._checked: tuple[list[bytes], int, tuple | None] | None = None
        self._facts: dict[tuple[str | None, int], HeadFacts] = {}  # the few there are, shared

    def close(self) -> None:
        """Drop the tables (garbage collection does too)."""
        self._table.close()

    # -- placing -----------------------------------------------------------------------------------

    def placeable(self, parts: list[bytes], st: SyntheticStat) -> bool:
        """Whether a non-directory can go at ``parts`` (refused if not): checked before its
        content is stored."""
        if not parts:
            self._refuse(b"/", "it names the root, which is a directory")
            return False
        parent = self._parent(parts, st)
        if parent is None:
            return False
        old = self._table.one(FIND, (parent, parts[-1]))
        if old is not None and old[0] == DIR and self._has_children(old[1]):
            self._refuse(b"/".join(parts), "it would replace a directory that has children")
            return False
        self._checked = (parts, parent, old)  # for the ``place`` of these parts that follows
        return True

    def place(self, parts: list[bytes], node: Node, st: SyntheticStat) -> None:
        """Put ``node`` at ``parts`` (``st``: the status implied parents take theirs from)."""
        if not parts:  # "./" or "/": the root itself
            if isinstance(node, Dir):
                self._root = node.st
            else:
                self._refuse(b"/", "it names the root, which is a directory")
            return
        checked, self._checked = self._checked, None
        if checked is not None and checked[0] is parts:  # looked up by ``placeable`` just now
            parent, old = checked[1], checked[2]
        else:
            found = self._parent(parts, st)
            if found is None:
                return
            parent, old = found, self._table.one(FIND, (found, parts[-1]))
        name = parts[-1]
        if old is not None and old[0] == DIR:
            if isinstance(node, Dir):  # the same directory described again: the last one's status
                d = node.st
                self._table.run(REDESCRIBE, (d.st_mode, d.st_uid, d.st_gid, d.st_mtime_ns)
                                + (d.st_size, parent, name))  # fmt: skip
                return
            if self._has_children(old[1]):
                self._refuse(b"/".join(parts), "it would replace a directory that has children")
                return
            self._numbers.pop(b"/".join(parts), None)  # no longer a directory
        elif old is not None and old[0] == FILE:
            self._table.run(NAMES, (-1, old[1]))  # the last entry of a name wins
        self._put(parent, name, node)

    def _put(self, parent: int, name: bytes, node: Node) -> None:
        kind = _KINDS[type(node)]
        if isinstance(node, File):
            if node.number is None:
                node.number = self._store(node)
            else:  # one more name of it
                self._table.run(NAMES, (1, node.number))
            self._table.run(PUT, (parent, name, kind, node.number) + (None,) * 7)
            return
        s = node.st
        ref = self._new_number() if isinstance(node, Dir) else None
        target = node.target if isinstance(node, Symlink) else None
        row = (s.st_mode, s.st_uid, s.st_gid, s.st_mtime_ns, s.st_size, s.st_rdev, target)
        self._table.run(PUT, (parent, name, kind, ref, *row))

    def _store(self, node: File) -> int:
        """A new content row (with one name) for ``node``; its number."""
        stored = node.stored
        assert stored is not None  # a File placed the first time carries where its bytes went
        facts = stored.head if isinstance(stored.head, HeadFacts) else head_facts(stored.head)
        s = stored.st
        cursor = self._table.run(
            STORED,
            (stored.shard, stored.offset, stored.size, stored.crc32c, stored.digest)
            + (stored.content_type, facts.media_type, int(facts.text))
            + (s.st_mode, s.st_uid, s.st_gid, s.st_mtime_ns),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def link(self, parts: list[bytes], linkname: bytes, st: SyntheticStat) -> None:
        """A hard link at ``parts`` to the entry ``linkname`` placed before it."""
        rel = b"/".join(parts)
        target_parts = [p for p in linkname.split(b"/") if p and p != b"."]
        if b".." in target_parts:
            self._refuse(rel, "its hard link target contains '..'")
            return
        node = self._node(target_parts)
        if isinstance(node, File | Symlink | Special):
            # A hard link to a symlink or a special file becomes a copy of it (a bundle links
            # regular files only).
            self.place(parts, node, st)
        else:
            why = "is a directory" if isinstance(node, Dir) else "is not in the archive before it"
            self._refuse(rel, f"it is a hard link to {os.fsdecode(linkname)}, which {why}")

    def _node(self, parts: list[bytes]) -> Node | None:
        """What is at ``parts`` now (a ``File`` by its number), or None."""
        if self._root is None:
            return None
        if not parts:
            return Dir(self._root, _ROOT)
        number = _ROOT
        for i, part in enumerate(parts):
            row = self._table.one(NODE, (number, part))
            if row is None:
                return None
            kind, ref = row[0], row[1]
            if i < len(parts) - 1:
                if kind != DIR:
                    return None
                number = ref
                continue
            if kind == FILE:
                return File(None, ref)
            st = SyntheticStat(*row[2:8])
            if kind == SYMLINK:
                return Symlink(st, row[8])
            return Dir(st, ref) if kind == DIR else Special(st)
        return None

    def _parent(self, parts: list[bytes], st: SyntheticStat) -> int | None:
        """The number of the directory to hold ``parts[-1]``, implied directories created; None
        if refused."""
        self._root_for(st)
        key = b"/".join(parts[:-1])
        number = self._numbers.get(key)
        if number is not None:
            return number
        number = _ROOT
        for i, part in enumerate(parts[:-1]):
            row = self._table.one(FIND, (number, part))
            if row is None:  # implied: mode 0755, the owner and mtime of the entry below it
                child = self._new_number()
                implied = (DIR_MODE, st.st_uid, st.st_gid, st.st_mtime_ns, 0, 0, None)
                self._table.run(PUT, (number, part, DIR, child, *implied))
                number = child
            elif row[0] != DIR:
                what = "symbolic link" if row[0] == SYMLINK else "file"
                self._refuse(
                    b"/".join(parts),
                    f"it leads through the {what} {os.fsdecode(b'/'.join(parts[: i + 1]))}, "
                    "which is never followed",
                )
                return None
            else:
                number = row[1]
        if len(self._numbers) >= _NUMBERS_KEPT:
            self._numbers = {b"": _ROOT}
        self._numbers[key] = number
        return number

    def _has_children(self, number: int) -> bool:
        return self._table.one(ANY_CHILD, (number,)) is not None

    def _new_number(self) -> int:
        number = self._next_number
        self._next_number += 1
        return number

    def _root_for(self, st: SyntheticStat) -> SyntheticStat:
        if self._root is None:  # implied by the first entry, like any implied directory
            self._root = SyntheticStat(DIR_MODE, st.st_uid, st.st_gid, st.st_mtime_ns)
        return self._root

    def finish(self) -> None:
        """Every entry placed: an empty tree gets an empty root, owned by nobody in particular.
        (A file's names count and inode number, its content's, are read as it is listed.)"""
        self._root_for(SyntheticStat(DIR_MODE, 0, 0, 0))

    # -- EntrySource -------------------------------------------------------------------------------

    def root(self) -> SourceItem:
        if self._root is None:
            raise PackError("the archive source was not loaded")
        return SourceItem(b"", b"", self._root)

    def children(self, rel: bytes) -> Iterator[SourceItem]:
        number = self._unlisted.pop(rel, None)
        if number is None:  # asked again, or never delivered: found from the root
            found = self._node(rel.split(b"/") if rel else [])
            assert isinstance(found, Dir) and found.number is not None
            number = found.number
        prefix = rel + b"/" if rel else b""
        rows = self._table.run(LIST, (number,))
        try:
            for row in rows:
                yield self._item(prefix, row)
        except sqlite3.Error as e:
            raise PackError(f"cannot read the source's tree in a temporary file: {e}") from e

    def _item(self, prefix: bytes, row: tuple) -> SourceItem:
        name, kind, ref = row[:3]
        rel = prefix + name
        if kind != FILE:
            mode, uid, gid, mtime, size, rdev, target = row[3:10]
            if kind == DIR:
                self._unlisted[rel] = ref
            st = SyntheticStat(mode, uid, gid, mtime, size, st_rdev=rdev, target=target)
            return SourceItem(rel, name, st)
        names, shard, offset, size, crc, digest, content_type, sniffed, text = row[10:19]
        mode, uid, gid, mtime = row[19:23]
        st = SyntheticStat(mode, uid, gid, mtime, size, st_nlink=names, st_ino=ref)
        facts = self._facts.get((sniffed, text))
        if facts is None:
            facts = self._facts[sniffed, text] = HeadFacts(sniffed, bool(text))
        stored = StoredContent(shard, offset, size, crc, st, facts, content_type, digest)
        return SourceItem(rel, name, st, stored=stored)

    def readlink(self, item: SourceItem) -> bytes:
        target = getattr(item.st, "target", None)
        if target is None:
            raise OSError(errno.EINVAL, "not a symbolic link")
        return target


class LoadedTreeSource:
    """The ``EntrySource`` side of a source that builds a ``SyntheticTree`` (``self._tree``) when
    it is loaded, storing every file's content then (an archive read once, a list of files): the
    builder walks the tree and never opens a file."""

    _tree: SyntheticTree

    def root(self) -> SourceItem:
        return self._tree.root()

    def children(self, rel: bytes) -> Iterator[SourceItem]:
        return self._tree.children(rel)

    def readlink(self, item: SourceItem) -> bytes:
        return self._tree.readlink(item)

    def open(self, item: SourceItem) -> Content:
        # Every regular file item carries ``stored``: the builder never asks.
        raise OSError(errno.EINVAL, "the content was stored when the source was loaded")
