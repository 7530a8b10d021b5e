"""Directory listings' replies. A plain READDIR (patched binding): names, inodes and types added
in batches, one call into the binding per batch (``readdir_reply_batch``,
third_party/pyfuse3/readdir.patch). A READDIRPLUS (and every listing on a stock pyfuse3): one
``readdir_reply`` an entry, its attributes read without a decode where the entry is a file.

May import: pyfuse3 (from ``bundlefs.mount.bindings``), ``bundlefs.core``, ``bundlefs.read``.
"""

from __future__ import annotations

from collections.abc import Callable

from bundlefs.core import format as fmt
from bundlefs.mount.bindings import pyfuse3
from bundlefs.read.listing import Stat
from bundlefs.read.tree import TreeModel

# The first batch, and the largest: the reply's size is not known here, and a glibc readdir's
# 32 KiB holds ~680 plain entries of 21-byte names, so batches double from a small first one
# (at most one batch is read and not sent).
FIRST_BATCH = 128
LAST_BATCH = 2048

# A listing with attributes: ~186 entries of 21-byte names fill 32 KiB.
FIRST_PLUS_BATCH = 32
LAST_PLUS_BATCH = 512

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


def reply_plus(
    tree: TreeModel,
    attributes: Callable[[Stat], pyfuse3.EntryAttributes],
    directory: fmt.Entry,
    position: int,
    token: pyfuse3.ReaddirToken,
) -> None:
    """Add ``directory``'s children from ``position`` with their attributes (READDIRPLUS, and
    every listing on a stock binding) until the reply is full, one ``readdir_reply`` each."""
    batch, previous = FIRST_PLUS_BATCH, None
    while position < directory.size:
        names, stats = tree.dirent_stats(directory, position, batch, previous)
        for name, stat in zip(names, stats, strict=True):
            position += 1
            if not pyfuse3.readdir_reply(token, name, attributes(stat), position):
                return
        batch, previous = min(batch * 2, LAST_PLUS_BATCH), names[-1]
