"""Whole-bundle traversals: every path breadth first, and every file's content in stored order.

``walk`` is ``os.walk``'s order over ``Bundle.scandir``. ``breadth_first`` is the index's own
order (one forward scan: each directory's children are a contiguous run of inodes).
``iter_files`` is the streaming read of a whole bundle (what WebDataset users do with tar
shards): the files in shard-stream order, so each record is read and decompressed once however
the bundle was packed (a directory pack stores content in inode order, an archive pack in the
archive's order). ``Bundle`` exposes all three.

May import: ``bundlefs.core``, ``bundlefs.read.tree``, ``bundlefs.read.content``.
"""

from __future__ import annotations

import array
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.read.content import ContentReader
from bundlefs.read.tree import TreeModel


def breadth_first(tree: TreeModel) -> Iterator[tuple[str, fmt.Entry]]:
    """(path, entry) of every entry but the root, in inode order, links resolved to their file;
    a deque of the directories still to list is all it holds."""
    pending: deque[tuple[str, fmt.Entry]] = deque([("", tree.root)])
    while pending:
        top, directory = pending.popleft()
        for name, entry in tree.children(directory):
            path = top + "/" + os.fsdecode(name) if top else os.fsdecode(name)
            yield path, entry
            if entry.is_dir:
                pending.append((path, entry))


def walk(
    scandir: Callable[[Any], Iterable[Any]], top: Any
) -> Iterator[tuple[Any, list[Any], list[Any]]]:
    """``os.walk`` over ``scandir`` (``Bundle.scandir``): top-down (prune by editing ``dirs``),
    symlinked directories listed among the directories but not entered."""
    pending: list[Any] = [top]
    while pending:  # iterative: bundles may nest deeper than Python's recursion limit
        current = pending.pop()
        dirs: list[Any] = []
        files: list[Any] = []
        links = set()
        for d in scandir(current):
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


class _StoredFiles:
    """Where each file is stored, from one scan of the index: 24 bytes a file in three arrays
    (plus the directories' paths), not a tuple and a path string each (~200 bytes)."""

    def __init__(self, tree: TreeModel) -> None:
        self.keys = array.array("Q")  # shard << 48 | offset: the stream position (format §3)
        self.files = array.array("Q")  # the inode holding the content (a hard link's target)
        self.names = array.array("Q")  # the inode of the name (a LINK entry's own)
        self.dirs = array.array("Q")  # the index in ``dir_paths`` of the directory holding it
        self.dir_paths: list[str] = [""]
        self.in_order = True
        pending: deque[tuple[int, fmt.Entry]] = deque([(0, tree.root)])
        while pending:
            slot, directory = pending.popleft()
            for i, (_name, entry) in enumerate(tree.children(directory)):
                if entry.is_dir:
                    top = self.dir_paths[slot]
                    name = os.fsdecode(entry.name)
                    self.dir_paths.append(top + "/" + name if top else name)
                    pending.append((len(self.dir_paths) - 1, entry))
                elif entry.is_file:
                    self._add(entry, directory.first_child + i, slot)

    def _add(self, entry: fmt.Entry, name_ino: int, slot: int) -> None:
        key = entry.shard << 48 | entry.offset
        self.in_order = self.in_order and (not self.keys or self.keys[-1] <= key)
        self.keys.append(key)
        self.files.append(entry.ino)
        self.names.append(name_ino)  # children are a contiguous range of inodes
        self.dirs.append(slot)

    def order(self) -> Iterable[int]:
        """The files' positions in stored order (stable: a file's names keep inode order)."""
        order: Iterable[int] = range(len(self.keys))
        if not self.in_order:
            order = sorted(order, key=self.keys.__getitem__)
        return order


def stored_names(tree: TreeModel) -> Iterator[tuple[str, int]]:
    """(path, inode holding the content) of every regular file's every name, in the order the
    content is stored: what ``iter_files`` reads, and the keys of the ``Bundle`` mapping."""
    stored = _StoredFiles(tree)
    for i in stored.order():
        top = stored.dir_paths[stored.dirs[i]]
        name = os.fsdecode(tree.stored_entry(stored.names[i]).name)
        yield (top + "/" + name if top else name), stored.files[i]


def iter_files(tree: TreeModel, content: ContentReader) -> Iterator[tuple[str, bytes]]:
    """(path, content) of every regular file, in the order the content is stored.

    A hard-linked file comes once per name, each name right after the other, from one read.
    Each file's CRC is checked (``CorruptDataError``) and each is held whole in memory.
    Symlinks and directories are not yielded.
    """
    last_ino, last_data = 0, b""
    for path, ino in stored_names(tree):
        if ino != last_ino:
            entry = tree.entry(ino)
            last_ino = entry.ino
            last_data = bytes(content.read_at(entry, 0, entry.size, path=path))
        yield path, last_data
