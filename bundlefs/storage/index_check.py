"""Checking the index before and while LMDB reads it: ``check_index_file`` at open (size, meta
pages, and the whole file's CRC before version 6), and from version 6 page by page, the first time
a lookup could touch each page (``IndexPageGuard``).

Before version 6 a reader checked the whole index's CRC at open (a minute at a billion files).
From version 6 ``index/pages`` holds a CRC per LMDB page
(docs/format.md §3.10) and ``IndexPageGuard`` checks, at open, only that table's header (the
table is mapped: each page's CRC is read when the page is first checked), the meta pages and
the main database (a few pages), and later each page before LMDB reads it: a lookup first
follows LMDB's own search from the database's root to the leaf (core/format/pages.py decodes and
validates each page on the way), checking every page it passes that is not checked yet. The key
ranges whose path is checked are remembered, so a lookup in one costs a bisect; a cursor scan
checks every leaf of its range and one on each side, which is as far as LMDB's cursor steps
before the scan sees a key outside it. Damage is a ``CorruptDataError`` naming the page: only the
entries behind that page are lost, not the bundle.

Memory: one bit per page (128 KiB for a 4 GiB index), decoded branch pages (bounded) and the
remembered ranges (bounded: forgotten when too many, then found again by walking).

A sparse copy of an index on an object store (docs/storage.md, "The index") is given a way to
fetch pages (``index_fill.PageFill``): there a page that fails its CRC is fetched, and it is
damage only if the store's bytes fail too. Since every page LMDB can reach is checked first,
LMDB reads only pages that are there.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage.native``,
``bundlefs.storage.index_fill``, ``bundlefs.storage.key_ranges``.
"""

from __future__ import annotations

import mmap
import os
import threading
from bisect import bisect_left, bisect_right

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c, file_checksum
from bundlefs.core.format import pages as lp
from bundlefs.errors import BundleClosedError, CorruptDataError, FormatError, NotABundleError
from bundlefs.storage import native
from bundlefs.storage.index_fill import PageFill, RangeGet
from bundlefs.storage.key_ranges import END, KeyRanges

_MAX_BRANCHES = 16_384  # decoded branch pages kept (the upper levels of every tree)


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

    def leaves(self, db: object) -> None:
        return None  # nothing to check

    def span(self, db: object, lo: bytes = b"", hi: bytes = b"") -> None:
        pass

    def forked(self) -> None:
        pass

    def close(self) -> None:
        pass


