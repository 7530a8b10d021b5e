"""Whole-bundle traversals: every path breadth first, and every file's content in stored order.

``walk`` is ``os.walk``'s order over ``Bundle.scandir`` (``glob`` matches what it yields).
``breadth_first`` is the index's own order (one forward scan: each directory's children are a
contiguous run of inodes).
``iter_files`` is the streaming read of a whole bundle (what WebDataset users do with tar
shards): the files in shard-stream order, so each record is read and decompressed once however
the bundle was packed (a directory pack stores content in inode order, an archive pack in the
archive's order). ``Bundle`` exposes them.

``iter_files`` may stream only some shards or one of several contiguous parts (a worker's
split), give each file's stat, and go on past a damaged file (``on_error``). ``read_names`` and
``stored_names(part=…, same=…)`` are what ``iter_samples`` (read/samples.py) builds on.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.read.tree``,
``bundlefs.read.content``, ``bundlefs.read.paths``.
"""

from __future__ import annotations

import array
import os
from collections import deque
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from typing import Any, Literal, overload

from bundlefs.core import format as fmt
from bundlefs.errors import CorruptDataError, FormatError
from bundlefs.read.content import ContentReader
from bundlefs.read.paths import BundleStat, entry_stat, glob_match
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


def glob(walked: Iterable[tuple[str, list[str], list[str]]], pattern: str) -> list[str]:
    """The paths ``walk`` yields that match a shell pattern (``Bundle.glob``), sorted."""
    parts = pattern.strip("/").split("/")
    out = []
    for top, dirs, files in walked:
        for name in dirs + files:
            path = os.path.join(top, name) if top else name
            if glob_match(path.split("/"), parts):
                out.append(path)
    return sorted(out)


class StoredFiles:
    """Where each file is stored, from one scan of the index: 24 bytes a file in three arrays
    (plus the directories' paths), not a tuple and a path string each (~200 bytes).

    The scan reads the entries in inode order and decodes only directories, links and the
    shard and offset of each file (``fmt.file_location``): the index numbers entries breadth
    first, each directory's children a contiguous run after the previous directory's. A bundle
    numbered otherwise, or of a format version before 3, is walked directory by directory
    instead (each entry decoded in full)."""

    def __init__(self, tree: TreeModel, shards: Container[int] | None = None) -> None:
        self.shards = shards
        if not (tree.format_version >= 3 and self._scan_raw(tree)):
            self._scan_tree(tree)

    def _clear(self) -> None:
        self.keys = array.array("Q")  # shard << 48 | offset: the stream position (format §3)
        self.files = array.array("Q")  # the inode holding the content (a hard link's target)
        self.names = array.array("Q")  # the inode of the name (a LINK entry's own)
        self.dirs = array.array("Q")  # the index in ``dir_paths`` of the directory holding it
        self.dir_paths: list[str] = [""]
        self.in_order = True
        self._order: Sequence[int] | None = None

    def _scan_raw(self, tree: TreeModel) -> bool:
        """The fast scan; False (and nothing kept) where the numbering is not breadth first."""
        self._clear()
        root, version, shards = tree.root, tree.format_version, self.shards
        # The child ranges (first, end, slot, directory inode) still ahead, in inode order.
        ahead = deque([(root.first_child, root.first_child + root.size, 0, root.ino)])
        for ino, value in tree.raw_entries():
            while ahead and ino >= ahead[0][1]:
                ahead.popleft()
            if ino == fmt.ROOT_INO:
                continue
            if not ahead or ino < ahead[0][0]:
                return False
            slot = ahead[0][2]
            at = fmt.file_location(value, version)
            if at is not None:
                if shards is None or at[0] in shards:
                    self._append(at[0] << 48 | at[1], ino, ino, slot)
            elif fmt.is_directory_value(value):
                entry = fmt.decode_entry(ino, value, version)
                if entry.parent != ahead[0][3] or (entry.size and ahead[-1][1] > entry.first_child):
                    return False
                top, name = self.dir_paths[slot], os.fsdecode(entry.name)
                self.dir_paths.append(top + "/" + name if top else name)
                if entry.size:  # (an empty directory's first child is 0)
                    end = entry.first_child + entry.size
                    ahead.append((entry.first_child, end, len(self.dir_paths) - 1, ino))
            else:  # a LINK entry (its file's location), a symlink or a special file (none)
                entry = tree.entry(ino)
                if entry.is_file and (shards is None or entry.shard in shards):
                    self._add(entry, ino, slot)
        return True

    def _scan_tree(self, tree: TreeModel) -> None:
        self._clear()
        pending: deque[tuple[int, fmt.Entry]] = deque([(0, tree.root)])
        while pending:
            slot, directory = pending.popleft()
            for i, (_name, entry) in enumerate(tree.children(directory)):
                if entry.is_dir:
                    top = self.dir_paths[slot]
                    name = os.fsdecode(entry.name)
                    self.dir_paths.append(top + "/" + name if top else name)
                    pending.append((len(self.dir_paths) - 1, entry))
                elif entry.is_file and (self.shards is None or entry.shard in self.shards):
                    self._add(entry, directory.first_child + i, slot)

    def _add(self, entry: fmt.Entry, name_ino: int, slot: int) -> None:
        self._append(entry.shard << 48 | entry.offset, entry.ino, name_ino, slot)

    def _append(self, key: int, file_ino: int, name_ino: int, slot: int) -> None:
        self.in_order = self.in_order and (not self.keys or self.keys[-1] <= key)
        self.keys.append(key)
        self.files.append(file_ino)
        self.names.append(name_ino)  # children are a contiguous range of inodes
        self.dirs.append(slot)

    def order(self) -> Sequence[int]:
        """The files' positions in stored order (stable: a file's names keep inode order)."""
        if self._order is None:
            order: Sequence[int] = range(len(self.keys))
            if not self.in_order:
                order = array.array("Q", sorted(order, key=self.keys.__getitem__))
            self._order = order
        return self._order

    def path(self, tree: TreeModel, i: int) -> str:
        """The path of file ``i``."""
        top = self.dir_paths[self.dirs[i]]
        name = os.fsdecode(tree.stored_entry(self.names[i]).name)
        return top + "/" + name if top else name


