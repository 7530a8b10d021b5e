"""Filling a sparse copy of a version-6 index from where the index really is: ``PageFill``; and
``refuse_sparse``, for a reader that has no way to fill one.

A bundle on an object store is opened without downloading its index (docs/storage.md, "The
index"): the local copy is a sparse file of the index's full size, and ``IndexPageGuard``, which
checks every page before LMDB can read it, asks ``PageFill`` for a page whose bytes fail their
CRC. ``PageFill`` fetches an aligned run of pages around it by one ranged GET, checks each
page of the run against the page table and writes only those that pass; a page that fails on
the store too is damage (the guard says so), never written.

So the file holds, for every page, either nothing (a hole: zeros), or bytes that passed their
CRC, or a page being written by another process (identical bytes: every writer writes only
checked pages of one bundle id). A reader accepts a page only after its CRC passes in its own
process, so a half-written page is fetched again, never used. Two processes filling the same
run at once (mount workers) are avoided with an open-file-description lock on the run's bytes
(Linux's ``F_OFD_SETLKW``): the second waits, finds the page whole and fetches nothing. The lock
only saves GETs, and only on a local file system: on a shared one (NFS, Lustre, CephFS, …) the
cluster cache takes no locks (docs/storage.md: they depend on the server's lock manager), and
two hosts may fetch one run twice.

Runs: 16 pages (64 KiB of 4 KiB pages) at first, which a local S3 server answers as fast as one
page (bench.s3_open); from the third miss in a row at the page just after the previous run, the
run doubles with each, up to 8 MiB, so a cursor walk over many leaves (a listing) costs few GETs.

May import: the standard library, ``bundlefs.core``, ``bundlefs.errors``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import threading
from collections.abc import Callable

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.core.format import pages as lp
from bundlefs.errors import FormatError

RangeGet = Callable[[int, int], bytes]  # bytes [start, end) of the index where it really is

# An empty file beside a sparse copy's data.mdb: an ``IndexReader`` opened without a way to
# fill it refuses it (LMDB would read its holes: the process aborts).
SPARSE_MARK = "sparse"

FIRST_RUN = 64 * 1024  # bytes of the first run around a missing page
MAX_RUN = 8 * 1024 * 1024  # what sequential misses grow a run to
_FLOCK = struct.Struct("hhqqi4x")  # struct flock on 64-bit Linux: type, whence, start, len, pid
# File systems of other hosts (or of a daemon: fuse.*), where no lock is taken.
_SHARED_FS = frozenset(
    ("nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "lustre", "gpfs", "glusterfs", "9p", "afs")
    + ("beegfs", "ocfs2", "gfs2")
)


def refuse_sparse(bundle_dir: str) -> None:
    """Raise ``FormatError`` if ``bundle_dir`` holds a sparse copy (its ``SPARSE_MARK``): for a
    reader with no way to fetch its pages, where LMDB would read its holes."""
    if os.path.exists(os.path.join(bundle_dir, fmt.INDEX_DIR, SPARSE_MARK)):
        raise FormatError(
            f"{bundle_dir} holds a sparse copy of an object-store bundle's index (pages "
            "missing): open the bundle by its URL, which fetches them"
        )


def _local_file_system(fd: int) -> bool:
    """Whether the file ``fd`` is on a file system of this host only (/proc/self/mountinfo)."""
    st = os.fstat(fd)
    device = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    kind = ""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == device and " - " in line:
                    kind = line.split(" - ", 1)[1].split()[0]
    except OSError:
        return False
    return bool(kind) and kind not in _SHARED_FS and not kind.startswith("fuse")


class PageFill:
    """Fetches missing pages of one sparse index copy into it (see the module)."""

    def __init__(self, path: str, table: bytes, page_size: int, get: RangeGet) -> None:
        self.path = path
        self._table = table
        self._page_size = page_size
        self._pages = lp.page_count(table)
        self._get = get
        self._first = max(1, FIRST_RUN // page_size)
        self._run = self._first
        self._next = -1  # the page after the last run fetched: misses there grow the run
        self._streak = 0  # misses at ``_next`` in a row
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes_fetched = 0
        self._fd, self._why = -1, ""
        self._open()

    def _open(self) -> None:
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except PermissionError as e:  # a cache of someone else's: what is there still reads
            self._why = f"the index cache cannot be written ({e.strerror})"
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        self._lockable = _local_file_system(self._fd)

    def forked(self) -> None:
        """In a child after ``fork()``: a descriptor of its own (the locks belong to an open
        file description, which the parent's would share) and a fresh lock. The same file is
        reopened through ``/proc/self/fd`` (by path it may be another one, or none: the cache
        copy replaced or removed since), and checked to be it. Never raises (an at-fork
        handler): what fails is this copy's next fetch's error."""
        self._lock = threading.Lock()
        inherited, self._fd = self._fd, -1
        try:
            if inherited < 0:
                return
            flags = os.O_RDONLY if self._why else os.O_RDWR
            fd = os.open(f"/proc/self/fd/{inherited}", flags | os.O_CLOEXEC)
            was, now = os.fstat(inherited), os.fstat(fd)
            if (was.st_dev, was.st_ino) != (now.st_dev, now.st_ino):
                os.close(fd)
                raise OSError(errno.ESTALE, "not the same file")
            self._fd = fd
            self._lockable = _local_file_system(fd)
            forked = getattr(self._get, "forked", None)  # a source with a network session
            if forked is not None:
                forked()
        except Exception as e:  # noqa: BLE001 (an at-fork handler must not raise)
            self._why = f"the index cache copy cannot be reopened after fork() ({e})"
        finally:
            with contextlib.suppress(OSError):
                os.close(inherited)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def page(self, pgno: int) -> bytes | None:
        """Page ``pgno``'s checked bytes, fetched with the run around it if this copy lacks
        them; None when the store's bytes fail the CRC too (damage). Raises ``OSError`` when
        the store cannot be read or the copy cannot be written."""
        if self._fd < 0 or self._why:
            raise OSError(errno.EROFS, self._why or "the index is closed")
        with self._lock:  # not across the GET: a thread must not wait out another's timeout
            start, count = self._plan(pgno)
        size = self._page_size
        with self._locked(start * size, count * size):
            data = os.pread(self._fd, size, pgno * size)
            if self._sound(pgno, data):
                return data  # another process (or thread) filled it meanwhile
            return self._fetch(pgno, start, count)

    def replaced(self) -> str | None:
        """When the store's bytes of a page fail its CRC: the sentence saying the bundle was
        replaced at its URL, if the source can tell (``IndexRanges.replaced``); else None."""
        ask = getattr(self._get, "replaced", None)
        try:
            return None if ask is None else ask()
        except Exception:  # noqa: BLE001 (only a better sentence: damage is said instead)
            return None

    def present(self, pgno: int) -> bytes | None:
        """Page ``pgno``'s bytes if this copy holds them whole and checked, else None."""
        data = os.pread(self._fd, self._page_size, pgno * self._page_size)
        return data if self._sound(pgno, data) else None

    def write(self, start: int, data: bytes) -> None:
        """Write the pages of ``data`` (page ``start`` first) that pass their CRC."""
        with self._lock:
            self._write_sound(start, data)

    def fill_all(self, chunk: int = MAX_RUN) -> None:
        """Fetch the whole index (``verify``: every page is read anyway) in runs of at most
        ``chunk`` bytes, writing each page that passes its CRC; pages this copy already holds
        sound are not fetched again (a second ``verify`` reads the copy, as it did a whole
        one)."""
        size = self._page_size
        with self._lock:
            for first in range(0, self._pages, max(1, chunk // size)):
                count = min(max(1, chunk // size), self._pages - first)
                for start, n in self._missing(first, count):
                    data = self._get(start * size, (start + n) * size)
                    self._count(len(data))
                    self._write_sound(start, data)

    # -- inside ------------------------------------------------------------------------------

    def _missing(self, first: int, count: int) -> list[tuple[int, int]]:
        """The stretches (first page, pages) of pages ``first … first + count`` this copy lacks
        or holds damaged; stretches fewer than a first run apart are joined (one GET of a
        present page costs less than a second request)."""
        size = self._page_size
        held = memoryview(os.pread(self._fd, count * size, first * size))
        out: list[tuple[int, int]] = []
        for i in range(count):
            if self._sound(first + i, held[i * size : (i + 1) * size]):
                continue
            if out and first + i - (out[-1][0] + out[-1][1]) < self._first:
                out[-1] = (out[-1][0], first + i + 1 - out[-1][0])
            else:
                out.append((first + i, 1))
        return out

    def _plan(self, pgno: int) -> tuple[int, int]:
        """The run to fetch for a miss at ``pgno``: (first page, pages)."""
        # A lookup's path, or a scan's neighbour check, may miss the page just after the last
        # run; a cursor walk misses there again and again: from the third such miss in a row
        # the run doubles each time (at 20,000 files, doubling from the second grew a lookup's
        # 3 runs of 64 KiB to 0.6 MB).
        if pgno == self._next:
            self._streak += 1
            grown = self._run * 2 if self._streak >= 3 else self._run
            self._run, start = min(grown, MAX_RUN // self._page_size), pgno
        else:
            self._run, self._streak, start = self._first, 0, pgno - pgno % self._first
        count = min(self._run, self._pages - start)
        self._next = start + count
        return start, count

    def _fetch(self, pgno: int, start: int, count: int) -> bytes | None:
        """Fetch and store the run; page ``pgno`` as the file now holds it (what LMDB will
        read, not the bytes in memory), None when the store's bytes fail its CRC."""
        size = self._page_size
        data = self._get(start * size, (start + count) * size)
        with self._lock:
            self._count(len(data))
        self._write_sound(start, data)
        at = (pgno - start) * size
        if not self._sound(pgno, data[at : at + size]):
            return None  # damage on the store
        page = os.pread(self._fd, size, pgno * size)
        if not self._sound(pgno, page):
            raise OSError(errno.EIO, "a page written to the index cache does not read back")
        return page

    def _write_sound(self, start: int, data: bytes) -> None:
        """Write the pages of ``data`` (page ``start`` first) that pass their CRC, each stretch
        of them with one write. Raises ``OSError`` when one cannot be written whole (a full
        disk: write(2) stores what fits and returns its count)."""
        size, view = self._page_size, memoryview(data)
        sound = [
            self._sound(start + i, view[i * size : (i + 1) * size])
            for i in range(len(data) // size)
        ]
        i = 0
        while i < len(sound):
            if not sound[i]:
                i += 1
                continue
            j = i
            while j < len(sound) and sound[j]:
                j += 1
            self._write_fully(view[i * size : j * size], (start + i) * size)
            i = j

    def _write_fully(self, data: memoryview, at: int) -> None:
        while data:
            written = os.pwrite(self._fd, data, at)
            if written <= 0:
                raise OSError(errno.ENOSPC, "the index cache is full")
            data, at = data[written:], at + written

    def _sound(self, pgno: int, data: bytes | memoryview) -> bool:
        return (
            pgno < self._pages
            and len(data) == self._page_size
            and crc32c(data) == lp.page_crc(self._table, pgno)
        )

    def _count(self, n: int) -> None:
        self.requests += 1
        self.bytes_fetched += n

    @contextlib.contextmanager
    def _locked(self, at: int, length: int):
        """Hold an exclusive lock on bytes ``at … at + length`` of the copy against other
        processes filling them (not a correctness matter: see the module)."""
        if not self._lockable:
            yield
            return
        try:
            fcntl.fcntl(self._fd, fcntl.F_OFD_SETLKW, _FLOCK.pack(fcntl.F_WRLCK, 0, at, length, 0))
        except (OSError, AttributeError):
            yield  # no such locks here: a duplicate GET at worst
            return
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.fcntl(
                    self._fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, 0, at, length, 0)
                )
