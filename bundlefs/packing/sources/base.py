"""Where the entries of a bundle come from: the ``EntrySource`` seam and what it delivers.

The builder asks a source for the children of each directory it has seen, breadth first, and
reads links and content through it; it never touches the source's storage itself. A directory
on disk is ``DirectorySource`` (``directory``); archives, object-store prefixes and stored
bundles are the other modules of ``bundlefs.packing.sources``. A ``StreamingSource`` (an
archive, read once) stores its content itself, through a ``ContentSink``, before the builder
walks it.

What the source fails to deliver (an unreadable directory, a file that vanished, a name too long)
is reported to ``SourceErrors``: a ``PackError``, or with ``skip_errors`` a warning and a skipped
path (a directory is opened when it is probed, so an unreadable one is left out like a file).

May import: ``bundlefs.core``, ``bundlefs.errors``.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from bundlefs.core.content_types import HeadFacts
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
    # Its first HEAD_SIZE bytes (fewer if it is shorter), for content sniffing, or what they say
    # (a source that keeps no bytes per file: ``synthetic.SyntheticTree``).
    head: bytes | HeadFacts
    content_type: str | None = None  # a merge keeps its input's; None: the builder's rules say
    digest: bytes = b""  # format version 5 (fmt.DIGEST_NAME); b"": none (an older bundle's file)


# An unchanged file's entry in a delta pack's base, for the builder to copy (``packing.delta``):
# the value, its owner and content type indexes, that content type's name, its shard.
Reuse = tuple[bytes, int, int, str | None, int]

# A run of a directory's consecutive unchanged files, (rel, name, status, reuse) each in name
# order: a delta pack's source hands them to the builder at once (``SourceItem.run``), not one
# item each (a pack with nothing changed is mostly these: ~1 µs a file less).
CopiedRun = list[tuple[bytes, bytes, Stat, Reuse]]


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
    reuse: Reuse | None = None  # a delta pack's unchanged file: its entry in the base, to copy
    run: CopiedRun | None = None  # instead of one file, a run of them (rel, name: the last's)


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


# How finely a source's mtimes tell one version of a file from the next (a pack on a base trusts
# a file unchanged by its stat only as far as this: ``packing/delta.py``): a file system's are
# nanoseconds (``EXACT_MTIME``), a tar header's and an object's LastModified whole seconds
# (``SECOND_MTIME``); None: not at all (a zip's DOS time: 2 s, local time), compare content.
MtimeTick = int | None
EXACT_MTIME = 1
SECOND_MTIME = 10**9

# The bytes of a member read again from its start, for a source that can (a zip member, a listed
# file): a pack on a base compares a large member first, then stores it only if it changed.
ReadAgain = Callable[[], Iterable[bytes]]


class ContentSink(Protocol):
    """Where a ``StreamingSource`` stores file content: the pack's ``ContentWriter``, or on a
    base the delta's sink, which may take a member's content from the base instead (and then
    need not read ``chunks`` at all)."""

    def store_stream(
        self,
        rel: bytes,
        chunks: Iterable[bytes],
        st: Stat,
        *,
        tick: MtimeTick = EXACT_MTIME,
        again: ReadAgain | None = None,
    ) -> StoredContent:
        """Append one file's bytes, as ``chunks`` yields them; where they went. ``tick``: how
        fine ``st.st_mtime_ns`` is; ``again``: how to read the bytes once more, if the source
        can."""
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


def excluded(rel: bytes, name: bytes, patterns: tuple[str, ...]) -> bool:
    """Whether ``--exclude`` patterns match an entry, as its relative path or as its name."""
    rel_s, name_s = os.fsdecode(rel), os.fsdecode(name)
    return any(fnmatch.fnmatchcase(rel_s, p) or fnmatch.fnmatchcase(name_s, p) for p in patterns)


def excluded_below(parts: list[bytes], patterns: tuple[str, ...]) -> bool:
    """Whether ``patterns`` exclude the path ``parts`` or a directory above it: for a source
    that meets paths whole (an archive, an object listing) rather than walking down to them."""
    return any(excluded(b"/".join(parts[: i + 1]), part, patterns) for i, part in enumerate(parts))
