"""A directory tree on disk as an ``EntrySource``: ``DirectorySource`` (breadth first, names
sorted bytewise, probes and reads ahead on the pack's threads).

What it fails to deliver goes to the ``SourceErrors`` it was made with (``base``). Memory: the
names of the directory being listed and a read-ahead window of at most ``_READ_AHEAD_FILES``
small files (and for ``probed_known``, up to ``KNOWN_WINDOW`` items lstat'ed ahead, and
``split_ahead``'s next directory: its names and first window; the files it will read hinted to
the kernel ahead, ``read_hints``: in the page cache, not here).

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage.native`` (the compiled
lstat loop of a pack on a base), ``bundlefs.packing.sources.base``, ``.read_hints`` and
``.known_split``.
"""

from __future__ import annotations

import errno
import os
import stat as statmod
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass

from bundlefs.core import format as fmt
from bundlefs.errors import PackError
from bundlefs.packing.sources.base import (
    _READ_AHEAD_FILES,
    _READ_AHEAD_MAX,
    EXACT_MTIME,
    READ_CHUNK,
    Content,
    CopiedRun,
    MtimeTick,
    SourceErrors,
    SourceItem,
    excluded,
)
from bundlefs.packing.sources.known_split import KNOWN_WINDOW, Known, merged, run_item, split_known
from bundlefs.packing.sources.read_hints import ReadHints
from bundlefs.storage import native

# Whether to read a small file ahead, given its item as lstat'ed (a delta pack skips unchanged
# ones, and may mark them ``reuse`` instead; called on the walking thread, which probes a delta
# pack's files itself: ``DirectorySource._probes``).
ReadIf = Callable[[SourceItem], bool]


def _probe(
    path: bytes, rel: bytes, name: bytes, read_ahead: bool = True, read_if: ReadIf | None = None
) -> SourceItem | OSError:
    """lstat ``path`` and read it whole if it is a small regular file (unless not
    ``read_ahead``, or ``read_if`` says no); runs on reader threads (a delta pack's on the
    walking thread)."""
    try:
        item = SourceItem(rel, name, os.lstat(path))
    except OSError as e:
        return e
    if statmod.S_ISDIR(item.st.st_mode):
        # A directory that cannot be listed is reported here, while it can still be left out
        # (skipped, as an unreadable file is): once delivered it is in the bundle, and its
        # children are listed only later, breadth first.
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC))
        except OSError as e:
            return e
        return item
    if not read_ahead or not statmod.S_ISREG(item.st.st_mode) or item.st.st_size > _READ_AHEAD_MAX:
        return item
    if read_if is not None and not read_if(item):
        return item
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return item  # the writer retries and reports it with its own policy
    try:
        before = os.fstat(fd)
        if statmod.S_ISREG(before.st_mode):
            chunks = []
            while chunk := os.read(fd, READ_CHUNK):
                chunks.append(chunk)
            after = os.fstat(fd)
            item.data, item.before, item.after = b"".join(chunks), before, after
    except OSError:
        item.data = item.before = item.after = None
    finally:
        os.close(fd)
    return item


class _OpenFile:
    """``Content`` of a file opened by descriptor: never follows a symlink, never blocks on a
    FIFO swapped in since the walk saw a regular file."""

    __slots__ = ("_fd",)

    def __init__(self, path: bytes) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)

    def stat(self) -> os.stat_result:
        return os.fstat(self._fd)

    def read(self, size: int) -> bytes:
        return os.read(self._fd, size)

    def close(self) -> None:
        os.close(self._fd)


@dataclass
class _SplitAhead:
    """What ``split_ahead`` did for the directory ``rel``: its children (``checked``), their
    first window split (``split_known``) and the hints of the files to read."""

    rel: bytes
    children: list[tuple[bytes, bytes]]
    quick: CopiedRun
    rest: list[tuple[bytes, bytes]]
    hints: ReadHints


