"""Plain directory listings (FUSE READDIR) on the patched binding: names, inodes and types added
to the reply in batches, one call into the binding per batch (``readdir_reply_batch``,
third_party/pyfuse3/readdir.patch) instead of one ``readdir_reply`` and one ``EntryAttributes``
per entry. READDIRPLUS, and every listing on a stock pyfuse3, stay in ``operations``.

May import: pyfuse3 (from ``bundlefs.mount.bindings``), ``bundlefs.core``, ``bundlefs.read``.
"""

from __future__ import annotations

from collections.abc import Callable

from bundlefs.core import format as fmt
from bundlefs.mount.bindings import pyfuse3
from bundlefs.read.tree import TreeModel

# The first batch, and the largest: the reply's size is not known here, and a glibc readdir's
# 32 KiB holds ~680 plain entries of 21-byte names, so batches double from a small first one
# (at most one batch is read and not sent).
FIRST_BATCH = 128
LAST_BATCH = 2048

ReplyBatch = Callable[[pyfuse3.ReaddirToken, list[bytes], list[int], list[int], int], int]


def reply_plain(
    tree: TreeModel,
    reply_batch: ReplyBatch,
    directory: fmt.Entry,
    position: int,
    token: pyfuse3.ReaddirToken,
) -> None:
    """Add ``directory``'s children from ``position`` to a plain READDIR reply until it is full."""
    batch, previous = FIRST_BATCH, None
    while position < directory.size:
        names, inodes, modes = tree.dirents(directory, position, batch, previous)
        added = reply_batch(token, names, inodes, modes, position + 1)
        position += added
        if added < len(names):
            return
        batch, previous = min(batch * 2, LAST_BATCH), names[-1]