Part = tuple[int, int] | None
Same = Callable[[str, str], bool]  # whether two paths in a row belong to one sample


def check_part(part: Part) -> None:
    """``ValueError`` unless ``part`` is None or ``(index, count)`` with 0 <= index < count."""
    if part is not None:
        index, count = part
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"part must be (index, count) with 0 <= index < count, not {part!r}")


def _boundary(
    tree: TreeModel, stored: StoredFiles, order: Sequence[int], at: int, same: Same
) -> int:
    """The first position at or after ``at`` that starts a sample (``same`` says which files in
    a row belong to one): both parts a boundary separates compute the same one."""
    if 0 < at < len(order):
        before = stored.path(tree, order[at - 1])
        while at < len(order):
            path = stored.path(tree, order[at])
            if not same(before, path):
                break
            before, at = path, at + 1
    return at


def stored_names(
    tree: TreeModel,
    shards: Container[int] | None = None,
    part: Part = None,
    same: Same | None = None,
    stored: StoredFiles | None = None,
) -> Iterator[tuple[str, int]]:
    """(path, inode holding the content) of every regular file's every name (of those stored in
    ``shards``; None: all), in the order the content is stored: what ``iter_files`` reads, and
    the keys of the ``Bundle`` mapping.

    ``part=(index, count)``: only the index-th of ``count`` contiguous runs of that order, equal
    in files to one; with ``same``, each boundary moves forward to the start of a sample, so a
    sample lies in one part whole. ``stored``: the scan made already (of the same bundle, with
    the same ``shards``), as a data loader's workers inherit it from their parent."""
    if stored is None:
        stored = StoredFiles(tree, shards)
    order = stored.order()
    if part is not None:
        index, count = part
        lo, hi = len(order) * index // count, len(order) * (index + 1) // count
        if same is not None:
            lo = _boundary(tree, stored, order, lo, same)
            hi = _boundary(tree, stored, order, hi, same)
        order = order[lo:hi]
    for i in order:
        yield stored.path(tree, i), stored.files[i]


