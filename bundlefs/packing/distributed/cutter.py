"""Where a tree is cut into partitions of about equal weight: the tree's shape as the planning
walk saw it (``Shape``: names and sizes only, ~(name length + 9) bytes an entry) and the cutter.

The tree, in depth-first name order, is cut into ranges of about equal weight (content bytes and
entries, half each), each cut placed at the shallowest directory boundary near its ideal place,
so directories stay whole where they fit in a share and a big one is split by name ranges. All
in integers: the same tree and count give the same cuts on every machine.

May import: nothing of bundlefs.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable

# How far a cut may move from its ideal place to fall on a shallower directory boundary: a
# share divided by this (a quarter), so partitions stay within 0.5 to 1.5 shares.
CUT_SLACK_DIVISOR = 4

Key = tuple[bytes, ...]  # a path as its components: tuples sort in depth-first name order


def key_of(rel: bytes) -> Key:
    return tuple(rel.split(b"/")) if rel else ()


class Shape:
    """A directory as the planning walk (or a listing) saw it, kept small: ~(name length + 9)
    bytes a child.

    ``names`` joins the children's names with b"/" (which no name holds); ``sizes`` has per child
    its content bytes (0 for a symlink, a special file or a later name of a hard-linked file) or
    -1 for a directory, whose node is in ``subdirs`` by child position. ``entries`` and ``bytes``
    are the totals below it.
    """

    __slots__ = ("names", "sizes", "subdirs", "entries", "bytes")

    def __init__(self) -> None:
        self.names = b""
        self.sizes = array("q")
        self.subdirs: dict[int, Shape] = {}
        self.entries = 0
        self.bytes = 0


def shape_of(listing: Callable[[bytes], Iterable[tuple[bytes, int]]]) -> Shape:
    """The shape of the tree whose directory ``rel`` ``listing(rel)`` lists: (name, size) in name
    order, size -1 for a directory. Directories are listed depth first, in name order."""
    top = Shape()
    order: list[tuple[Shape, Shape | None]] = [(top, None)]
    stack: list[tuple[Shape, bytes]] = [(top, b"")]
    while stack:
        node, rel = stack.pop()
        names: list[bytes] = []
        below: list[tuple[Shape, bytes]] = []
        for name, size in listing(rel):
            if size < 0:
                child = Shape()
                node.subdirs[len(names)] = child
                order.append((child, node))
                below.append((child, rel + b"/" + name if rel else name))
            elif size > 0:
                node.bytes += size
            names.append(name)
            node.sizes.append(size)
        node.names = b"/".join(names)
        node.entries = len(names)
        stack.extend(reversed(below))
    for node, parent in reversed(order):  # children before their parents: totals bottom up
        if parent is not None:
            parent.entries += node.entries
            parent.bytes += node.bytes
    return top


# A position in the tree's depth-first order: (entries, content bytes) before it. Its weight is
# bytes * N + entries * max(B, 1) for a tree of N entries and B bytes: entries and bytes count
# half each, in integers (the same cuts on every machine).
Pos = tuple[int, int]


class _Cutter:
    """Finds each cut: the boundary nearest its ideal place among those at the shallowest depth
    within a share / ``CUT_SLACK_DIVISOR`` of it."""

    def __init__(self, tree: Shape, count: int) -> None:
        self.tree = tree
        self.count = count
        self.n = tree.entries
        self.unit = max(tree.bytes, 1)
        self.total = self.weight((tree.entries, tree.bytes))

    def weight(self, pos: Pos) -> int:
        return pos[1] * self.n + pos[0] * self.unit

    def distance(self, pos: Pos, k: int) -> int:
        """|pos - ideal cut k| in units of 1 / count of the total weight."""
        return abs(self.weight(pos) * self.count - k * self.total)

    def in_window(self, pos: Pos, k: int) -> bool:
        return self.distance(pos, k) * CUT_SLACK_DIVISOR <= self.total

    def cut(self, k: int, after: Pos) -> tuple[Key, Pos] | None:
        """Cut ``k`` (1 .. count-1): the first path of the partition it starts and its position;
        None if the best boundary is not past ``after`` (the previous cut)."""
        best = self._descend(self.tree, (), (0, 0), None, k)
        if best is None or self.weight(best[1]) <= self.weight(after):
            return None
        if self.weight(best[1]) >= self.total:
            return None
        return best

    def _descend(
        self, node: Shape, parts: Key, start: Pos, following: tuple[Key, Pos] | None, k: int
    ) -> tuple[Key, Pos] | None:
        """The cut within ``node`` (whose children start at ``start``; ``following`` is the
        boundary just after it, None at the end of the tree)."""
        names = node.names.split(b"/") if len(node.sizes) else []
        pos = start
        best: tuple[int, int, Pos] | None = None  # (distance, child, position)
        containing: tuple[int, Pos, Pos] | None = None  # (child, its start, its end)
        target = k * self.total
        for i, size in enumerate(node.sizes):
            sub = node.subdirs.get(i)
            if sub is not None:
                end = (pos[0] + 1 + sub.entries, pos[1] + sub.bytes)
            else:
                end = (pos[0] + 1, pos[1] + size)
            if self.in_window(pos, k):
                d = self.distance(pos, k)
                if best is None or d < best[0]:
                    best = (d, i, pos)
            if containing is None and self.weight(end) * self.count > target:
                containing = (i, pos, end)
            pos = end
        if best is not None:
            return parts + (names[best[1]],), best[2]
        if containing is None:
            return following
        i, begin, end = containing
        after = (parts + (names[i + 1],), end) if i + 1 < len(names) else following
        sub = node.subdirs.get(i)
        if sub is not None and self.weight((begin[0] + 1, begin[1])) * self.count <= target:
            # The ideal place is inside this directory's children: cut there, one level down.
            inner = self._descend(sub, parts + (names[i],), (begin[0] + 1, begin[1]), after, k)
            if inner is not None:
                return inner
        # A file (or a directory's own entry) wider than the window holds the ideal place: the
        # nearer of the boundaries around it.
        before = (parts + (names[i],), begin)
        if after is None or self.distance(before[1], k) <= self.distance(after[1], k):
            return before
        return after


def cuts(tree: Shape, count: int) -> list[tuple[Key, Pos]]:
    cutter = _Cutter(tree, count)
    cuts: list[tuple[Key, Pos]] = []
    last: Pos = (0, 0)
    for k in range(1, count):
        found = cutter.cut(k, last)
        if found is not None:
            cuts.append(found)
            last = found[1]
    return cuts
