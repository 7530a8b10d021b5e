"""A tree held in memory, for sources whose entries are not a directory on disk: archives (tar
and zip members), object listings, generated trees.

``SyntheticStat`` is the status such a source makes up for an entry. ``SyntheticTree`` places
entries by path the way ``tar -x`` would, refusing (never following) what a bundle cannot hold:

- parent directories a path implies are created with mode 0755 and the owner and mtime of the
  first entry below them; the root too, unless an entry describes it;
- a name given twice: the last entry wins, but a directory that already has children is never
  replaced by a non-directory, and a path that leads through a symlink or a file is refused;
- a hard link is one more name of the file node it names (``st_nlink`` counts the names,
  ``st_ino`` is one per content, numbered in tree order by ``number_files``);
- ``name_problem`` is the one set of name rules: no empty, ``.`` or ``..`` component, none over
  ``fmt.MAX_NAME`` bytes, no NUL.

The tree is then an ``EntrySource`` (``root``, ``children``, ``readlink``) whose file items carry
their ``stored`` content; ``LoadedTreeSource`` is that side of a source built on one. Memory: one
small object per entry, plus its name.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.packing.sources.base``.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat as statmod
from collections.abc import Callable, Iterator, Sequence

from bundlefs.core import format as fmt
from bundlefs.errors import PackError
from bundlefs.packing.sources.base import Content, SourceItem, StoredContent

DIR_MODE = statmod.S_IFDIR | 0o755  # implied directories (and a root no entry describes)


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
    __slots__ = ("st", "children")

    def __init__(self, st: SyntheticStat) -> None:
        self.st = st
        self.children: dict[bytes, Node] = {}


class Symlink:
    __slots__ = ("st", "target")

    def __init__(self, st: SyntheticStat, target: bytes) -> None:
        self.st = st
        self.target = target


class File:
    """One content: every name of a hard-linked file is this same object in its directory."""

    __slots__ = ("stored",)

    def __init__(self, stored: StoredContent) -> None:
        self.stored = stored


class Special:
    """A FIFO or a device: its status is all there is (its mode and device number)."""

    __slots__ = ("st",)

    def __init__(self, st: SyntheticStat) -> None:
        self.st = st


Node = Dir | Symlink | File | Special


class SyntheticTree:
    """Entries placed by path, then delivered as an ``EntrySource``. ``refuse(rel, why)`` is
    called for an entry the tree will not hold (it raises, or records a skip)."""

    def __init__(self, refuse: Callable[[bytes, str], None]) -> None:
        self._refuse = refuse
        self._root: Dir | None = None

    # -- placing -----------------------------------------------------------------------------------

    def placeable(self, parts: list[bytes], st: SyntheticStat) -> bool:
        """Whether a non-directory can go at ``parts`` (refused if not): checked before its
        content is stored."""
        if not parts:
            self._refuse(b"/", "it names the root, which is a directory")
            return False
        directory = self._parent(parts, st)
        if directory is None:
            return False
        old = directory.children.get(parts[-1])
        if isinstance(old, Dir) and old.children:
            self._refuse(b"/".join(parts), "it would replace a directory that has children")
            return False
        return True

    def place(self, parts: list[bytes], node: Node, st: SyntheticStat) -> None:
        """Put ``node`` at ``parts`` (``st``: the status implied parents take theirs from)."""
        if not parts:  # "./" or "/": the root itself
            if isinstance(node, Dir):
                self._root_for(st).st = node.st
            else:
                self._refuse(b"/", "it names the root, which is a directory")
            return
        directory = self._parent(parts, st)
        if directory is None:
            return
        name = parts[-1]
        old = directory.children.get(name)
        if isinstance(old, Dir):
            if isinstance(node, Dir):
                old.st = node.st  # the same directory described again: the last one's metadata
                return
            if old.children:
                self._refuse(b"/".join(parts), "it would replace a directory that has children")
                return
        directory.children[name] = node  # the last entry of a name wins

    def link(self, parts: list[bytes], linkname: bytes, st: SyntheticStat) -> None:
        """A hard link at ``parts`` to the entry ``linkname`` placed before it."""
        rel = b"/".join(parts)
        target_parts = [p for p in linkname.split(b"/") if p and p != b"."]
        if b".." in target_parts:
            self._refuse(rel, "its hard link target contains '..'")
            return
        node: Node | None = self._root
        for part in target_parts:
            node = node.children.get(part) if isinstance(node, Dir) else None
        if isinstance(node, File | Symlink | Special):
            # A hard link to a symlink or a special file becomes a copy of it (a bundle links
            # regular files only).
            self.place(parts, node, st)
        else:
            why = "is a directory" if isinstance(node, Dir) else "is not in the archive before it"
            self._refuse(rel, f"it is a hard link to {os.fsdecode(linkname)}, which {why}")

    def _parent(self, parts: list[bytes], st: SyntheticStat) -> Dir | None:
        """The directory to hold ``parts[-1]``, implied directories created; None if refused."""
        directory = self._root_for(st)
        for i, part in enumerate(parts[:-1]):
            child = directory.children.get(part)
            if child is None:
                child = directory.children[part] = Dir(
                    SyntheticStat(DIR_MODE, st.st_uid, st.st_gid, st.st_mtime_ns)
                )
            if not isinstance(child, Dir):
                what = "symbolic link" if isinstance(child, Symlink) else "file"
                self._refuse(
                    b"/".join(parts),
                    f"it leads through the {what} {os.fsdecode(b'/'.join(parts[: i + 1]))}, "
                    "which is never followed",
                )
                return None
            directory = child
        return directory

    def _root_for(self, st: SyntheticStat) -> Dir:
        if self._root is None:  # implied by the first entry, like any implied directory
            self._root = Dir(SyntheticStat(DIR_MODE, st.st_uid, st.st_gid, st.st_mtime_ns))
        return self._root

    def number_files(self) -> None:
        """Give each content its names count and inode number (in tree order: deterministic);
        an empty tree gets an empty root, owned by nobody in particular."""
        root = self._root_for(SyntheticStat(DIR_MODE, 0, 0, 0))
        names: dict[int, int] = {}
        files: list[File] = []
        pending = [root]
        while pending:
            directory = pending.pop()
            for name in sorted(directory.children):
                node = directory.children[name]
                if isinstance(node, Dir):
                    pending.append(node)
                elif isinstance(node, File):
                    if id(node) not in names:
                        names[id(node)] = 0
                        files.append(node)
                    names[id(node)] += 1
        for ino, node in enumerate(files, 1):
            st = dataclasses.replace(
                node.stored.st,  # type: ignore[type-var]  # always a SyntheticStat here
                st_size=node.stored.size,
                st_nlink=names[id(node)],
                st_ino=ino,
            )
            node.stored = dataclasses.replace(node.stored, st=st)

    # -- EntrySource -------------------------------------------------------------------------------

    def root(self) -> SourceItem:
        if self._root is None:
            raise PackError("the archive source was not loaded")
        return SourceItem(b"", b"", self._root.st)

    def children(self, rel: bytes) -> Iterator[SourceItem]:
        directory = self._node(rel.split(b"/") if rel else [])
        assert isinstance(directory, Dir)
        for name in sorted(directory.children):
            node = directory.children[name]
            child_rel = rel + b"/" + name if rel else name
            if isinstance(node, File):
                yield SourceItem(child_rel, name, node.stored.st, stored=node.stored)
            else:
                yield SourceItem(child_rel, name, node.st)

    def readlink(self, item: SourceItem) -> bytes:
        node = self._node(item.rel.split(b"/"))
        if not isinstance(node, Symlink):
            raise OSError(errno.EINVAL, "not a symbolic link")
        return node.target

    def _node(self, parts: list[bytes]) -> Node:
        node: Node | None = self._root
        for part in parts:
            assert isinstance(node, Dir)
            node = node.children[part]
        assert node is not None
        return node


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
