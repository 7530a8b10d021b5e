"""Where the entries of a bundle come from: the ``EntrySource`` seam, and ``DirectorySource``.

The builder asks a source for the children of each directory it has seen, breadth first, and
reads links and content through it; it never touches the source's storage itself. A directory on
disk is ``DirectorySource``, here; archives, object-store prefixes and stored bundles are the other
modules of ``bundlefs.packing.sources``. A ``StreamingSource`` (an archive, read once) stores its
content itself, through a ``ContentSink``, before the builder walks it.

What the source fails to deliver (an unreadable directory, a file that vanished, a name too long)
is reported to ``SourceErrors``: a ``PackError``, or with ``skip_errors`` a warning and a skipped
path (a directory is opened when it is probed, so an unreadable one is left out like a file).
Memory: the names of the directory being listed and a read-ahead window of at most
``_READ_AHEAD_FILES`` small files.

May import: ``bundlefs.core``, ``bundlefs.errors``.
"""

from __future__ import annotations

import errno
import fnmatch
import logging
import os
import stat as statmod
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from bundlefs.core import format as fmt
from bundlefs.errors import PackError

log = logging.getLogger(__name__)

READ_CHUNK = 1024 * 1024
_READ_AHEAD_FILES = 64  # files probed ahead of the writer; each holds at most _READ_AHEAD_MAX bytes
_READ_AHEAD_MAX = 1024 * 1024


# -- the interface ---------------------------------------------------------------------------------


class Stat(Protocol):
    """What the packer uses of an ``os.stat_result``; a source may hand over any such object.

    The file type and permission bits, owner, mtime and size go into the entry, and a device's
    ``st_rdev``; ``st_nlink`` with (``st_dev``, ``st_ino``) is how later names of a hard-linked
    file are recognised.
    """

    @property
    def st_mode(self) -> int: ...
    @property
    def st_uid(self) -> int: ...
    @property
    def st_gid(self) -> int: ...
    @property
    def st_mtime_ns(self) -> int: ...
    @property
    def st_size(self) -> int: ...
    @property
    def st_nlink(self) -> int: ...
    @property
    def st_dev(self) -> int: ...
    @property
    def st_ino(self) -> int: ...
    @property
    def st_rdev(self) -> int: ...


# How many leading bytes of a file the builder sees: enough for every magic number
# core/content_types.py sniffs (a tar's is at 257).
HEAD_SIZE = 264


@dataclass(frozen=True, slots=True)
class StoredContent:
    """Where one file's content went in the shard streams, as the content writer stored it."""

    shard: int
    offset: int  # of its first byte in the shard's uncompressed stream
    size: int
    crc32c: int
    st: Stat  # the file's status as it was opened (what the entry records)
    head: bytes  # its first HEAD_SIZE bytes (fewer if it is shorter), for content sniffing
    content_type: str | None = None  # a merge keeps its input's; None: the builder's rules say
    digest: bytes = b""  # format version 5 (fmt.DIGEST_NAME); b"": none (an older bundle's file)


@dataclass(slots=True)
class SourceItem:
    """One entry the source delivers.

    ``data`` is the whole content of a regular file the source already read (its read-ahead),
    with ``before`` and ``after`` the file's status around that read, which tell whether the file
    changed while it was read; otherwise ``data`` is None and content comes from ``open``.
    ``stored`` is set instead by a source that streams content into the shards itself, in its own
    order, before the builder walks the tree (an archive read once from start to end).
    """

    rel: bytes  # the path below the root, components joined by b"/"; b"" is the root
    name: bytes  # the last component (b"" for the root)
    st: Stat  # the entry itself, not what a symlink points to
    data: bytes | None = None
    before: Stat | None = None
    after: Stat | None = None
    stored: StoredContent | None = None


class Content(Protocol):
    """An open regular file of the source, read once from start to end."""

    def stat(self) -> Stat:
        """Its status now: called before reading (what the entry records) and after."""
        ...

    def read(self, size: int) -> bytes:
        """Up to ``size`` more bytes; b"" at the end. Raises ``OSError``."""
        ...

    def close(self) -> None: ...


class EntrySource(Protocol):
    """The tree to pack, delivered one directory at a time.

    The builder asks for ``root`` once, then for the children of every directory item it was
    given, in the order it was given them (breadth first). ``children`` yields strictly increasing
    names (raw bytes order), which is the order inode numbers are assigned in, and reports what it
    cannot deliver to the ``SourceErrors`` it was made with instead of yielding it.
    """

    def root(self) -> SourceItem:
        """The root directory (``rel`` and ``name`` b""); raises ``PackError`` if unreadable."""
        ...

    def children(self, rel: bytes) -> Iterator[SourceItem]:
        """The children of the directory item at ``rel``, in name order."""
        ...

    def readlink(self, item: SourceItem) -> bytes:
        """The target of a symlink item. Raises ``OSError``."""
        ...

    def open(self, item: SourceItem) -> Content:
        """The content of a regular file item whose ``data`` is None. Raises ``OSError``."""
        ...


class ContentSink(Protocol):
    """Where a ``StreamingSource`` stores file content (the pack's ``ContentWriter``)."""

    def store_stream(self, rel: bytes, chunks: Iterable[bytes], st: Stat) -> StoredContent:
        """Append one file's bytes, as ``chunks`` yields them; where they went."""
        ...


@runtime_checkable
class StreamingSource(Protocol):
    """An ``EntrySource`` that stores file content itself, in its own order, before the builder
    walks it (an archive read once from start to end): ``load`` runs first, with the pack's
    content sink, and sets ``SourceItem.stored`` on the file items it will deliver."""

    def load(self, content: ContentSink) -> None: ...


