"""What the daemon tunes around the file system itself, each measured: glibc's mmap and trim
thresholds, the kernel's read-ahead for the mount, the index held in memory, load threads per
process.

Each is best effort: one that cannot apply (not glibc, not root, an index too large) is logged
and the mount serves on without it.

May import: the standard library, ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.read``,
``bundlefs.mount.options``, ``bundlefs.mount.table``.
"""

from __future__ import annotations

import logging
import threading
import time

from bundlefs.core.libc import set_mmap_threshold, set_trim_threshold
from bundlefs.errors import BundleError
from bundlefs.mount.options import MountOptions
from bundlefs.mount.table import mount_info
from bundlefs.read.bundle import Bundle

log = logging.getLogger("bundlefs")

_RECORD_BUFFER_MMAP_THRESHOLD = 128 * 1024
# A process that loads inline (one thread): records up to 4 MiB (the default is 256 KiB) and
# every READ reply (at most 1 MiB) come from the heap, which keeps up to 8 MiB free at its top
# (inside the soak test's 64 MiB margin per process).
_INLINE_MMAP_THRESHOLD = 4 * 1024 * 1024
_INLINE_TRIM_THRESHOLD = 8 * 1024 * 1024


def return_freed_buffers_to_the_os() -> None:
    """Keep freed record buffers from piling up in glibc's heaps.

    Records (256 KiB) are allocated and freed all the time, by several threads. glibc raises its
    mmap threshold after the first such free, and from then on serves them from per-thread heaps
    that do not shrink: the soak test measured 100 MiB RSS for a 32 MiB cache. A fixed threshold
    keeps each buffer its own mapping, returned to the OS when freed (65 MiB in the same test).
    """
    try:
        set_mmap_threshold(_RECORD_BUFFER_MMAP_THRESHOLD)
    except OSError as e:  # not glibc: nothing to tune
        log.debug("mallopt unavailable: %s", e)


def reuse_freed_buffers() -> None:
    """In a process that loads records inline (one thread, one heap): serve record and reply
    buffers from the heap, where freed ones are reused, instead of a mapping each.

    The fixed threshold above makes every 256 KiB record (and python-lz4's scratch buffer for it,
    and each 1 MiB reply) a fresh mapping: 64+ page faults that zero their pages, then an
    ``munmap``. In a worker of two serving cold random reads that was ~12 % of its CPU (perf:
    ``do_anonymous_page`` under ``lz4.block.decompress``); with the buffers reused, ~60 µs less
    CPU per cold file (docs/performance.md). Per-thread heaps, the reason for the fixed
    threshold, do not arise with one thread; the heap is bounded by the record cache plus
    ``_INLINE_TRIM_THRESHOLD``.
    """
    try:
        set_mmap_threshold(_INLINE_MMAP_THRESHOLD)
        set_trim_threshold(_INLINE_TRIM_THRESHOLD)
    except OSError as e:
        log.debug("mallopt unavailable: %s", e)


def set_read_ahead(mountpoint: str, read_ahead_kb: int) -> None:
    """Raise the kernel's read-ahead for this mount (root only): big sequential reads gain ~2.5×."""
    try:
        info = mount_info(mountpoint)
        if info is None:
            return
        with open(f"/sys/class/bdi/{info.device}/read_ahead_kb", "w") as f:
            f.write(str(read_ahead_kb))
    except OSError as e:
        log.debug("could not set read_ahead_kb: %s", e)


def hold_index(bundle: Bundle, limit: int) -> None:
    """Hold the index in memory, in a background thread, if it is at most ``limit`` bytes."""
    if 0 < bundle.info().index_bytes <= limit:
        threading.Thread(
            target=_hold_index_resident, args=(bundle,), name="bundlefs-index", daemon=True
        ).start()


def _hold_index_resident(bundle: Bundle) -> None:
    """Fault the index in and keep it mapped, off the event loop, after readiness.

    Cold lookups then cost no disk reads: each was a B-tree walk of page faults on the event loop
    (see docs/performance.md for the figures). In the background, so it never delays readiness.
    """
    started = time.monotonic()
    try:
        size = bundle.hold_index_resident()
    except (OSError, BundleError) as e:
        log.info("index not held in memory: %s", e)
        return
    elapsed_ms = (time.monotonic() - started) * 1e3
    log.info("index held in memory: %s bytes in %.0f ms", f"{size:,}", elapsed_ms)


def load_threads(options: MountOptions, workers: int, bundle: Bundle) -> int:
    """Threads for record loads in each serving process, unless ``--threads`` says.

    One process: 4, so a disk read does not stall every other request. Several workers: 0, every
    load inline: the other workers serve meanwhile, and the thread hop (60-70 µs a read here)
    is saved. A bundle on an object store keeps its threads (a miss may wait on the network).
    """
    if options.load_threads is not None:
        return options.load_threads
    return 4 if workers == 1 or bundle.content.reads_may_stall else 0
