"""Thin ctypes wrappers for the few libc calls the standard library does not offer.

Bottom layer: imports nothing of bundlefs. ctypes releases the GIL during each call, so a long
``madvise`` here never stalls the mount's event loop.
"""

from __future__ import annotations

import ctypes
import functools
import os

_PROT_READ = 0x1
_MAP_SHARED = 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value
MADV_POPULATE_READ = 22  # Linux 5.14+: fault every page in (read-ahead included), GIL released


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
