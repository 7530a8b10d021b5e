"""Checking the index before LMDB maps it: ``check_index_file`` at open (size, meta pages, and
before version 6 the whole file's CRC, a minute at a billion files); from version 6 what checks
each page on first use (``IndexPageGuard``, storage/index_guard.py) or nothing
(``NoPageChecks``); and ``verify``'s check of every page.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage.index_guard``,
``bundlefs.storage.index_fill``.
"""

from __future__ import annotations

import os

from bundlefs.core import format as fmt
from bundlefs.core.checksum import file_checksum
from bundlefs.core.format import pages as lp
from bundlefs.errors import FormatError, NotABundleError
from bundlefs.storage.index_fill import RangeGet
from bundlefs.storage.index_guard import IndexPageGuard


def check_index_file(
    bundle_dir: str, marker: fmt.Marker, checksum: bool = True, fetch: RangeGet | None = None
) -> tuple[tuple[int, int], IndexPageGuard | NoPageChecks]:
    """Check data.mdb before LMDB maps it (docs/format.md §2): size, meta pages, checksum (the
    whole file's before version 6; from version 6 the page table's, the pages checked on use).
    ``fetch``: data.mdb is a sparse copy (version 6) whose missing pages come from there; its
    pages are checked whatever ``checksum`` says (the checks are what fetches them).

    Returns the file's (st_dev, st_ino) and what checks its pages. LMDB trusts its file
    completely: a truncated one would fault the process with SIGBUS, so nothing may open an
    index that fails this.
    """
    path = os.path.join(bundle_dir, fmt.INDEX_DIR, fmt.INDEX_FILE)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            head = f.read(fmt.LMDB_META_PROBE + 65536)
    except OSError as e:
        raise NotABundleError(f"cannot read the index {path}: {e.strerror}") from None
    if st.st_size != marker.index_size:
        raise FormatError(
            f"index is {st.st_size} bytes but the completion marker says {marker.index_size} "
            "(truncated or replaced index)"
        )
    fmt.check_lmdb_meta(head, st.st_size)
    if (checksum or fetch) and marker.format_version >= lp.FIRST_PAGE_CHECK_VERSION:
        guard = IndexPageGuard(bundle_dir, marker, lp.lmdb_page_size(head), fetch)
        return (st.st_dev, st.st_ino), guard
    if checksum and file_checksum(path)[0] != marker.index_crc32c:
        raise FormatError("index fails its checksum (the index file was altered or damaged)")
    return (st.st_dev, st.st_ino), NoPageChecks()


def check_every_page(bundle_dir: str, marker: fmt.Marker) -> list[int]:
    """``verify``'s check of the index file: before version 6 its CRC (raises); from version 6
    every page's and the whole file's in one read, returning the pages that fail. Damage there
    is local: the bundle still opens and the pages' entries fail when read. Raises for what
    makes the index unsafe to open (the page table, the meta pages, the main database)."""
    _identity, guard = check_index_file(bundle_dir, marker)
    try:
        if isinstance(guard, IndexPageGuard):
            return guard.check_all(marker.index_crc32c)
        return []
    finally:
        guard.close()


class NoPageChecks:
    """The page checks of an index checked whole at open (before version 6), or not at all
    (``--no-index-check``): nothing to do on use."""

    def bind(self, handles: dict[bytes, object]) -> None:
        pass

    def key(self, db: object, key: bytes) -> None:
        pass

    def route(self, db: object) -> None:
        return None  # nothing to check

    def span(self, db: object, lo: bytes = b"", hi: bytes = b"") -> None:
        pass

    def forked(self) -> None:
        pass

    def close(self) -> None:
        pass
