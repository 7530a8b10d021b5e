"""The py-lmdb rules of a process, in one place: one environment per index file per process,
what a forked child may do with the ones it inherited, and holding an index resident.

py-lmdb refuses to open an environment twice in one process, yet two readers of one path must
both work: ``acquire`` shares one per data file (keyed by its identity, so a bundle replaced at
the same path is not confused with it) and ``release`` closes it with its last user. After a
``fork()`` every object registered with ``on_fork`` has its ``forked()`` called in the child; this
module names no reader (``IndexReader`` registers itself).

May import: ``bundlefs.core``.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Protocol

import lmdb

from bundlefs.core.libc import ResidentMapping

log = logging.getLogger(__name__)

EnvKey = tuple[int, int]  # (st_dev, st_ino) of data.mdb


class ForkAware(Protocol):
    def forked(self) -> None:
        """In a child after ``fork()``: drop what belonged to the parent's threads."""


_fork_aware: weakref.WeakSet[ForkAware] = weakref.WeakSet()

_envs: dict[EnvKey, list] = {}  # key -> [environment, users]
_envs_lock = threading.Lock()

# Environments a forked child inherited (their ids): used, never closed. py-lmdb's close (and
# its dealloc) waits until no thread is inside LMDB, and a parent thread that was inside at the
# fork stays counted in the child for ever: closing the parent's environment to reopen it hung
# 3 of 10 children forked during reads. Nor can a child open the same file a second time while
# the inherited one lives (py-lmdb refuses). Reading it is safe: it is read-only and without a
# lock file (MDB_NOLOCK), so no reader table or lock ties it to the parent's pid; the child
# starts its own read transactions on the inherited mapping.
_inherited: set[int] = set()


def _after_fork_in_child() -> None:
    global _envs_lock
    _envs_lock = threading.Lock()  # another thread may have held it when the process forked
    _inherited.update(id(held[0]) for held in _envs.values())
    for user in list(_fork_aware):
        try:
            user.forked()
        except Exception:  # noqa: BLE001 (one failing must not leave the others unreset)
            log.exception("after fork(): %r", user)


os.register_at_fork(after_in_child=_after_fork_in_child)


def on_fork(user: ForkAware) -> None:
    """Call ``user.forked()`` in every child forked while ``user`` lives (or until ``forget``)."""
    _fork_aware.add(user)


def forget(user: ForkAware) -> None:
    _fork_aware.discard(user)


def acquire(index_dir: str, key: EnvKey, max_dbs: int) -> lmdb.Environment:
    """The process's read-only environment of the index in ``index_dir`` (opened if it is the
    first user). Raises ``lmdb.Error``."""
    with _envs_lock:
        held = _envs.get(key)
        if held is None:
            env = lmdb.open(
                index_dir,
                readonly=True,
                lock=False,
                readahead=False,
                max_dbs=max_dbs,
                subdir=True,
            )
            held = _envs[key] = [env, 0]
        held[1] += 1
        return held[0]


def release(key: EnvKey, env: lmdb.Environment) -> None:
    """Stop using ``env``; its last user in this process closes it."""
    with _envs_lock:
        held = _envs.get(key)
        if held is not None and held[0] is env:
            held[1] -= 1
            if held[1] or id(env) in _inherited:
                return  # an inherited one stays open and registered: see _inherited
            del _envs[key]
    env.close()


def resident_mapping(path: str, key: EnvKey) -> ResidentMapping:
    """The whole file at ``path`` faulted into memory and kept mapped until closed.

    LMDB maps the index with read-ahead off, so a cold lookup pays a disk read for every B-tree
    page it touches. Mapped pages stay in memory: the kernel reclaims them only when memory is
    really short. Raises ``OSError`` if the file is no longer ``key`` or the kernel cannot
    (MADV_POPULATE_READ needs Linux 5.14).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != key:
            raise OSError("the index file was replaced")
        return ResidentMapping(fd, st.st_size)
    finally:
        os.close(fd)
