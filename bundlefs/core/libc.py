"""Thin ctypes wrappers for the few libc calls the standard library does not offer.

Bottom layer: imports nothing of bundlefs. ctypes releases the GIL during each call, so a long
``madvise`` here never stalls the mount's event loop.

May import: the standard library (ctypes).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os

_PROT_READ = 0x1
_MAP_SHARED = 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value
MADV_POPULATE_READ = 22  # Linux 5.14+: fault every page in (read-ahead included), GIL released
MADV_DONTNEED = 4


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.argtypes = (
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
    )  # fmt: skip
    libc.mmap.restype = ctypes.c_void_p
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    return libc


def unmap_file_pages(path: str) -> int:
    """Drop this process's page-table entries for its read-only shared mappings of the file
    ``path`` (``MADV_DONTNEED``; the mappings stay): its resident set shrinks by them, the pages
    stay in the page cache, and the next access maps them again. Only read-only shared mappings
    (``r--s``): on a private or writable one the advice would discard data. The bytes advised.

    For a scan of a whole mapped file (``verify`` reading every entry of the index), which would
    otherwise count the whole file in its resident set by the end."""
    target = os.path.realpath(path)
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[1] == "r--s" and fields[5].rstrip("\n") == target:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end - start))
    libc = _libc()
    for start, size in ranges:
        if libc.madvise(start, size, MADV_DONTNEED) != 0:
            raise _error("madvise(MADV_DONTNEED)")
    return sum(size for _start, size in ranges)


def _error(call: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{call}: {os.strerror(code)}")


class ResidentMapping:
    """A read-only shared mapping of a whole file with every page faulted in.

    Pages a process maps stay in memory while it maps them unless memory is really short: the
    kernel reclaims them like any file page then, but ``drop_caches`` and the churn of other
    files' reads pass them by. Call ``close`` to unmap.
    """

    def __init__(self, fd: int, size: int) -> None:
        libc = _libc()
        self.size = size
        self._address: int | None = libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if self._address in (None, _MAP_FAILED):
            self._address = None
            raise _error("mmap")
        if libc.madvise(self._address, size, MADV_POPULATE_READ) != 0:
            error = _error("madvise(MADV_POPULATE_READ)")
            self.close()
            raise error

    def close(self) -> None:
        if self._address is not None:
            _libc().munmap(self._address, self.size)
            self._address = None


# -- renameat2(2): replace a directory in one step, or refuse to replace ---------------------------

AT_FDCWD = -100
RENAME_NOREPLACE = 1  # fail with EEXIST rather than replace
RENAME_EXCHANGE = 2  # swap the two names atomically


@functools.cache
def _renameat2_func():
    func = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if func is not None:
        func.argtypes = (
            ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint,
        )  # fmt: skip
        func.restype = ctypes.c_int
    return func


def renameat2(src: str, dst: str, flags: int) -> None:
    """renameat2(2) of two paths (relative ones to the working directory); raises ``OSError``.

    ``OSError(ENOSYS)`` where libc does not have the call; the kernel or the file system may
    refuse the flags with ENOSYS, EINVAL or EOPNOTSUPP too.
    """
    func = _renameat2_func()
    if func is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), src)
    if func(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), src, None, dst)


# -- sync_file_range(2): start writeback of a file range -------------------------------------------

SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, no waiting


@functools.cache
def _sync_file_range_func():
    func = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
    if func is not None:
        func.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
        func.restype = ctypes.c_int
    return func


def sync_file_range(fd: int, offset: int, length: int, flags: int) -> None:
    """sync_file_range(2); raises ``OSError`` (ENOSYS where libc does not have the call)."""
    func = _sync_file_range_func()
    if func is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    if func(fd, offset, length, flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


# -- mallopt(3): keep freed large buffers from piling up in glibc's heaps --------------------------

M_TRIM_THRESHOLD = -1  # <malloc.h>: free memory at the heap's top kept before it is returned
M_MMAP_THRESHOLD = -3  # <malloc.h>: allocations of at least this many bytes get their own mapping


def set_mmap_threshold(nbytes: int) -> None:
    """glibc ``mallopt(M_MMAP_THRESHOLD, nbytes)``: each allocation of ``nbytes`` or more is its
    own mapping, returned to the OS when freed, and glibc stops raising the threshold by itself.

    Raises ``OSError`` where the C library has no ``mallopt`` (not glibc: nothing to tune).
    """
    _mallopt(M_MMAP_THRESHOLD, nbytes)


def set_trim_threshold(nbytes: int) -> None:
    """glibc ``mallopt(M_TRIM_THRESHOLD, nbytes)``: free memory at the top of the main heap is
    returned to the OS only once it exceeds ``nbytes``. Raises ``OSError`` as above."""
    _mallopt(M_TRIM_THRESHOLD, nbytes)


def _mallopt(param: int, value: int) -> None:
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        raise OSError(errno.ENOSYS, "mallopt: not available (the C library is not glibc)")
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if mallopt(param, value) != 1:
        raise OSError(errno.EINVAL, f"mallopt({param}, {value}) refused")


# -- prctl(2): a child that dies with its parent ------------------------------------------------

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(signum: int) -> None:
    """Have the kernel send ``signum`` to this process when the thread that forked it exits.

    Raises ``OSError`` if ``prctl`` refuses.
    """
    if _libc().prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise _error("prctl(PR_SET_PDEATHSIG)")
