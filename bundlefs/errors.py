"""The bundlefs exception hierarchy.

Every error a bundle can cause is a ``BundleError``; callers map them to exit codes (the CLI) or
errno values (the FUSE layer). This module knows nothing of either.

May import: the standard library only: every other module imports this one.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager


class BundleError(Exception):
    """Base class of every error bundlefs raises on purpose."""


class NotABundleError(BundleError):
    """The path is not a bundle (missing or invalid completion marker)."""


class IncompleteBundleError(NotABundleError):
    """The directory looks like a bundle under construction or an interrupted pack."""


class BaseBundleError(BundleError):
    """A bundle's shards are in a base bundle (format version 6) that is missing, was replaced
    by another bundle, or cannot be reached: the message names the base and says which."""


class BundleClosedError(BundleError):
    """The bundle was used after ``close()``."""


class UnsupportedVersionError(BundleError):
    """The bundle was written by a newer, incompatible format version."""


class FormatError(BundleError):
    """A structure in the bundle violates docs/format.md."""


class CorruptDataError(FormatError):
    """Stored bytes disagree with their checksum or their promised size.

    Carries what is known about where the damage is, so a log line or a report can name it.
    """

    def __init__(
        self,
        message: str,
        *,
        bundle: str | None = None,
        path: str | None = None,
        shard: int | None = None,
        record: int | None = None,
        unreadable: bool = False,
    ) -> None:
        self.bundle = bundle
        self.path = path
        self.shard = shard
        self.record = record
        # The stored bytes could not be read at all (an I/O error, an object store away), as
        # opposed to read and found wrong: only the first may be an outage rather than damage.
        self.unreadable = unreadable
        self.detail = message
        super().__init__(self._describe())

    def _describe(self) -> str:
        where = []
        if self.path is not None:
            where.append(f"file {self.path!r}")
        if self.shard is not None:
            where.append(f"shard {self.shard}")
        if self.record is not None:
            where.append(f"record at offset {self.record}")
        if self.bundle is not None:
            where.append(f"bundle {self.bundle}")
        return self.detail + (" (" + ", ".join(where) + ")" if where else "")

    def with_context(
        self, *, bundle: str | None = None, path: str | None = None
    ) -> CorruptDataError:
        """Return a copy that also names the bundle and/or the file being read."""
        return CorruptDataError(
            self.detail,
            bundle=bundle if bundle is not None else self.bundle,
            path=path if path is not None else self.path,
            shard=self.shard,
            record=self.record,
            unreadable=self.unreadable,
        )


class _PathError(BundleError, OSError):
    """An error about one path that behaves like the ``OSError`` ``os`` raises for it: ``errno``,
    ``strerror`` (the C library's text) and ``filename`` (the path asked for) are set, so code
    written for files (``except OSError as e: e.errno == errno.ENOENT``) works on bundles.
    ``str()`` is the one sentence the CLI prints."""

    ERRNO = errno.EIO

    def __init__(self, message: str, filename: str | bytes | None = None) -> None:
        super().__init__(self.ERRNO, os.strerror(self.ERRNO), filename)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[type, tuple[str, str | bytes | None]]:  # picklable (pools)
        return type(self), (self.message, self.filename)


class EntryNotFound(_PathError, FileNotFoundError):
    """No entry of that name (``ENOENT``)."""

    ERRNO = errno.ENOENT


class SymlinkLoop(EntryNotFound):
    """Too many symbolic links on the way (``ELOOP``, as ``os.stat`` says); an ``EntryNotFound``
    too, since nothing is found at the end."""

    ERRNO = errno.ELOOP


class NotADirectory(_PathError, NotADirectoryError):
    """A path component that must be a directory is not one (``ENOTDIR``)."""

    ERRNO = errno.ENOTDIR


class IsADirectory(_PathError, IsADirectoryError):
    """File content was asked of a directory (``EISDIR``)."""

    ERRNO = errno.EISDIR


class NotARegularFile(_PathError):
    """Content asked of a FIFO, a socket or a device (format version 4), which hold none:
    ``ENXIO``, as ``open`` says of a socket or of a device without its driver."""

    ERRNO = errno.ENXIO


class NotASymlink(_PathError):
    """readlink of something that is not a symbolic link: ``EINVAL``, as ``os.readlink`` says."""

    ERRNO = errno.EINVAL


class PackError(BundleError):
    """Packing failed: the source could not be read, or the destination is in the way."""


class IndexWriteError(PackError):
    """LMDB failed while the packer wrote the index (a full disk or map, an I/O error).

    ``reason`` is what LMDB said, for a caller that names the bundle in its own message.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"cannot write the index: {reason}")

    def __reduce__(self) -> tuple[type, tuple[str]]:  # picklable, for process pools
        return type(self), (self.reason,)


