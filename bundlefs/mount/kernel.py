"""What the mount asks of the kernel's FUSE side: the no-open path, and whether requests wait.

``no_open_unavailable`` says why this binding cannot serve the no-open path (the kernel's own
answer comes at the handshake: ``BundleOperations.init``); ``no_open_refused`` is the reason an
adapter starts with. ``poll_fuse_device`` finds this process's ``/dev/fuse`` session, so a read
can ask whether another request is queued before it waits for the disk inline
(docs/concurrency.md). Importing this module imports no binding.

May import: the standard library, ``bundlefs.mount.bindings``.
"""

from __future__ import annotations

import os
import select

from bundlefs.mount.bindings import stock_reason

FUSE_DEVICE = "/dev/fuse"


def no_open_unavailable() -> str | None:
    """Why this pyfuse3 cannot serve the no-open path, or None when it can."""
    return stock_reason()


def no_open_refused(open_mode: str) -> str:
    """Why a mount asked for ``open_mode`` will not ask the kernel for no-open ("" if it will)."""
    if open_mode == "open":
        return "chosen with --open-mode open"
    return no_open_unavailable() or ""


def poll_fuse_device() -> select.poll | None:
    """A poll object on this process's /dev/fuse session, or None (then loads always hop).

    pyfuse3 does not expose its session descriptor; the daemon holds exactly one /dev/fuse.
    """
    found = None
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == FUSE_DEVICE:
                if found is not None:
                    return None  # more than one: we cannot tell which is ours
                found = int(name)
        except OSError:
            continue
    if found is None:
        return None
    poll = select.poll()
    poll.register(found, select.POLLIN)
    return poll
