"""The tree invariants and count fields of docs/format.md ("The entry tree"), in one place.

Each rule is a function that says what is wrong in one sentence, or returns None. The reader
applies the rules it meets on its way and fails fast (``enforce`` raises ``FormatError``);
``verify`` applies every rule to every entry and collects every problem. Entries and the config
in, messages out: no I/O.

May import: ``bundlefs.core.format``, ``bundlefs.errors``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from bundlefs.core import format as fmt
from bundlefs.errors import FormatError


def enforce(problem: str | None) -> None:
    """Fail fast on a broken rule (the reader's way)."""
    if problem is not None:
        raise FormatError(problem)


# -- a directory and its children ------------------------------------------------------------------


def child_order(directory: int, previous: bytes, name: bytes) -> str | None:
    """A directory's children are one inode range in strictly increasing name order (raw bytes),
    which is what lets a lookup bisect the range."""
    if name <= previous:
        return f"names in directory {directory} are not strictly increasing (duplicate or unsorted)"
    return None


def child_directory_parent(child: int, named_parent: int, directory: int | None) -> str | None:
    """A directory names as its parent the directory that lists it (the root names itself), else
    a forged index could alias one directory under two names, or make a cycle). ``directory`` is
    None where no directory lists ``child``: no parent is right then."""
    if named_parent != directory:
        return f"directory {child} names {named_parent} as its parent, not {directory}"
    return None


def parent_lists(directory: fmt.Entry, parent: fmt.Entry) -> str | None:
    """The entry a directory names as its parent is a directory whose child range holds it; the
    root is its own parent."""
    inside = parent.first_child <= directory.ino < parent.first_child + parent.size
    if parent.is_dir and (inside or directory.ino == fmt.ROOT_INO == parent.ino):
        return None
    return f"directory {directory.ino} names {directory.parent} as its parent"


def directory_nlink(nlink: int, subdirectories: int) -> str | None:
    """A directory's link count is 2 plus its subdirectories, as on a POSIX file system."""
    if nlink != 2 + subdirectories:
        return f"has nlink {nlink}, expected {2 + subdirectories}"
    return None


def link_target(link: int, target: int, target_is_file: bool) -> str | None:
    """A hard link (LINK entry) names a regular file, never another link or a directory."""
    if not target_is_file:
        return f"hard link {link} points to entry {target}, which is not a file"
    return None


def link_count(file_nlink: int, names: int) -> str | None:
    """A file's nlink is the number of entries naming it: itself plus its LINK entries."""
    if file_nlink != names:
        return f"nlink {file_nlink} but {names} names"
    return None


# -- the whole table -------------------------------------------------------------------------------


def entry_count(config: fmt.Config, held: int) -> str | None:
    """The config's entry count is the number of entries the index holds (readers size tables by
    it: a forged count would make them allocate for entries that are not there)."""
    if held != config.entry_count:
        return f"config claims {config.entry_count} entries, the index {held}"
    return None


@dataclass
class TreeCounts:
    """The count fields of the config, as the entries add them up."""

    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    hardlinks: int = 0
    data_bytes: int = 0
    specials: int = 0  # FIFOs, sockets, devices (version 4): entry_count less the other counts

    def add(self, entry: fmt.Entry) -> None:
        """Count one entry (a LINK entry counts as a hard link, not as the file it names)."""
        if entry.is_link:
            self.hardlinks += 1
        elif entry.is_file:
            self.files += 1
            self.data_bytes += entry.size
        elif entry.is_dir:
            self.dirs += 1
        elif entry.is_symlink:
            self.symlinks += 1
        elif entry.is_special:
            self.specials += 1

    @classmethod
    def claimed_by(cls, config: fmt.Config) -> TreeCounts:
        return cls(
            config.file_count,
            config.dir_count,
            config.symlink_count,
            config.hardlink_count,
            config.data_bytes,
            config.special_count,
        )

    def problems_against(self, config: fmt.Config) -> list[str]:
        """Every count field of ``config`` that the entries do not add up to."""
        claimed = self.claimed_by(config)
        return [
            f"config says {getattr(claimed, name)} {name}, the entries hold {getattr(self, name)}"
            for name in ("files", "dirs", "symlinks", "hardlinks", "data_bytes", "specials")
            if getattr(claimed, name) != getattr(self, name)
        ]


# -- directory totals (version 5) ------------------------------------------------------------------

_ONE_ENTRY = fmt.TreeTotals(entries=1)


def child_totals(child: fmt.Entry, below: fmt.TreeTotals | None = None) -> fmt.TreeTotals:
    """What one child adds to its directory's totals: itself (a regular file without ``LINK``
    counts as a file and its bytes, its first name holding the content; every entry counts as an
    entry) and, for a directory, ``below``, its own totals."""
    if child.is_dir:
        mine = fmt.TreeTotals(dirs=1, entries=1)
        return mine if below is None else mine + below
    if child.is_file and not child.is_link:
        return fmt.TreeTotals(files=1, bytes=child.size, entries=1)
    return _ONE_ENTRY


def directory_totals(directory: int, stored: fmt.TreeTotals, summed: fmt.TreeTotals) -> str | None:
    """A directory's totals are the sum of what its children add (``child_totals``)."""
    if stored != summed:
        return f"directory {directory} has totals {stored}, its children add up to {summed}"
    return None


def root_totals(config: fmt.Config, root: fmt.TreeTotals) -> str | None:
    """The root's totals are the config's counts: every file and byte, every directory and
    entry but the root itself. Checked at open: one lookup, no scan."""
    expected = fmt.TreeTotals(
        config.file_count, config.dir_count - 1, config.data_bytes, config.entry_count - 1
    )
    if root != expected:
        return f"the root's totals {root} are not the config's counts {expected}"
    return None


def totals_of(entries: Iterable[fmt.Entry]) -> list[tuple[int, fmt.TreeTotals]]:
    """Every directory's totals, in inode order, from a tree's entries in inode order (numbered
    breadth first: a directory's children are one range after it). For a bundle older than
    version 5 rewritten in version 5 (``compact``); O(directories) memory."""
    inos: list[int] = []
    parents: list[int] = []
    sums: list[list[int]] = []  # files, dirs, bytes, entries: what the direct children add
    ranges: deque[tuple[int, int, int]] = deque()  # (first child, end, directory's position)
    for entry in entries:
        while ranges and entry.ino >= ranges[0][1]:
            ranges.popleft()
        holder = ranges[0][2] if ranges and ranges[0][0] <= entry.ino else None
        if entry.is_dir:
            position = len(inos)
            inos.append(entry.ino)
            parents.append(position if holder is None else holder)
            sums.append([0, 0, 0, 0])
            if entry.size:
                ranges.append((entry.first_child, entry.first_child + entry.size, position))
        if holder is not None:
            mine = child_totals(entry)
            for i, value in enumerate((mine.files, mine.dirs, mine.bytes, mine.entries)):
                sums[holder][i] += value
    for position in range(len(inos) - 1, 0, -1):  # a child directory after its parent
        for i, value in enumerate(sums[position]):
            sums[parents[position]][i] += value
    return [(ino, fmt.TreeTotals(*sums[position])) for position, ino in enumerate(inos)]