class InvalidEntryError(PackError, ValueError):
    """An entry a ``Writer`` refuses when it is added: a path no bundle can hold (not relative,
    an empty, ``.`` or ``..`` component, a NUL, a name over 255 bytes), a path through a file or
    symlink added before, or a value out of range (mode, mtime, owner, user data, link target).
    Nothing was added; the ``Writer`` goes on."""


class DuplicatePathError(InvalidEntryError):
    """A path added to a ``Writer`` twice. (A directory that later paths implied may still be
    added once, to give it its own attributes.)"""


class ExtractError(BundleError):
    """Extraction cannot proceed: DEST is in the way, or a PATH is unsafe or missing."""


class ExportError(BundleError):
    """An export cannot proceed: OUT is in the way, or is a terminal."""


class UsageError(BundleError):
    """A command line that cannot be parsed: an unknown option (a flag or a ``-o`` option) or a
    malformed value (a size, a number, a choice, a ``KEY=VALUE``, a time). The CLI exits 2 for
    it, as argparse does for the flags it checks itself (docs/cli.md)."""


class MountError(BundleError):
    """The file system could not be mounted or unmounted; the message says why in one sentence."""


class MountOptionError(MountError, UsageError):
    """A mount option (``-o``) that is unknown or whose value is malformed."""


class StorageOptionsError(BundleError):
    """Storage options that cannot be used: a malformed pair, or an options file that is
    unreadable, malformed, or readable by others (it holds credentials)."""


class StorageOptionSyntaxError(StorageOptionsError, UsageError):
    """A ``--storage-option`` (or ``-o storage_option=``) that is not ``KEY=VALUE``: a usage
    error (exit 2)."""


class SizeError(UsageError, ValueError):
    """A size that cannot be parsed."""


class ShardUnavailable(OSError):
    """A shard store could not open a shard file (its errno and reason are the OS's).

    Not a ``BundleError``: ``ShardSet`` reports it as damage to that shard.
    """


class WouldBlock(Exception):
    """A read asked not to wait would have had to wait for the disk (data not in page cache).

    Not a ``BundleError``: nothing is wrong; the caller retries the read where it may block.
    """


class StorageError(BundleError):
    """An object store could not be reached, or refused us (credentials, permissions): the
    message says which store and why in one sentence. Raised where a bundle is opened; a record
    that cannot be fetched later is a ``CorruptDataError`` of the files it holds instead."""


class Interrupted(KeyboardInterrupt):
    """A signal (SIGTERM, SIGHUP, SIGINT) the command line turned into an exception, so that
    every clean-up Ctrl-C runs (``except BaseException``, ``finally``) runs for each of them."""

    def __init__(self, signum: int, name: str) -> None:
        super().__init__(name)
        self.signum = signum
        self.name = name


def note_cleanup(exc: BaseException, what: str, path: str | None = None) -> None:
    """Record on ``exc``, as it passes, what a clean-up did about it (``removed the partial
    bundle …``): the command line says it in the one line of an interruption. ``path``: the
    directory removed, so that one removed inside another later is not said twice."""
    exc.__dict__.setdefault("_bundlefs_cleanup", []).append((what, path))


def cleanups(exc: BaseException) -> list[str]:
    """What clean-ups recorded on ``exc`` (``note_cleanup``), in the order they ran, but for
    removals inside a directory another one removed."""
    notes: list[tuple[str, str | None]] = exc.__dict__.get("_bundlefs_cleanup", [])
    removed = [path.rstrip("/") + "/" for _what, path in notes if path]
    return [
        what
        for what, path in notes
        if path is None or not any(path.startswith(other) for other in removed)
    ]


@contextmanager
def naming(path: str | bytes | os.PathLike) -> Iterator[None]:
    """An ``OSError`` raised inside without a file name (a ``write`` on a descriptor: ENOSPC,
    EIO, EDQUOT) gets ``path`` as its ``filename``, so the sentence that reports it says where."""
    try:
        yield
    except OSError as e:
        if e.filename is None and e.errno is not None:
            e.filename = os.fsdecode(path)
        raise
