"""Where shard bytes live: the one small interface the read path reads through.

``ShardStore`` reads a byte range of a named shard file; that is all the read path above needs
from storage (records, CRCs and decompression are ``ShardSet``'s job, one level up). It states
what it can do as capabilities (``partial_reads_cheap``, ``reads_may_stall``, ``holds_copies``)
and answers ``discard``, ``forked``, ``stats`` and ``failed_read`` whatever it is, so the read
path asks, never probes; ``ShardStoreBase`` gives the defaults of a plain store. A bundle on local
disk is ``LocalShardStore`` (pread/preadv on file descriptors opened relative to the bundle
directory); a bundle on an object store is ``RemoteShardStore``
(storage/objectstore/shard_store.py), a second implementation of the same interface, not a fork
of the read path. ``tests/store/test_store_contract.py`` runs one suite over every store.

May import: the standard library, ``bundlefs.errors``.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import threading
from typing import Protocol

from bundlefs.errors import BundleClosedError, FormatError, ShardUnavailable, WouldBlock


class FailedRead(enum.Enum):
    """What a read that failed with EIO was: damage, or the object store's outage (a new failed
    read, or the same one retried by the kernel; storage/objectstore/outage.py)."""

    DAMAGE = "damage"
    OUTAGE = "outage"
    OUTAGE_RETRY = "outage-retry"


class ShardStore(Protocol):
    """Byte ranges of the named shard files of one bundle. Thread-safe.

    Errors: ``ShardUnavailable`` (an ``OSError``) for a shard that cannot be opened, ``OSError``
    for one that cannot be read (the caller knows which record it was for and reports that),
    ``WouldBlock`` where ``nowait`` was asked and the bytes are not at hand,
    ``BundleClosedError`` after ``close``. A range past the end of a shard comes back
    short; the caller decides whether that is damage.
    """

    # Whether reading a slice of a record costs less than the whole record (a local file: yes;
    # an object store: one round trip either way, and only a whole record can be CRC-checked).
    partial_reads_cheap: bool
    # Whether a read not served from a cache may wait long (a network round trip, retries):
    # then the mount never reads inline on its event loop.
    reads_may_stall: bool
    # Whether the store keeps copies of what it read (an object store's caches), so that
    # ``discard`` and a second read can cure a record that failed its CRC.
    holds_copies: bool

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

    def discard(self, name: str, offset: int, length: int) -> None:
        """Drop held copies of these bytes (they failed a record CRC): the next read fetches."""
        ...

    def forked(self) -> None:
        """In a child after ``fork()``: drop what belonged to the parent's threads."""
        ...

    def stats(self) -> dict[str, object] | None:
        """Counters for ``bundlefs info`` (docs/storage.md, "Reading"); None: nothing to say."""
        ...

    def failed_read(self, path: str | None, shard: int | None, record: int | None) -> FailedRead:
        """What a read of ``path`` that failed with EIO (the bytes did not arrive) was."""
        ...


class ShardStoreBase:
    """The defaults of a store that reads its shards where they are: cheap slices, no long
    waits, no copies, no counters, every failed read damage."""

    partial_reads_cheap: bool = True
    reads_may_stall: bool = False
    holds_copies: bool = False

    def discard(self, name: str, offset: int, length: int) -> None:
        return None  # nothing held: the next read reads the shard again anyway

    def forked(self) -> None:
        return None

    def stats(self) -> dict[str, object] | None:
        return None

    def failed_read(self, path: str | None, shard: int | None, record: int | None) -> FailedRead:
        return FailedRead.DAMAGE


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


class LocalShardStore(ShardStoreBase):
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
