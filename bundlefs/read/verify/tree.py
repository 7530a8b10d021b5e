"""``verify``'s entry phase: every entry, the directory tree they form, the hard links, (format
version 5) the directory totals and (version 6) the source records.

Every entry is read once into ``InodeTable``; the tree's rules (core/integrity.py, the same the
reader enforces) are then checked over that table, and each broken one is collected. The table
also names any inode's path, as well as a damaged tree allows, for the file phase.

Memory: one bit per inode (whether it is a regular file's own entry, for the file phase), ~20
bytes per directory, and entries in numbers the damage and the hard links decide: the inodes
whose name does not sort after the previous inode's (each directory's first child, and the
entries out of order), the hard links. A byte per inode held 100 MB at 100,000,000 entries
(docs/scale.md).

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.read.tree``,
``bundlefs.read.verify.report``.
"""

from __future__ import annotations

import bisect
import itertools
import os
from array import array
from collections.abc import Callable, Iterator

from bundlefs.core import format as fmt
from bundlefs.core import integrity
from bundlefs.errors import FormatError
from bundlefs.read.tree import TreeModel
from bundlefs.read.verify.report import Findings

# How often a scan of every entry takes the index's mapped pages out of the resident set
# (``IndexReader.unmap_pages``): 65,536 entries are ~4 MB of a version 5 index.
UNMAP_EVERY = 1 << 16