class SourceErrors:
    """What happens when the source cannot deliver something: ``PackError``, or with
    ``skip_errors`` a warning and an entry in ``skipped``, and the pack goes on without it.

    Only the first ``NAMED`` skipped paths are warned about one by one, then one line says the
    rest are not named: a tree with thousands of unreadable files must cost what reading them
    costs, not thousands of lines through a terminal (each clearing and redrawing the progress
    line). ``skipped`` holds every one (``pack --json`` lists them)."""

    NAMED = 20

    def __init__(self, skip_errors: bool) -> None:
        self.skip_errors = skip_errors
        self.skipped: list[str] = []  # what a bundle cannot hold and (with skip_errors) errors

    def _warn(self, message: str, *args: object) -> None:
        if len(self.skipped) < self.NAMED:
            log.warning(message, *args)
        elif len(self.skipped) == self.NAMED:
            log.warning(
                "skipping more: only the first %d skipped paths are named (pack --json lists "
                "every one)",
                self.NAMED,
            )

    def report(self, rel: bytes, error: OSError) -> None:
        where = os.fsdecode(rel) or "."
        if not self.skip_errors:
            raise PackError(f"cannot read {where}: {error.strerror or error}")
        self._warn("skipping %s: %s", where, error.strerror or error)
        self.skipped.append(where)

    def report_unlisted(self, rel: bytes, error: OSError) -> None:
        """A directory already delivered could not be listed: ``PackError``, or with
        ``skip_errors`` a warning saying it is stored empty (it is in the bundle by now)."""
        where = os.fsdecode(rel) or "."
        if not self.skip_errors:
            raise PackError(f"cannot read {where}: {error.strerror or error}")
        self._warn(
            "cannot list %s: %s; storing it as an empty directory", where, error.strerror or error
        )
        self.skipped.append(where)

    def skip(self, rel: bytes, why: str) -> None:
        """Leave out an entry a bundle cannot hold; never an error."""
        self._warn("skipping %s: %s", os.fsdecode(rel), why)
        self.skipped.append(os.fsdecode(rel))


# -- a directory tree on disk ----------------------------------------------------------------------


# Whether to read a small file ahead, by name and lstat (a delta pack skips unchanged ones).
ReadIf = Callable[[bytes, Stat], bool]


def _probe(
    path: bytes, rel: bytes, name: bytes, read_ahead: bool = True, read_if: ReadIf | None = None
) -> SourceItem | OSError:
    """lstat ``path`` and read it whole if it is a small regular file (unless not
    ``read_ahead``, or ``read_if`` says no); runs on reader threads."""
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
    if read_if is not None and not read_if(name, item.st):
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


def _probe_all(args: list[tuple]) -> list[SourceItem | OSError]:  # several probes, one task
    return [_probe(*a) for a in args]


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

    def root(self) -> SourceItem:
        try:
            st = os.stat(self._root)
        except OSError as e:
            raise PackError(f"cannot read the source: {e.strerror}") from e
        return SourceItem(b"", b"", st)

    def children(self, rel: bytes) -> Iterator[SourceItem]:
        yield from self.named_children(rel, self.names(rel))

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
        # Every name is checked before the first child is delivered, so what this reports comes
        # before anything the builder reports about the children.
        children = []
        for name in names:
            child_rel = rel + b"/" + name if rel else name
            if self._excluded(child_rel, name):
                continue
            if len(name) > fmt.MAX_NAME:
                self._errors.report(child_rel, OSError(errno.ENAMETOOLONG, "name too long"))
                continue
            children.append((name, child_rel))
        probes = self._probes(children, read_if)
        for (_name, child_rel), probed in zip(children, probes, strict=True):
            if isinstance(probed, OSError):
                self._errors.report(child_rel, probed)
                continue
            st = probed.st
            if (st.st_dev, st.st_ino) == self._skip:
                continue  # our own output, reached through a bind mount or the like
            yield probed

    def _probes(
        self, children: list[tuple[bytes, bytes]], read_if: ReadIf | None
    ) -> Iterator[SourceItem | OSError]:
        """Probes of ``children`` in order, computed up to _READ_AHEAD_FILES ahead on the pool
        (in tasks of 16 with ``read_if``: a delta pack's probes are mostly an lstat each)."""
        root, read_ahead = self._root, self._read_ahead
        args = [(os.path.join(root, rel), rel, name, read_ahead, read_if) for name, rel in children]
        if self._pool is None:
            yield from (_probe(*a) for a in args)
            return
        size = 1 if read_if is None else 16
        pending: deque = deque()
        for i in range(0, len(args), size):
            pending.append(self._pool.submit(_probe_all, args[i : i + size]))
            if len(pending) * size >= _READ_AHEAD_FILES:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()

    def readlink(self, item: SourceItem) -> bytes:
        return os.readlink(os.path.join(self._root, item.rel))

    def open(self, item: SourceItem) -> Content:
        return _OpenFile(os.path.join(self._root, item.rel))

    def _excluded(self, rel: bytes, name: bytes) -> bool:
        return bool(self._excludes) and excluded(rel, name, self._excludes)


def excluded(rel: bytes, name: bytes, patterns: tuple[str, ...]) -> bool:
    """Whether ``--exclude`` patterns match an entry, as its relative path or as its name."""
    rel_s, name_s = os.fsdecode(rel), os.fsdecode(name)
    return any(fnmatch.fnmatchcase(rel_s, p) or fnmatch.fnmatchcase(name_s, p) for p in patterns)


def excluded_below(parts: list[bytes], patterns: tuple[str, ...]) -> bool:
    """Whether ``patterns`` exclude the path ``parts`` or a directory above it: for a source
    that meets paths whole (an archive, an object listing) rather than walking down to them."""
    return any(excluded(b"/".join(parts[: i + 1]), part, patterns) for i, part in enumerate(parts))