class DirectorySource:
    """A directory tree on disk, listed with names sorted bytewise.

    With a ``pool``, reader threads lstat and read small files up to ``_READ_AHEAD_FILES`` entries
    ahead of the builder: source reads overlap (a cold disk or NFS serves many requests at once)
    while entries still come out in one deterministic order. ``skip`` is the (st_dev, st_ino) of
    a directory never to deliver: the bundle being written, should the walk meet it (a bind
    mount, say), so the packer never reads its own growing output. Without ``read_ahead`` no file
    is read, only lstat'ed: a walk that wants the tree's shape and sizes, not its content (the
    partition planner, ``distributed/plan.py``).
    """

    # How fine its mtimes are (a pack on a base trusts a stat this far: ``sources.base``).
    mtime_tick: MtimeTick = EXACT_MTIME

    def __init__(
        self,
        root: str,
        errors: SourceErrors,
        *,
        excludes: tuple[str, ...] = (),
        pool: Executor | None = None,
        skip: tuple[int, int] | None = None,
        read_ahead: bool = True,
    ) -> None:
        self._root, self._errors, self._excludes = os.fsencode(root), errors, excludes
        self._pool, self._skip, self._read_ahead = pool, skip, read_ahead
        self._ahead: _SplitAhead | None = None  # split_ahead's directory

    def root(self) -> SourceItem:
        try:
            st = os.stat(self._root)
        except OSError as e:
            raise PackError(f"cannot read the source: {e.strerror}") from e
        return SourceItem(b"", b"", st)

    def children(self, rel: bytes, read_if: ReadIf | None = None) -> Iterator[SourceItem]:
        """The children of ``rel`` (``named_children`` of every name in it)."""
        yield from self.named_children(rel, self.names(rel), read_if)

    def names(self, rel: bytes) -> list[bytes]:
        """The names in the directory ``rel``, sorted bytewise; [] (reported) if it cannot be
        listed."""
        path = os.path.join(self._root, rel) if rel else self._root
        try:
            return sorted(os.listdir(path))
        except OSError as e:
            # Readable when probed (or the root): it changed since, and is in the bundle already.
            self._errors.report_unlisted(rel, e)
            return []

    def named_children(
        self, rel: bytes, names: list[bytes], read_if: ReadIf | None = None
    ) -> Iterator[SourceItem]:
        """The children of the directory ``rel`` called ``names`` (sorted bytewise), as
        ``children`` delivers them: excluded names left out, the others probed (and read ahead,
        those ``read_if`` accepts when given). A caller that wants only some of a directory (one
        partition of the tree) probes only those."""
        return self.probed(self.checked(rel, names), read_if)

    def checked(self, rel: bytes, names: list[bytes]) -> list[tuple[bytes, bytes]]:
        """(name, path) of the children of ``rel`` called ``names`` that may be delivered:
        excluded names left out, names too long reported. Every name is checked before the first
        child is delivered, so what this reports comes before anything the builder reports
        about the children."""
        excludes = self._excludes
        if not excludes and (not names or len(max(names, key=len)) <= fmt.MAX_NAME):
            # The common case in one comprehension, not the loop below (py-spy: the loop was
            # ~5 % of a pack on a base with nothing changed).
            at = rel + b"/" if rel else b""
            return [(name, at + name) for name in names]
        children = []
        for name in names:
            child_rel = rel + b"/" + name if rel else name
            if excludes and excluded(child_rel, name, excludes):
                continue
            if len(name) > fmt.MAX_NAME:
                self._errors.report(child_rel, OSError(errno.ENAMETOOLONG, "name too long"))
                continue
            children.append((name, child_rel))
        return children

    @property
    def prefix(self) -> bytes:
        """The root's path ending in "/": a child's path is this and its ``rel``."""
        return os.path.join(self._root, b"")

    def probed(
        self,
        children: list[tuple[bytes, bytes]],
        read_if: ReadIf | None = None,
        hints: ReadHints | None = None,
    ) -> Iterator[SourceItem]:
        """``children`` (from ``checked``) probed in order: what cannot be probed reported and
        left out, as is our own output. ``hints``: with ``read_if``, the kernel's read-ahead of
        ``children`` (those a delta pack did not find unchanged: mostly read)."""
        probes = self._probes(children, read_if, hints)
        for (_name, child_rel), probed in zip(children, probes, strict=True):
            if isinstance(probed, OSError):
                self._errors.report(child_rel, probed)
                continue
            st = probed.st
            if (st.st_dev, st.st_ino) == self._skip:
                continue  # our own output, reached through a bind mount or the like
            yield probed

    def known_children(
        self, rel: bytes, known: Known, read_if: ReadIf | None = None
    ) -> Iterator[SourceItem]:
        """The children of ``rel``, as ``children`` delivers them, those ``known`` holds and
        whose lstat matches delivered with their ``reuse`` (``probed_known``): a delta pack's.
        What ``split_ahead`` did for ``rel`` (with this ``known``) is used, not done again: taken
        by this call, not when the iterator starts."""
        ahead = self._ahead
        if ahead is not None and ahead.rel == rel:
            self._ahead = None
            return self.probed_known(rel, ahead.children, known, read_if, ahead)
        return self.probed_known(rel, self.checked(rel, self.names(rel)), known, read_if)

    def split_ahead(self, rel: bytes, known: Known) -> None:
        """Do now what ``known_children(rel, known)`` does first, that directory being the one
        a delta pack asks for next: list it, lstat its first window and hint the files to read
        to the kernel (``ReadHints``), so their reads are under way while the pack works
        through the directory before it. (Within a directory the hints came too late: its
        first read waited for the disk. The million tree of bench.delta, 10,000 touched files
        evicted, 10 packs alternating: the 4 fastest of 20 split ahead, 7.4-13.1 s against
        12.1 s at best; medians 20.2 and 24.8 s on this VM's disk, ~2 ms a random read.)
        Nothing, and nothing reported, where ``known_children`` would report (a directory that
        cannot be listed, a name too long): it does it again, and reports."""
        self._ahead = None
        if not (known and self._read_ahead and hasattr(os, "posix_fadvise")):
            return
        path = os.path.join(self._root, rel) if rel else self._root
        try:
            names = sorted(os.listdir(path))
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if names and len(max(names, key=len)) > fmt.MAX_NAME:
                return
            children = self.checked(rel, names)  # which reports nothing now
            quick, rest, hints = self._split_window(fd, children[:KNOWN_WINDOW], known)
        finally:
            os.close(fd)
        hints.before(0)
        self._ahead = _SplitAhead(rel, children, quick, rest, hints)

    def _split_window(
        self, fd: int, window: list[tuple[bytes, bytes]], known: Known
    ) -> tuple[CopiedRun, list[tuple[bytes, bytes]], ReadHints]:
        """``window`` of the directory open at ``fd`` split (compiled where built:
        ``native.known_files``, else ``split_known``) and the hints of the files to read."""
        split = native.known_files(fd, window, known)
        quick, rest = split_known(fd, window, known) if split is None else split
        return quick, rest, ReadHints([self.prefix + child_rel for _name, child_rel in rest])

    def probed_known(
        self,
        rel: bytes,
        children: list[tuple[bytes, bytes]],
        known: Known,
        read_if: ReadIf | None = None,
        ahead: _SplitAhead | None = None,
    ) -> Iterator[SourceItem]:
        """``children`` probed in order, as ``probed``, but a regular file whose name ``known``
        holds as ((mode, size, mtime_ns), reuse) is lstat'ed here, a window at a time, and
        delivered unread with that ``reuse`` when its lstat has that mode, size and mtime and
        one link (a delta pack's unchanged file), consecutive ones in one item
        (``SourceItem.run``); the others, and those whose stat differs (lstat'ed again), are
        probed as in any pack, and the two merged by name. This loop is most of what such a
        pack costs per unchanged file (no probe, no read_if, no item each). ``children`` are
        those of the directory ``rel``: each is lstat'ed by name in it, opened once (an
        ``fstatat``: ~18 % less time a call than the path from the root, measured on 100,000
        files five levels down)."""
        if not known:
            yield from self.probed(children, read_if)
            return
        try:
            fd = os.open(
                os.path.join(self._root, rel) if rel else self._root,
                os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
            )
        except OSError:
            yield from self.probed(children, read_if)  # which reports what fails
            return
        try:
            yield from self._probed_known_at(fd, children, known, read_if, ahead)
        finally:
            os.close(fd)

    def _probed_known_at(
        self,
        fd: int,
        children: list[tuple[bytes, bytes]],
        known: Known,
        read_if: ReadIf | None,
        ahead: _SplitAhead | None,
    ) -> Iterator[SourceItem]:
        """``probed_known`` of the directory open at ``fd``, ``KNOWN_WINDOW`` children at a
        time: compiled where built (``native.known_files``: a pack of 100,000 unchanged files
        took 0.28 s less, 1.13 → 0.85 s, medians of 5 alternating), else ``split_known``; the
        first window as ``ahead`` split it, if given."""
        for start in range(0, len(children), KNOWN_WINDOW):
            if start == 0 and ahead is not None:
                quick, rest, hints = ahead.quick, ahead.rest, ahead.hints
            else:
                window = children[start : start + KNOWN_WINDOW]
                quick, rest, hints = self._split_window(fd, window, known)
            if rest:
                yield from merged(quick, self.probed(rest, read_if, hints))
            elif quick:
                yield run_item(quick)  # nothing changed here: one run

    def _probes(
        self, children: list[tuple[bytes, bytes]], read_if: ReadIf | None, hints: ReadHints | None
    ) -> Iterator[SourceItem | OSError]:
        """Probes of ``children`` in order, computed up to _READ_AHEAD_FILES ahead on the pool;
        a delta pack's (``read_if``) here, one by one: they are the files it did not find
        unchanged, mostly alone between unchanged ones, and a hand-off to a reader thread and
        back cost more than the probe (a pack of 1,000,000 files on a base, 10,000 of them
        touched: 11.2 → 9.8 s, medians of 3 alternating; 20,000 files, 10 % changed: 0.68 →
        0.39 s; with the page cache dropped first, the same within the noise), with the kernel
        reading ahead on ``hints``."""
        root, read_ahead = self.prefix, self._read_ahead
        args = [(root + rel, rel, name, read_ahead, read_if) for name, rel in children]
        if self._pool is None or read_if is not None:
            if hints is None or not read_ahead or read_if is None:
                yield from (_probe(*a) for a in args)
                return
            for i, a in enumerate(args):
                hints.before(i)
                yield _probe(*a)
            return
        pending: deque = deque()
        for a in args:
            pending.append(self._pool.submit(_probe, *a))
            if len(pending) >= _READ_AHEAD_FILES:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    def readlink(self, item: SourceItem) -> bytes:
        return os.readlink(os.path.join(self._root, item.rel))

    def open(self, item: SourceItem) -> Content:
        return _OpenFile(os.path.join(self._root, item.rel))