class IndexPageGuard:
    """Checks the pages of one version-6 index before LMDB reads them (see the module)."""

    def __init__(
        self, bundle_dir: str, marker: fmt.Marker, page_size: int, fetch: RangeGet | None = None
    ) -> None:
        index_dir = os.path.join(bundle_dir, fmt.INDEX_DIR)
        self._bundle = bundle_dir
        self.path = os.path.join(index_dir, fmt.INDEX_FILE)
        self._fd, self._fill = -1, None
        self._table_sound: bool | None = None  # its table_crc32c, computed once when asked
        try:
            self._table = self._open_table(index_dir, marker, page_size, whole=fetch is not None)
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise FormatError(f"cannot read the index page table: {e.strerror}") from None
        try:
            self._page_size = page_size
            if fetch is not None:
                assert isinstance(self._table, bytes)
                self._fill = PageFill(self.path, self._table, page_size, fetch)
            pages = lp.page_count(self._table)
            self._last_pg = pages - 1
            self._checked = bytearray((pages + 7) // 8)
            self._branches: dict[int, lp.TreePage] = {}
            self._lock = threading.Lock()
            self._roots = self._main_databases()
        except BaseException:
            self.close()
            raise
        self._names: dict[int, bytes] = {}
        self._leaves: dict[bytes, KeyRanges] = {name: KeyRanges() for name in self._roots}
        self._spans: dict[bytes, KeyRanges] = {name: KeyRanges() for name in self._roots}
        self._leaves_of: dict[int, KeyRanges] = {}  # the same, by id of LMDB's handle

    # -- opening -----------------------------------------------------------------------------

    @staticmethod
    def _open_table(
        index_dir: str, marker: fmt.Marker, page_size: int, whole: bool
    ) -> bytes | mmap.mmap:
        """The page table: mapped, its header and length checked, each entry read when its page
        is first checked (an open costs the same at any size; a damaged entry fails its page);
        or, ``whole`` (a sparse copy: its fill fetches by it), read and checked whole."""
        with open(os.path.join(index_dir, lp.PAGES_FILE), "rb") as f:
            if whole:
                size = lp.PAGES_HEAD_SIZE + 4 * (marker.index_size // page_size) + 5
                return lp.decode_page_table(
                    f.read(size),
                    page_size=page_size,
                    index_size=marker.index_size,
                    bundle_id=marker.bundle_id,
                    crc32c=crc32c,
                )
            size = os.fstat(f.fileno()).st_size
            lp.check_page_table_head(
                f.read(lp.PAGES_HEAD_SIZE),
                size,
                page_size=page_size,
                index_size=marker.index_size,
                bundle_id=marker.bundle_id,
            )
            return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)

    def _main_databases(self) -> dict[bytes, lp.DatabaseRoot]:
        """Check both meta pages and every page of the main database (LMDB reads them at open
        and when a database is opened by name); the named databases' roots."""
        metas = [lp.meta_main_root(self._page(n), self._last_pg) for n in (0, 1)]
        # The larger txnid, the first on a tie, as mdb_env_pick_meta.
        _txnid, self._last_pg, main = max(metas, key=lambda m: m[0])
        roots: dict[bytes, lp.DatabaseRoot] = {}
        if main.root != lp.INVALID_PAGE:
            self._check_main_page(main, main.root, 0, b"", None, roots, set())
        return roots

    def _check_main_page(
        self,
        main: lp.DatabaseRoot,
        pgno: int,
        depth: int,
        lo: bytes,
        hi: bytes | None,
        roots: dict[bytes, lp.DatabaseRoot],
        seen: set[int],
    ) -> None:
        """Check page ``pgno`` of the main database and the pages below it: each reached once,
        its keys inside its parent's range, its leaves all at ``md_depth``."""
        if pgno in seen:
            raise FormatError("the index's main database reaches one page twice")
        seen.add(pgno)
        page = lp.tree_page(self._page(pgno), pgno, self._last_pg, main=True)
        lp.check_bounds(page, pgno, lo, hi)
        if page.leaf != (depth == main.depth - 1):
            raise FormatError("the index's main database is not as deep as it says")
        if page.leaf:
            roots.update(lp.database_roots(page, self._last_pg))
        for i, child in enumerate(page.children):
            below = page.keys[i + 1] if i + 1 < len(page.keys) else hi
            self._check_main_page(
                main, child, depth + 1, page.keys[i] if i else lo, below, roots, seen
            )

    def bind(self, handles: dict[bytes, object]) -> None:
        """Learn LMDB's handle of each named database (the reader passes handles, not names)."""
        for name, handle in handles.items():
            if name not in self._roots:
                raise FormatError(f"the index's main database does not list {name.decode()}")
            self._names[id(handle)] = name
            self._leaves_of[id(handle)] = self._leaves[name]

    def forked(self) -> None:
        """In a child after ``fork()``: a parent thread may have held the lock."""
        self._lock = threading.Lock()
        if self._fill is not None:
            self._fill.forked()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._fill is not None:
            self._fill.close()
        # A mapped table is left to the collector: a reader racing a close must get the
        # BundleClosedError of _page, not a closed mapping's ValueError.

    @property
    def fill(self) -> PageFill | None:
        """What fetches this sparse copy's missing pages; None for a whole index."""
        return self._fill

    # -- what readers call before LMDB --------------------------------------------------------

    def leaves(self, db: object) -> KeyRanges:
        """The key ranges of ``db`` whose leaves ``key`` has checked (a compiled search reads
        them before it calls ``key``: storage.native)."""
        return self._leaves_of[id(db)]

    def key(self, db: object, key: bytes) -> None:
        """Before ``get(key)``: the path to the leaf that holds ``key`` is checked."""
        ranges = self._leaves_of[id(db)]
        if ranges.covers(key, key):
            return
        # Walked without the lock: a walk may wait for the store (PageFill), and one lookup
        # must not wait out another's store timeout; two walks of one path check pages twice.
        lo, hi, _leaf = self._walk(self._names[id(db)], key)
        with self._lock:
            ranges.add(lo, hi)

    def span(self, db: object, lo: bytes = b"", hi: bytes = END) -> None:
        """Before a cursor works between ``lo`` and ``hi`` (both included): every leaf of that
        range is checked, with the leaf before and the leaf after it."""
        name = self._names[id(db)]
        spans = self._spans[name]
        if spans.covers(lo, hi):  # as ``key``: no lock for a range already checked (per read)
            return
        first, end, _leaf = self._walk(name, lo)  # without the lock, as ``key``
        before = self._walk(name, first, below=True)[0] if first else first
        while end != END and end <= hi:
            end = self._walk(name, end)[1]
        after = self._walk(name, end)[1] if end != END else end
        with self._lock:
            self._leaves[name].add(before, after)
            spans.add(first, end)

    def check_all(self, file_crc: int) -> list[int]:
        """The pages that fail their CRC; raises if the table fails its own, or if no page does
        but the whole file fails ``file_crc`` (then the table itself is wrong)."""
        if not self._table_intact():
            raise FormatError("the index page table fails its checksum")
        chunk, whole, at, damaged = self._page_size * 256, 0, 0, []
        while data := os.pread(self._fd, chunk, at):
            whole = crc32c(data, whole)
            first = at // self._page_size
            for pgno, crc in enumerate(lp.page_crcs(data, self._page_size, crc32c), first):
                if pgno > self._last_pg or crc != lp.page_crc(self._table, pgno):
                    damaged.append(pgno)
            at += len(data)
        if at != (self._last_pg + 1) * self._page_size or (whole != file_crc and not damaged):
            raise FormatError("index fails its checksum (the index file was altered or damaged)")
        return damaged

    # -- walking -------------------------------------------------------------------------------

    def _walk(
        self, name: bytes, key: bytes, below: bool = False
    ) -> tuple[bytes, bytes, lp.TreePage | None]:
        """Check LMDB's path to the leaf holding ``key`` (``below``: the leaf before it); that
        leaf's key range, and the leaf (None: an empty database). LMDB takes, in a branch, the
        last child whose key is not above the one searched (the first child's key counts as
        lower than all)."""
        root = self._roots[name]
        lo, hi, pgno = b"", END, root.root
        if pgno == lp.INVALID_PAGE:
            return lo, hi, None  # an empty database: LMDB reads no page
        for depth in range(root.depth):
            page = self._tree_page(pgno)
            try:
                lp.check_bounds(page, pgno, lo, None if hi == END else hi)
            except FormatError as e:
                raise CorruptDataError(str(e), bundle=self._bundle) from None
            if page.leaf:
                if depth != root.depth - 1:
                    break
                return lo, hi, page
            i = (bisect_left if below else bisect_right)(page.keys, key, 1) - 1
            if i > 0:
                lo = page.keys[i]
            if i + 1 < len(page.keys):
                hi = page.keys[i + 1]
            pgno = page.children[i]
        raise self._damage(pgno, f"the tree of {name.decode()} is not as deep as it says")

    def _tree_page(self, pgno: int) -> lp.TreePage:
        page = self._branches.get(pgno)
        if page is not None:
            return page
        try:
            page = native.tree_page(self._page(pgno), pgno, self._last_pg)
            for first, size in page.overflow:
                self._check_overflow(first, size)
        except CorruptDataError:
            raise
        except FormatError as e:  # checksum right, layout wrong: damage all the same
            raise CorruptDataError(str(e), bundle=self._bundle) from None
        if not page.leaf:
            if len(self._branches) >= _MAX_BRANCHES:
                self._branches.clear()
            self._branches[pgno] = page
        return page

    def _check_overflow(self, first: int, size: int) -> None:
        if not 2 <= first <= self._last_pg:
            raise self._damage(first, "a value names an overflow page out of range")
        count = lp.overflow_pages(self._page(first), first, size, self._last_pg)
        for pgno in range(first + 1, first + count):
            self._page(pgno)

    def _page(self, pgno: int) -> bytes:
        """Page ``pgno``'s bytes, its CRC checked the first time."""
        if self._fd < 0:
            raise BundleClosedError("the bundle is closed")
        at = pgno * self._page_size
        try:
            data = os.pread(self._fd, self._page_size, at)
        except OSError as e:
            raise self._damage(pgno, f"cannot be read: {e.strerror}") from None
        bit = 1 << (pgno & 7)
        if not self._checked[pgno >> 3] & bit:
            if len(data) != self._page_size or crc32c(data) != lp.page_crc(self._table, pgno):
                data = self._fetch(pgno)
            self._checked[pgno >> 3] |= bit
        return data

    def _fetch(self, pgno: int) -> bytes:
        """A page of a sparse copy that is not there (or damaged there): from the store."""
        if self._fill is None:
            raise self._damage(pgno, "fails its checksum")
        try:
            data = self._fill.page(pgno)
        except OSError as e:
            raise CorruptDataError(
                f"index page {pgno} cannot be fetched: {e.strerror or e}",
                bundle=self._bundle,
                unreadable=True,
            ) from None
        if data is None:
            why = self._fill.replaced()  # a bundle republished at the URL is not damage
            if why:
                raise CorruptDataError(why, bundle=self._bundle, unreadable=True)
            raise self._damage(pgno, "fails its checksum (as the object store holds it)")
        return data

    def _damage(self, pgno: int, what: str) -> CorruptDataError:
        if not self._table_intact():  # the page may be sound: its CRC entry is not
            what += " (the index page table fails its own checksum: damaged there)"
        return CorruptDataError(f"index page {pgno} {what}", bundle=self._bundle)

    def _table_intact(self) -> bool:
        """Whether the page table matches its ``table_crc32c``: checked once, on the first
        damage found or by ``check_all`` (~1 ms per MB of table)."""
        if self._table_sound is None:
            self._table_sound = lp.page_table_sound(self._table, crc32c)
        return self._table_sound
