"""Directory totals (format version 5, docs/format.md §3.8): what lies below each directory, read
through an open ``IndexReader`` — ``tree_totals`` for one directory (the tree model, ``info``),
``iter_totals`` for all of them (``compact`` copies them). Beside ``IndexReader`` as
``source_records`` is (index.py is at its size budget); the check at open stays in index.py.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage.index``.
"""

from __future__ import annotations

from collections.abc import Iterator

import lmdb

from bundlefs.core import format as fmt
from bundlefs.errors import FormatError
from bundlefs.storage.index import IndexReader


def tree_totals(index: IndexReader, ino: int) -> fmt.TreeTotals | None:
    """What lies below directory ``ino`` (its key in ``totals``); None before version 5. A
    directory without totals in a version-5 index is a ``FormatError``."""
    db = index._dbs.get(fmt.DB_TOTALS)
    key, what = fmt.totals_key(ino), f"totals of directory {ino}"
    return None if db is None else fmt.decode_totals(ino, index._get(db, key, what))


def iter_totals(index: IndexReader) -> Iterator[tuple[int, fmt.TreeTotals]]:
    """(directory, totals) of every key in ``totals``, in inode order; nothing before version 5
    (``compact`` copies them)."""
    db = index._dbs.get(fmt.DB_TOTALS)
    if db is None:
        return
    index._pages.span(db)
    try:
        for key, value in index._txn().cursor(db=db):
            ino = fmt.decode_entry_key(key)
            yield ino, fmt.decode_totals(ino, value)
    except lmdb.Error as e:
        raise FormatError(f"index is damaged listing directory totals: {e}") from None
