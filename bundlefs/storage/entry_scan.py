"""Checked scans of consecutive entries: the values of inodes ``first … first+count−1`` read with
one LMDB cursor, values only, a chunk at a time, each chunk proved to be exactly its inodes before
any of it is handed on. ``IndexReader.iter_raw`` (listings, ``bundlefs diff``) reads through here.
Also a shard's records as they are stored (``record_pairs``), for a copy.

May import: ``bundlefs.core``, ``bundlefs.errors``, lmdb.
"""

from __future__ import annotations

from collections.abc import Iterator

import lmdb

from bundlefs.core import format as fmt
from bundlefs.errors import FormatError

FIRST_CHUNK, LAST_CHUNK = 64, 4096  # small first: a reader that stops early reads little ahead


def value_chunks(cursor: lmdb.Cursor, first: int, count: int) -> Iterator[list[bytes]]:
    """The values of inodes ``first … first+count−1`` in lists (64 values, doubling to 4,096).
    A chunk is exactly its inodes when its first and last keys are: LMDB's keys are unique and
    sorted. ``FormatError`` for a missing entry or a damaged index.

    The cursor stops at the chunk's last key, or at the first key above it: it never steps past
    the leaf after the last wanted key, the last leaf ``IndexPageGuard.span`` checked (a gap in
    the inodes, in a forged index, would otherwise walk it into pages never checked)."""
    try:
        if not cursor.set_key(fmt.entry_key(first)):
            raise FormatError(f"index has no entry {first}")
        items = cursor.iternext(keys=True, values=True)
        done, chunk = 0, FIRST_CHUNK
        while done < count:
            n = min(chunk, count - done)
            last = first + done + n - 1
            want, got = fmt.entry_key(last), []
            for key, value in items:
                if key > want:
                    break
                got.append(value)
                if key == want:
                    break
            if len(got) != n or cursor.key() != want:
                raise FormatError(f"index is missing an entry of {first + done}…{last}")
            yield got
            done, chunk = done + n, min(chunk * 2, LAST_CHUNK)
    except lmdb.Error as e:
        raise FormatError(f"index is damaged listing entries: {e}") from None


def record_pairs(cursor: lmdb.Cursor, shard: int) -> list[tuple[bytes, bytes]]:
    """(key, value) of every record of ``shard`` (a cursor of the records database), each value
    checked for its size only. ``FormatError`` for a damaged index."""
    prefix = fmt.record_key(shard, 0)[:4]  # the shard's number, big-endian, leads each key
    out: list[tuple[bytes, bytes]] = []
    try:
        if not cursor.set_range(prefix):
            return out
        for key, value in cursor:
            if not key.startswith(prefix):
                break
            if len(value) != fmt.RECORD_VALUE_SIZE:
                raise FormatError(f"a record of shard {shard} is {len(value)} bytes")
            out.append((key, value))
    except lmdb.Error as e:
        raise FormatError(f"index is damaged listing records: {e}") from None
    return out
