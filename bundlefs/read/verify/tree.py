"""``verify``'s entry phase: every entry, the directory tree they form, the hard links, (format
version 5) the directory totals and (version 6) the source records.

Every entry is read once into ``InodeTable``, one byte per inode (its kind, and whether its name
sorts after the previous inode's), so millions of entries fit; the tree's rules (core/integrity.py,
the same the reader enforces) are then checked over that table, and each broken one is collected.
The table also names any inode's path, as well as a damaged tree allows, for the file phase.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.read.tree``,
``bundlefs.read.verify.report``.
"""

from __future__ import annotations

import bisect
import os

from bundlefs.core import format as fmt
from bundlefs.core import integrity
from bundlefs.errors import FormatError
from bundlefs.read.tree import TreeModel
from bundlefs.read.verify.report import Findings

# Per-inode kinds in the table (one byte per inode, so millions of entries fit).
BAD, FILE, DIR, SYMLINK, LINK, SPECIAL = 0, 1, 2, 3, 4, 5
NAME_AFTER_PREVIOUS = 0x10  # bit: this entry's name sorts after the previous inode's name


class InodeTable:
    """Compact facts about the directory tree, enough to check it and to name any inode's path."""

    def __init__(self, tree: TreeModel, entry_count: int) -> None:
        self._tree = tree
        self.kinds = bytearray(entry_count + 1)
        self.dirs: dict[int, tuple[int, int]] = {}  # directory -> (parent field, nlink)
        self._children: dict[int, tuple[int, int]] = {}  # directory -> (first_child, count)
        self.ranges: list[tuple[int, int, int]] = []  # (first_child, count, directory), sorted
        self._firsts: list[int] = []
        self._links: dict[int, list[int]] | None = None

    def add_dir(self, entry: fmt.Entry) -> None:
        self.dirs[entry.ino] = (entry.parent, entry.nlink)
        if entry.size:
            self._children[entry.ino] = (entry.first_child, entry.size)

    def children_of(self, directory: int) -> tuple[int, int]:
        """(first_child, count) of a directory read in the scan; (0, 0) when it has none."""
        return self._children.get(directory, (0, 0))

    def sort(self) -> None:
        self.ranges = sorted((f, c, d) for d, (f, c) in self._children.items())
        self._firsts = [f for f, _c, _d in self.ranges]

    def holder(self, ino: int) -> int | None:
        """The directory whose child range holds ``ino``."""
        i = bisect.bisect_right(self._firsts, ino) - 1
        if i >= 0:
            first, count, directory = self.ranges[i]
            if first <= ino < first + count:
                return directory
        return None

    def is_file(self, ino: int) -> bool:
        """Whether ``ino`` is a regular file's own entry (read and sound)."""
        return 1 <= ino < len(self.kinds) and self.kinds[ino] & 0x0F == FILE

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
        """LINK entries that name ``target`` (built on first use: only damaged files need it)."""
        if self._links is None:
            self._links = {}
            for ino, kind in enumerate(self.kinds):
                if kind & 0x0F == LINK:
                    try:
                        self._links.setdefault(self._tree.stored_entry(ino).target, []).append(ino)
                    except FormatError:
                        continue
        return self._links.get(target, [])