Shards = int | range | Iterable[int] | None
OnError = Literal["raise", "skip"] | Callable[[str, CorruptDataError], object]


def shard_filter(content: ContentReader, shards: Shards) -> Container[int] | None:
    """The shard numbers ``shards`` names as a set to test files against (a ``range`` kept as one);
    ``ValueError`` for a number the bundle has no shard of. None: every shard."""
    if shards is None:
        return None
    wanted: range | frozenset[int]
    if isinstance(shards, int):
        wanted = frozenset((shards,))
    elif isinstance(shards, range):
        wanted = shards
    else:
        wanted = frozenset(shards)
    for shard in (min(wanted), max(wanted)) if wanted else ():
        try:
            content.shard_info(shard)
        except FormatError:
            raise ValueError(f"the bundle has no shard {shard}") from None
    return wanted


@overload
def iter_files(
    tree: TreeModel,
    content: ContentReader,
    shards: Shards = None,
    with_stat: Literal[False] = False,
    on_error: OnError = "raise",
    part: Part = None,
) -> Iterator[tuple[str, bytes]]: ...
@overload
def iter_files(
    tree: TreeModel,
    content: ContentReader,
    shards: Shards,
    with_stat: Literal[True],
    on_error: OnError = "raise",
    part: Part = None,
) -> Iterator[tuple[str, BundleStat, bytes]]: ...
@overload
def iter_files(
    tree: TreeModel,
    content: ContentReader,
    shards: Shards = None,
    with_stat: bool = False,
    on_error: OnError = "raise",
    part: Part = None,
) -> Iterator[tuple[str, bytes]] | Iterator[tuple[str, BundleStat, bytes]]: ...
def iter_files(
    tree: TreeModel,
    content: ContentReader,
    shards: Shards = None,
    with_stat: bool = False,
    on_error: OnError = "raise",
    part: Part = None,
) -> Iterator[tuple[str, bytes]] | Iterator[tuple[str, BundleStat, bytes]]:
    """(path, content) of every regular file, in the order the content is stored — or
    (path, stat, content) ``with_stat``.

    A hard-linked file comes once per name, each name right after the other, from one read.
    Each file's CRC is checked and each is held whole in memory. Symlinks and directories are not
    yielded. ``shards`` (a number, a ``range`` or numbers) keeps the files whose content is stored
    in those shards; ``part=(index, count)`` the index-th of ``count`` contiguous runs of them,
    equal in files to one. A damaged file (``CorruptDataError``) ends the iteration
    (``on_error="raise"``) or is left out (``"skip"``); a callable is called with (path, error) for
    each name of it and leaves it out unless it raises.
    """
    wanted = shard_filter(content, shards)  # said at the call, not at the first next()
    check_on_error(on_error)
    check_part(part)
    return read_names(tree, content, stored_names(tree, wanted, part), with_stat, on_error)


def check_on_error(on_error: OnError) -> None:
    """``ValueError`` unless ``on_error`` is "raise", "skip" or a callable."""
    if on_error not in ("raise", "skip") and not callable(on_error):
        raise ValueError(f"on_error must be 'raise', 'skip' or a callable, not {on_error!r}")


def read_names(
    tree: TreeModel,
    content: ContentReader,
    names: Iterable[tuple[str, int]],
    with_stat: bool,
    on_error: OnError,
) -> Iterator[Any]:
    """``iter_files`` over ``names`` ((path, inode holding the content), as ``stored_names``)."""
    entry: fmt.Entry | None = None
    last: bytes | CorruptDataError = b""
    for path, ino in names:
        if entry is None or ino != entry.ino:  # a hard link's names follow each other: one read
            entry = tree.entry(ino)
            try:
                last = bytes(content.read_at(entry, 0, entry.size, path=path))
            except CorruptDataError as e:
                if on_error == "raise":
                    raise
                last = e
        if isinstance(last, CorruptDataError):
            if callable(on_error):
                on_error(path, last)
            continue
        yield (path, entry_stat(tree, entry), last) if with_stat else (path, last)
