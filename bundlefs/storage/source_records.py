"""The ``sources`` database of an index (format version 6, docs/format.md §3.9): what each regular
file's source said when it was packed (ctime_ns, st_ino), read through an open ``IndexReader``.

Readers ignore it; ``pack --base OLD --check strict`` looks files up (``source_record``) and
``verify`` checks every key and value (``iter_source_records``). The database is optional: a
bundle of an earlier version, or one a writer without a directory source made (merge, compact,
the ``Writer``), has none or an empty one, and every file then has no record. Beside
``IndexReader`` as the totals functions are (index.py is at its size budget), using its
databases and per-thread transaction.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage.index``.
"""

from __future__ import annotations

from collections.abc import Iterator

import lmdb

from bundlefs.core import format as fmt
from bundlefs.errors import FormatError
from bundlefs.storage.index import IndexReader


def has_source_records(index: IndexReader) -> bool:
    """Whether the index has a ``sources`` database with at least one record."""
    db = index._dbs.get(fmt.DB_SOURCES)
    return db is not None and index._txn().stat(db)["entries"] > 0


def source_record(index: IndexReader, ino: int) -> tuple[int, int] | None:
    """(ctime_ns, st_ino) the pack recorded for file ``ino``, or None: no record (an older
    version, another writer, a file that did not come from a directory). A malformed value is a
    ``FormatError``."""
    db = index._dbs.get(fmt.DB_SOURCES)
    if db is None:
        return None
    key = fmt.entry_key(ino)
    index._pages.key(db, key)  # version 6: the page checked before LMDB reads it
    try:
        value = index._txn().get(key, db=db)
    except lmdb.Error as e:
        raise FormatError(f"index is damaged reading a source record: {e}") from None
    return None if value is None else fmt.decode_source(ino, value)


def iter_source_records(index: IndexReader) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) of ``sources`` in key order, undecoded (``verify`` checks each)."""
    db = index._dbs.get(fmt.DB_SOURCES)
    if db is None:
        return
    index._pages.span(db)
    try:
        yield from index._txn().cursor(db=db)
    except lmdb.Error as e:
        raise FormatError(f"index is damaged listing source records: {e}") from None
