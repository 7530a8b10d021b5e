"""Where shard bytes live: the one small interface the read path reads through.

``ShardStore`` reads a byte range of a named shard file; that is all the read path above needs
from storage (records, CRCs and decompression are ``ShardSet``'s job, one level up). A bundle on
local disk is ``LocalShardStore`` (pread/preadv on file descriptors opened relative to the bundle
directory); a bundle on an object store becomes a second implementation of the same interface,
not a fork of the read path.

May import: the standard library, ``bundlefs.errors``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from typing import Protocol

from bundlefs.errors import BundleClosedError, FormatError, ShardUnavailable, WouldBlock


class ShardStore(Protocol):
    """Byte ranges of the named shard files of one bundle. Thread-safe.

    Errors: ``ShardUnavailable`` (an ``OSError``) for a shard that cannot be opened, ``OSError``
    for one that cannot be read (the caller knows which record it was for and reports that),
    ``WouldBlock`` where ``nowait`` was asked and the bytes are not at hand,
    ``BundleClosedError`` after ``close``. A range past the end of a shard comes back
    short; the caller decides whether that is damage.
    """

    def read(self, name: str, offset: int, length: int, *, nowait: bool = False) -> bytes:
        """Up to ``length`` bytes of shard ``name`` from ``offset``."""
        ...

    def read_into(
        self, name: str, offset: int, buffer: bytearray | memoryview, *, nowait: bool = False
    ) -> int:
        """Fill ``buffer`` from ``offset``; the number of bytes read (short at end of file)."""
        ...

    def prefetch(self, name: str, offset: int, length: int) -> None:
        """Advise that these bytes will be read soon. Never waits, never raises."""
        ...

    def close(self) -> None:
        """Release every resource. Must not race reads in other threads."""
        ...


def _preadv(fd: int, buffer: bytearray | memoryview, offset: int, nowait: bool) -> int:
    """preadv into ``buffer``; with ``nowait``, only from the page cache (RWF_NOWAIT): a read
    that would wait for the disk raises WouldBlock instead.

    The mount's event loop reads cached data inline (~10 µs) and sends only real disk reads to a
    worker thread (a thread hop alone costs ~200 µs).
    """
    if not nowait:
        return os.preadv(fd, [buffer], offset)
    try:
        got = os.preadv(fd, [buffer], offset, os.RWF_NOWAIT)
    except BlockingIOError:
        raise WouldBlock from None
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without RWF_NOWAIT
            raise WouldBlock from None
        raise
    if got != len(buffer):
        raise WouldBlock  # partly cached, or short: the blocking read decides which
    return got


class LocalShardStore:
    """Shard files in a local bundle directory, opened lazily, read with pread."""

    def __init__(self, bundle_dir: str) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        # Shards are opened lazily, relative to the directory opened now: a bundle replaced at
        # the same path later (pack --force) cannot lend this one its shards.
        try:
            self._dir_fd: int | None = os.open(
                bundle_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
            )
        except OSError as e:
            raise FormatError(f"cannot open the bundle directory: {e.strerror}") from None

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is not None:
            return fd
        with self._lock:
            fd = self._fds.get(name)
            if fd is None:
                if self._dir_fd is None:
                    raise BundleClosedError("the bundle is closed")
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self._dir_fd)
                except OSError as e:
                    raise ShardUnavailable(e.errno, e.strerror, name) from None
                self._fds[name] = fd
        return fd

    def file_size(self, name: str) -> int | None:
        """The size of shard file ``name`` now, from a stat (no read); None if it is missing.

        Raises ``OSError`` for any other failure, ``BundleClosedError`` after ``close``.
        """
        fd = self._fds.get(name)
        if fd is not None:
            return os.fstat(fd).st_size
        if self._dir_fd is None:
            raise BundleClosedError("the bundle is closed")
        try:
            return os.stat(name, dir_fd=self._dir_fd).st_size
        except FileNotFoundError:
            return None

    def forked(self) -> None:
        """In a child after ``fork()``: a lock another thread held then would stay held here.
        The descriptors stay valid (pread shares no file position)."""
        self._lock = threading.Lock()

    def read(self, name: str, offset: int, length: int, *, nowait: bool = False) -> bytes:
        fd = self._fd(name)
        if not nowait:
            return os.pread(fd, length, offset)
        buffer = bytearray(length)
        _preadv(fd, buffer, offset, nowait=True)
        return bytes(buffer)

    def read_into(
        self, name: str, offset: int, buffer: bytearray | memoryview, *, nowait: bool = False
    ) -> int:
        return _preadv(self._fd(name), buffer, offset, nowait)

    def prefetch(self, name: str, offset: int, length: int) -> None:
        with contextlib.suppress(OSError, BundleClosedError):
            os.posix_fadvise(self._fd(name), offset, length, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            if self._dir_fd is not None:
                os.close(self._dir_fd)
                self._dir_fd = None
