"""Directory listings' replies. A plain READDIR (patched binding): names, inodes and types added
in batches, one call into the binding per batch (``readdir_reply_batch``,
third_party/pyfuse3/readdir.patch). A READDIRPLUS: with the patched binding, entries and their
attributes in batches too (``readdir_reply_stats``, readdirplus-batch.patch: the attributes built
in C from the listing's stat tuples and a template); on a stock pyfuse3 (and where the owners
are overridden), one ``EntryAttributes`` and ``readdir_reply`` an entry. A file's attributes
are read without a decode either way.

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
ReplyStats = Callable[
    [pyfuse3.ReaddirToken, list[bytes], list[Stat], pyfuse3.EntryAttributes, int], int
]


def stats_reply(
    attributes: Callable[[Stat], pyfuse3.EntryAttributes],
) -> tuple[ReplyStats, pyfuse3.EntryAttributes] | None:
    """The patched binding's batch reply with attributes and its template (timeouts, block size:
    what ``attributes`` gives every entry), for ``reply_plus``; None on a stock binding."""
    reply = getattr(pyfuse3, "readdir_reply_stats", None)
    return None if reply is None else (reply, attributes((0, 0, 1, 0, 0, 0, 0, 0)))


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
    reply_stats: tuple[ReplyStats, pyfuse3.EntryAttributes] | None = None,
) -> None:
    """Add ``directory``'s children from ``position`` with their attributes (READDIRPLUS, and
    every listing on a stock binding) until the reply is full: a batch a call with
    ``reply_stats`` (the binding's function and the template of what the stats do not give),
    else one ``readdir_reply`` an entry with ``attributes(stat)``."""
    batch, previous = FIRST_PLUS_BATCH, None
    while position < directory.size:
        names, stats = tree.dirent_stats(directory, position, batch, previous)
        if reply_stats is not None:
            reply, template = reply_stats
            added = reply(token, names, stats, template, position + 1)
            position += added
            if added < len(names):
                return
        else:
            for name, stat in zip(names, stats, strict=True):
                position += 1
                if not pyfuse3.readdir_reply(token, name, attributes(stat), position):
                    return
        batch, previous = min(batch * 2, LAST_PLUS_BATCH), names[-1]
