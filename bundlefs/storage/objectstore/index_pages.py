"""The index of a version-6 bundle on an object store as a sparse local copy, filled page by
page as lookups need them: ``make_sparse_copy`` (what an open fetches), ``sparse_copy_ok``,
``IndexRanges`` (the ranged GETs that fill it) and ``fill_whole`` (``verify``'s whole fetch).

An open fetches ``COMPLETE``, the page table ``index/pages`` (4 bytes per 4 KiB page) and the
first run of the index (its meta pages) — nothing that grows with the bundle but the table.
``data.mdb`` is then a sparse file of the index's full size; ``IndexPageGuard`` checks each page
before LMDB can read it and has ``index_fill.PageFill`` fetch the ones not there. Since only
pages that pass their CRC are ever written, a copy shared by processes (mount workers, the
cluster cache) holds only checked bytes and holes; each process still checks each page the
first time, so a half-written page or a damaged disk is fetched again, never used.

Cache layout, as a whole copy's (``index_fetch``)::

    CACHE/index/<bundle id hex>/COMPLETE, …/index/pages, …/index/data.mdb (sparse),
    …/index/sparse (empty: what makes an ``IndexReader`` without a fetcher refuse the copy)

May import: the standard library, ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``
``.location``, ``.index_fill``, ``.objectstore.fetcher``.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.core.format import pages as lp
from bundlefs.errors import FormatError, StorageError
from bundlefs.storage.index_fill import FIRST_RUN, SPARSE_MARK, PageFill
from bundlefs.storage.location import Location
from bundlefs.storage.objectstore.fetcher import Fetcher

HEAD_RUN = FIRST_RUN  # the index's first bytes fetched at open: both meta pages


class ChangedIndex(FormatError):
    """The store's index or page table is not the one its marker names (replaced or damaged):
    the caller asks for the marker again before refusing it."""


class IndexRanges:
    """Bytes ``[start, end)`` of a bundle's ``index/data.mdb`` on its store (short past the
    end; ``OSError`` when the store cannot answer): what fills a sparse copy."""

    def __init__(
        self,
        location: Location,
        new_fetcher: Callable[[], Fetcher],
        fetcher: Fetcher | None = None,
        bundle_id: bytes | None = None,
        outage: Callable[[], bool] | None = None,
    ) -> None:
        self.url = location.child(f"{fmt.INDEX_DIR}/{fmt.INDEX_FILE}")
        self._location, self._bundle_id = location, bundle_id
        # Whether the bundle's shard store knows the store is out: then a page fails at once
        # rather than after a store timeout of its own (the shard store's probe ends it).
        self._outage = outage
        self._new_fetcher = new_fetcher
        # The open's own when given: its session and connection are there already (a new
        # one costs a client and a TLS handshake on a real store).
        self.fetcher = fetcher or new_fetcher()

    def __call__(self, start: int, end: int) -> bytes:
        if self._outage is not None and self._outage():
            raise OSError(errno.EIO, f"{self._location.url}: the object store is out (outage)")
        return self.fetcher.get(self.url, start, end)

    def forked(self) -> None:
        """In a child after ``fork()``: the parent's network session is not this process's."""
        self.fetcher = self._new_fetcher()

    def replaced(self) -> str | None:
        """Asked when a fetched page fails its CRC: the sentence saying the bundle was replaced
        at its URL if ``COMPLETE`` now names another bundle id, else None (damage, or unknown)."""
        if self._bundle_id is None:
            return None
        try:
            data = self.fetcher.get(self._location.child(fmt.MARKER_NAME), 0, fmt.MARKER_SIZE + 1)
            now = fmt.decode_marker(data, crc32c).bundle_id
        except Exception:  # noqa: BLE001 (gone or unreadable: nothing known, damage is said)
            return None
        if now == self._bundle_id:
            return None
        return (
            f"{self._location.url} was replaced at its URL by another bundle since it was "
            "opened; open it again"
        )


def _fetch(location: Location, fetcher: Fetcher, name: str, start: int, end: int) -> bytes:
    try:
        return fetcher.get(location.child(f"{fmt.INDEX_DIR}/{name}"), start, end)
    except FileNotFoundError:
        raise ChangedIndex(f"{location.url}: the index ({name}) is missing") from None
    except OSError as e:
        raise StorageError(f"cannot fetch the index of {location.url}: {e}") from None


def _table(data: bytes, marker: fmt.Marker) -> tuple[bytes, int]:
    """The checked page table and its page size."""
    if len(data) < lp.PAGES_HEAD_SIZE:
        raise FormatError("the index page table is too short")
    page_size = struct.unpack_from(">I", data, 8)[0]
    if page_size < 512 or page_size & (page_size - 1):
        raise FormatError("the index page table names an impossible page size")
    table = lp.decode_page_table(
        data,
        page_size=page_size,
        index_size=marker.index_size,
        bundle_id=marker.bundle_id,
        crc32c=crc32c,
    )
    return table, page_size


def make_sparse_copy(location: Location, fetcher: Fetcher, marker: fmt.Marker, tmp: str) -> None:
    """Fill the new cache directory ``tmp`` (its ``index/`` made) with the page table and a
    sparse ``data.mdb`` holding its first run. Raises ``ChangedIndex`` when the store's table
    or meta pages are not this marker's, ``StorageError`` when the store cannot answer."""
    bound = marker.index_size // 128 + lp.PAGES_HEAD_SIZE + 8  # 4 bytes per page of ≥ 512
    data = _fetch(location, fetcher, lp.PAGES_FILE, 0, bound)
    try:
        table, page_size = _table(data, marker)
    except FormatError as e:
        raise ChangedIndex(
            f"{location.url}: the index does not match its completion marker ({e})"
        ) from None
    index_dir = os.path.join(tmp, fmt.INDEX_DIR)
    with open(os.path.join(index_dir, lp.PAGES_FILE), "wb") as f:
        f.write(table)
    with open(os.path.join(index_dir, SPARSE_MARK), "wb"):
        pass  # a reader without a fetcher refuses the copy (IndexReader)
    path = os.path.join(index_dir, fmt.INDEX_FILE)
    with open(path, "wb") as f:
        f.truncate(marker.index_size)  # a hole: the pages come when a lookup needs them
    head = _fetch(location, fetcher, fmt.INDEX_FILE, 0, min(HEAD_RUN, marker.index_size))
    fill = PageFill(path, table, page_size, _no_store)
    try:
        fill.write(0, head)
        for pgno in (0, 1):
            if fill.present(pgno) is None:
                raise ChangedIndex(
                    f"{location.url}: the index does not match its completion marker (meta "
                    f"page {pgno} fails its checksum)"
                )
    finally:
        fill.close()