class TreeCheck:
    """Checks the entries of one bundle, writing what it finds to ``findings``."""

    def __init__(self, tree_model: TreeModel, config: fmt.Config, findings: Findings) -> None:
        self.tree_model = tree_model
        self.config = config
        self.findings = findings

    def run(self) -> InodeTable:
        """Read every entry once into the table, then check the tree and the links."""
        config, tree_model = self.config, self.tree_model
        n = config.entry_count
        tree = InodeTable(tree_model, n)
        counts = integrity.TreeCounts()
        links: list[tuple[int, int]] = []  # (LINK entry, target)
        nlinks: dict[int, int] = {}  # file with an NLINK part -> its nlink
        previous: bytes | None = None
        for ino in range(1, n + 1):
            self.findings.tick("entries", ino, n)
            try:
                entry = tree_model.stored_entry(ino)
            except FormatError as e:
                self.findings.problem("entry", f"entry {ino}: {e}")
                previous = None
                continue
            counts.add(entry)
            kind = BAD
            if entry.is_link:
                kind = LINK
                links.append((ino, entry.target))
            elif entry.is_file:
                kind = FILE
                if entry.flags & fmt.FLAG_NLINK:
                    nlinks[ino] = entry.nlink
            elif entry.is_dir:
                kind = DIR
                tree.add_dir(entry)
            elif entry.is_symlink:
                kind = SYMLINK
            elif entry.is_special:
                kind = SPECIAL
            # Which directory lists an inode is known only once every directory is read: keep
            # the one bit the name-order rule needs against the inode before it.
            if previous is not None and integrity.child_order(0, previous, entry.name) is None:
                kind |= NAME_AFTER_PREVIOUS
            tree.kinds[ino] = kind
            previous = entry.name
        self.findings.report.entries = n
        self.findings.report.files, self.findings.report.dirs = counts.files, counts.dirs
        self.findings.report.symlinks, self.findings.report.hardlinks = (
            counts.symlinks,
            counts.hardlinks,
        )
        self.findings.report.specials = counts.specials
        try:
            extra = next(tree_model.stored_entries(n + 1, 1), None)
        except FormatError:
            extra = None  # "no entry n+1": as it should be
        if extra is not None:
            self.findings.problem("entry", f"entry {n + 1} exists past the entry count {n}")
        for message in counts.problems_against(config):
            self.findings.problem("config", message)
        self._check_tree(tree)
        self._check_links(tree, links, nlinks)
        if config.format_version >= fmt.FIRST_V5_VERSION:
            self._check_totals(tree)
        self._check_sources(tree)
        return tree

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
        kinds = tree.kinds
        if kinds[fmt.ROOT_INO] & 0x0F != DIR:
            self.findings.problem("entry", "the root entry is not a readable directory")
        tree.sort()
        covered = fmt.ROOT_INO + 1  # the next inode a child range must start at
        for first, count, directory in tree.ranges:
            end = first + count
            if first != covered:
                what = "no directory holds" if first > covered else "two directories hold"
                lo, hi = min(first, covered), max(first, covered) - 1
                self.findings.problem("entry", f"{what} entries {lo}…{hi}")
            if end - 1 > len(kinds) - 1:
                self.findings.problem(
                    "entry", f"directory {directory} lists children past the last entry"
                )
            covered = max(covered, end)
            subdirs = 0
            for ino in range(first, min(end, len(kinds))):
                kind = kinds[ino]
                if kind & 0x0F == DIR:
                    subdirs += 1
                if ino > first and kind and kinds[ino - 1] and not kind & NAME_AFTER_PREVIOUS:
                    names = tree.name(ino - 1), tree.name(ino)
                    message = integrity.child_order(directory, *names)
                    self.findings.problem(
                        "entry", f"{tree.path(ino)}: {message}", path=tree.path(ino)
                    )
            parent, nlink = tree.dirs[directory]
            message = integrity.directory_nlink(nlink, subdirs)
            if message is not None:
                self.findings.problem("entry", f"directory {tree.path(directory)} {message}")
        if covered != len(kinds):
            self.findings.problem("entry", f"no directory holds entries {covered}…{len(kinds) - 1}")
        for directory, (parent, _nlink) in tree.dirs.items():
            holder = tree.holder(directory)
            expected = fmt.ROOT_INO if directory == fmt.ROOT_INO else holder
            message = integrity.child_directory_parent(directory, parent, expected)
            if message is not None:
                self.findings.problem("entry", f"{tree.path(directory)}: {message}")

    def _check_links(self, tree: InodeTable, links: list, nlinks: dict[int, int]) -> None:
        names: dict[int, int] = {}
        for ino, target in links:
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
        for directory in sorted(tree.dirs, reverse=True):
            total: fmt.TreeTotals | None = fmt.TreeTotals()
            try:
                for child in self.tree_model.stored_entries(*tree.children_of(directory)):
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