class InodeTable:
    """Compact facts about the directory tree, enough to check it and to name any inode's path.

    Directories are added in inode order (the scan's), so their arrays are sorted by inode;
    ``sort`` orders the child ranges by their first inode.
    """

    def __init__(self, tree: TreeModel, entry_count: int) -> None:
        self._tree = tree
        self.entry_count = entry_count
        self._files = bytearray(entry_count // 8 + 1)  # bit ino: a regular file's own entry
        # Directories, by inode: their parent field, nlink, first child and child count.
        self.dir_inos, self._parents, self._nlinks = array("I"), array("I"), array("I")
        self._firsts, self._counts = array("I"), array("I")
        # The child ranges (first, count, directory) sorted by first, of directories with any.
        self._range_firsts, self._range_counts, self._range_dirs = (
            array("I"),
            array("I"),
            array("I"),
        )
        # Inodes whose name does not sort after the previous inode's, both read.
        self.breaks = array("I")
        self.links: list[tuple[int, int]] = []  # (LINK entry, target)
        self._links: dict[int, list[int]] | None = None

    def add_file(self, ino: int) -> None:
        self._files[ino >> 3] |= 1 << (ino & 7)

    def add_dir(self, entry: fmt.Entry) -> None:
        assert not self.dir_inos or entry.ino > self.dir_inos[-1]  # in inode order
        self.dir_inos.append(entry.ino)
        self._parents.append(entry.parent)
        self._nlinks.append(entry.nlink)
        self._firsts.append(entry.first_child if entry.size else 0)
        self._counts.append(entry.size)

    def _dir_index(self, directory: int) -> int | None:
        i = bisect.bisect_left(self.dir_inos, directory)
        return i if i < len(self.dir_inos) and self.dir_inos[i] == directory else None

    def is_dir(self, ino: int) -> bool:
        """Whether ``ino`` is a directory read in the scan."""
        return self._dir_index(ino) is not None

    def dir_facts(self, directory: int) -> tuple[int, int]:
        """(parent field, nlink) of a directory read in the scan."""
        i = self._dir_index(directory)
        assert i is not None
        return self._parents[i], self._nlinks[i]

    def dirs(self) -> Iterator[tuple[int, int]]:
        """(directory, parent field) of every directory read, in inode order."""
        return zip(self.dir_inos, self._parents, strict=True)

    def dirs_within(self, first: int, end: int) -> int:
        """How many directories have an inode in [first, end)."""
        return bisect.bisect_left(self.dir_inos, end) - bisect.bisect_left(self.dir_inos, first)

    def breaks_within(self, first: int, end: int) -> array:
        """The inodes in [first, end) whose name does not sort after the previous inode's."""
        return self.breaks[
            bisect.bisect_left(self.breaks, first) : bisect.bisect_left(self.breaks, end)
        ]

    def children_of(self, directory: int) -> tuple[int, int]:
        """(first_child, count) of a directory read in the scan; (0, 0) when it has none."""
        i = self._dir_index(directory)
        if i is None or not self._counts[i]:
            return (0, 0)
        return self._firsts[i], self._counts[i]

    def sort(self) -> None:
        """The child ranges by first inode (then count, directory), as the tree check walks them."""
        with_children = array("I", (i for i, count in enumerate(self._counts) if count))

        def key(i: int) -> tuple[int, int, int]:
            return self._firsts[i], self._counts[i], self.dir_inos[i]

        if any(key(i) > key(j) for i, j in itertools.pairwise(with_children)):
            # A damaged tree: its ranges out of the inode order (a sound one's are in it).
            with_children = array("I", sorted(with_children, key=key))
        self._range_firsts = array("I", (self._firsts[i] for i in with_children))
        self._range_counts = array("I", (self._counts[i] for i in with_children))
        self._range_dirs = array("I", (self.dir_inos[i] for i in with_children))

    def ranges(self) -> Iterator[tuple[int, int, int]]:
        """(first_child, count, directory) of every directory with children, by first child."""
        return zip(self._range_firsts, self._range_counts, self._range_dirs, strict=True)

    def holder(self, ino: int) -> int | None:
        """The directory whose child range holds ``ino``."""
        i = bisect.bisect_right(self._range_firsts, ino) - 1
        if i >= 0:
            first, count = self._range_firsts[i], self._range_counts[i]
            if first <= ino < first + count:
                return self._range_dirs[i]
        return None

    def is_file(self, ino: int) -> bool:
        """Whether ``ino`` is a regular file's own entry (read and sound)."""
        return 1 <= ino <= self.entry_count and bool(self._files[ino >> 3] >> (ino & 7) & 1)

    def name(self, ino: int) -> bytes:
        try:
            return self._tree.stored_entry(ino).name
        except FormatError:
            return b""

    def path(self, ino: int) -> str:
        """The path of an inode from the root, as well as a damaged tree allows."""
        parts: list[bytes] = []
        seen = set()
        while ino != fmt.ROOT_INO:
            if ino in seen or len(parts) > 4096:
                return f"<inode {ino}: directory cycle>"
            seen.add(ino)
            try:
                parts.append(self._tree.stored_entry(ino).name)
            except FormatError:
                parts.append(b"<inode %d>" % ino)
            holder = self.holder(ino)
            if holder is None:
                parts.append(b"<detached>")
                break
            ino = holder
        return os.fsdecode(b"/".join(reversed(parts))) or "/"

    def links_to(self, target: int) -> list[int]:
        """LINK entries that name ``target`` (grouped on first use: only damaged files need it)."""
        if self._links is None:
            self._links = {}
            for ino, linked in self.links:
                self._links.setdefault(linked, []).append(ino)
        return self._links.get(target, [])


class TreeCheck:
    """Checks the entries of one bundle, writing what it finds to ``findings``."""

    def __init__(
        self,
        tree_model: TreeModel,
        config: fmt.Config,
        findings: Findings,
        unmap: Callable[[], None] | None = None,
    ) -> None:
        self.tree_model = tree_model
        self.config = config
        self.findings = findings
        self.unmap = unmap  # called every UNMAP_EVERY entries read (the index's mapped pages)

    def run(self) -> InodeTable:
        """Read every entry once into the table, then check the tree and the links."""
        config, tree_model = self.config, self.tree_model
        n = config.entry_count
        tree = InodeTable(tree_model, n)
        counts = integrity.TreeCounts()
        nlinks: dict[int, int] = {}  # file with an NLINK part -> its nlink
        previous: bytes | None = None  # the previous inode's name, if it was read (and known)
        for ino in range(1, n + 1):
            self.findings.tick("entries", ino, n)
            if self.unmap is not None and not ino % UNMAP_EVERY:
                self.unmap()
            try:
                entry = tree_model.stored_entry(ino)
            except FormatError as e:
                self.findings.problem("entry", f"entry {ino}: {e}")
                previous = None
                continue
            counts.add(entry)
            known = True
            if entry.is_link:
                tree.links.append((ino, entry.target))
            elif entry.is_file:
                tree.add_file(ino)
                if entry.flags & fmt.FLAG_NLINK:
                    nlinks[ino] = entry.nlink
            elif entry.is_dir:
                tree.add_dir(entry)
            else:
                known = entry.is_symlink or entry.is_special
            # Which directory lists an inode is known only once every directory is read: keep
            # the inodes the name-order rule may fail at (each directory's first child, and
            # damage), against the inode before it.
            if (
                known
                and previous is not None
                and integrity.child_order(0, previous, entry.name) is not None
            ):
                tree.breaks.append(ino)
            previous = entry.name if known else None
        self._report_counts(counts, n)
        try:
            extra = next(tree_model.stored_entries(n + 1, 1), None)
        except FormatError:
            extra = None  # "no entry n+1": as it should be
        if extra is not None:
            self.findings.problem("entry", f"entry {n + 1} exists past the entry count {n}")
        for message in counts.problems_against(config):
            self.findings.problem("config", message)
        self._check_tree(tree)
        self._check_links(tree, nlinks)
        if config.format_version >= fmt.FIRST_V5_VERSION:
            self._check_totals(tree)
        self._check_sources(tree)
        return tree

    def _report_counts(self, counts: integrity.TreeCounts, entries: int) -> None:
        report = self.findings.report
        report.entries, report.files, report.dirs = entries, counts.files, counts.dirs
        report.symlinks, report.hardlinks = counts.symlinks, counts.hardlinks
        report.specials = counts.specials

    def _check_sources(self, tree: InodeTable) -> None:
        """Each key of ``sources`` a regular file's own inode (no LINK), each value 16 bytes."""
        try:
            for key, value in self.tree_model.stored_sources():
                try:
                    ino = fmt.decode_entry_key(key)
                    if not tree.is_file(ino):
                        raise FormatError(f"inode {ino} has a source record but is not a file")
                    fmt.decode_source(ino, value)
                except FormatError as e:
                    self.findings.problem("sources", f"source record {key.hex()}: {e}")
        except FormatError as e:
            self.findings.problem("sources", str(e))

    def _check_tree(self, tree: InodeTable) -> None:
        if not tree.is_dir(fmt.ROOT_INO):
            self.findings.problem("entry", "the root entry is not a readable directory")
        tree.sort()
        end_of_entries = tree.entry_count + 1
        covered = fmt.ROOT_INO + 1  # the next inode a child range must start at
        for first, count, directory in tree.ranges():
            end = first + count
            if first != covered:
                what = "no directory holds" if first > covered else "two directories hold"
                lo, hi = min(first, covered), max(first, covered) - 1
                self.findings.problem("entry", f"{what} entries {lo}…{hi}")
            if end > end_of_entries:
                self.findings.problem(
                    "entry", f"directory {directory} lists children past the last entry"
                )
            covered = max(covered, end)
            end = min(end, end_of_entries)
            for ino in tree.breaks_within(first + 1, end):
                message = integrity.child_order(directory, tree.name(ino - 1), tree.name(ino))
                self.findings.problem("entry", f"{tree.path(ino)}: {message}", path=tree.path(ino))
            _parent, nlink = tree.dir_facts(directory)
            message = integrity.directory_nlink(nlink, tree.dirs_within(first, end))
            if message is not None:
                self.findings.problem("entry", f"directory {tree.path(directory)} {message}")
        if covered != end_of_entries:
            self.findings.problem(
                "entry", f"no directory holds entries {covered}…{tree.entry_count}"
            )
        for directory, parent in tree.dirs():
            holder = tree.holder(directory)
            expected = fmt.ROOT_INO if directory == fmt.ROOT_INO else holder
            message = integrity.child_directory_parent(directory, parent, expected)
            if message is not None:
                self.findings.problem("entry", f"{tree.path(directory)}: {message}")

    def _check_links(self, tree: InodeTable, nlinks: dict[int, int]) -> None:
        names: dict[int, int] = {}
        for ino, target in tree.links:
            message = integrity.link_target(ino, target, tree.is_file(target))
            if message is not None:
                self.findings.problem("entry", f"{tree.path(ino)}: {message}", path=tree.path(ino))
                continue
            names[target] = names.get(target, 1) + 1
        for ino in set(names) | set(nlinks):
            message = integrity.link_count(nlinks.get(ino, 1), names.get(ino, 1))
            if message is not None:
                self.findings.problem("entry", f"{tree.path(ino)}: {message}", path=tree.path(ino))

    def _check_totals(self, tree: InodeTable) -> None:
        """Each directory's stored totals against what its children add up to, from the last
        directory back (a child directory's inode is above its parent's), each parent adding what
        its children's entries add up to, not their stored totals (so one wrong value is named
        once). A second read of the entries, one cursor scan per directory; O(directories) held."""
        summed: dict[int, fmt.TreeTotals | None] = {}  # None: unknown (an unreadable entry)
        read = 0  # entries read since the index's pages were last unmapped
        for directory in reversed(tree.dir_inos):
            total: fmt.TreeTotals | None = fmt.TreeTotals()
            try:
                for child in self.tree_model.stored_entries(*tree.children_of(directory)):
                    read += 1
                    if self.unmap is not None and read == UNMAP_EVERY:  # a large directory too
                        self.unmap()
                        read = 0
                    below = summed.pop(child.ino, None) if child.is_dir else fmt.TreeTotals()
                    if total is None or below is None:
                        total = None
                    else:
                        total += integrity.child_totals(child, below)
            except FormatError:
                total = None  # the entry scan reported it
            summed[directory] = total
            try:
                stored = self.tree_model.stored_totals(directory)
            except FormatError as e:
                self.findings.problem("totals", f"{tree.path(directory)}: {e}")
                continue
            message = None
            if stored is not None and total is not None:
                message = integrity.directory_totals(directory, stored, total)
            if message is not None:
                self.findings.problem("totals", f"{tree.path(directory)}: {message}")