def sparse_copy_ok(local: str, marker: fmt.Marker) -> bool:
    """Whether the copy at ``local`` (its marker already compared) can be used: the right size,
    its table this marker's, and its meta pages there (LMDB reads them before any check)."""
    index_dir = os.path.join(local, fmt.INDEX_DIR)
    try:
        if os.stat(os.path.join(index_dir, fmt.INDEX_FILE)).st_size != marker.index_size:
            return False
        with open(os.path.join(index_dir, lp.PAGES_FILE), "rb") as f:
            table, page_size = _table(f.read(marker.index_size // 128 + 64), marker)
        fill = PageFill(os.path.join(index_dir, fmt.INDEX_FILE), table, page_size, _no_store)
    except (OSError, FormatError):
        return False
    try:
        return all(fill.present(pgno) is not None for pgno in (0, 1))
    finally:
        fill.close()


def _no_store(start: int, end: int) -> bytes:
    raise OSError("no store to fetch from")


def fill_whole(location: Location, fetcher: Fetcher, local: str, marker: fmt.Marker) -> None:
    """Fetch every page of the copy at ``local`` (``verify`` reads them all: one pass of big
    GETs beats a walk's many small ones). A page the store holds damaged stays missing: the
    page check reports it."""
    index_dir = os.path.join(local, fmt.INDEX_DIR)
    with open(os.path.join(index_dir, lp.PAGES_FILE), "rb") as f:
        table, page_size = _table(f.read(marker.index_size // 128 + 64), marker)
    path = os.path.join(index_dir, fmt.INDEX_FILE)
    url = location.child(f"{fmt.INDEX_DIR}/{fmt.INDEX_FILE}")
    fill = PageFill(path, table, page_size, lambda start, end: fetcher.get(url, start, end))
    try:
        fill.fill_all()
    except OSError as e:
        raise StorageError(f"cannot fetch the index of {location.url}: {e}") from None
    finally:
        fill.close()
