"""``MountOptions``: how to mount and serve one bundle, and ``LogSetup``, where the daemon logs.

The command line builds a ``MountOptions`` (``bundlefs.cli.mount``); the daemon takes one and
parses nothing. The defaults the command line's help names live here, importable without a FUSE
binding.

May import: the standard library, ``bundlefs.read``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from bundlefs.read.options import ReadOptions

DEFAULT_READ_AHEAD_KB = 1024
DEFAULT_INDEX_RESIDENT = 256 * 1024 * 1024  # ~3.5 million entries at ~70 bytes each

# Called once the mount is up, with True in the foreground (the log goes to stderr unless a log
# file is set) and False in the detached daemon (its stderr is /dev/null: a log file or syslog).
LogSetup = Callable[[bool], None]


@dataclass(frozen=True)
class MountOptions:
    """How to mount and serve one bundle; ``log_file`` and ``debug`` are for the ``LogSetup``."""

    bundle: str
    mountpoint: str
    foreground: bool = False
    allow_other: bool = False
    uid: int | None = None
    gid: int | None = None
    read_ahead_kb: int = DEFAULT_READ_AHEAD_KB
    load_threads: int | None = None  # None: tuning.load_threads chooses
    open_mode: str = "auto"
    readdirplus: str = "auto"  # "auto", "always" or "never" (cli/mount.py, --readdirplus)
    index_resident: int = DEFAULT_INDEX_RESIDENT
    prefetch: bool = True
    strict: bool = False  # refuse a bundle with a damaged shard instead of serving the rest
    log_file: str | None = None
    debug: bool = False
    auto_unmount: bool = True
    allow_nonempty: bool = False
    workers: int | None = None  # serving processes; None: default_workers()
    # How the bundle is read: the record cache (the total across workers), the index check and,
    # for a bundle at a URL (``bundle`` is then the URL), the store's options, which stay in this
    # process (the daemon forks from it, so they never appear on a command line or in the mount
    # table) and the on-disk record cache (docs/storage.md).
    read: ReadOptions = ReadOptions()


def default_workers() -> int:
    """Serving processes when ``--workers`` is not given: one per CPU this process may run on,
    at least 2 and at most 8.

    Cold reads scale with processes up to the cores (docs/performance.md); past 8 the kernel's
    single request queue and the disk are the limit, and each worker holds its own cache share.
    Two even on one CPU: a worker loads inline and receives with a blocking read (10 us of user
    CPU a trivial request, against 47 in one process with its event loop and load threads), and
    the second serves while the first waits for the disk (docs/performance.md, "One CPU": pinned
    to one core, 1.27-1.57x the cold files/s of one process at 30-47 % less CPU a file).
    """
    return max(2, min(len(os.sched_getaffinity(0)), 8))
