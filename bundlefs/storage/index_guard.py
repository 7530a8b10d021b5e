"""``IndexPageGuard``: the pages of a version-6 index checked the first time a lookup could touch
each one, before LMDB reads it (docs/format.md §3.10).

At open it checks only the page table's header (the table is mapped: each page's CRC is read
when the page is first checked), the meta pages and the main database (a few pages). Later a
lookup first follows LMDB's own search from the database's root to the leaf (core/format/pages.py
decodes and validates each page on the way), checking every page it passes that is not checked
yet; a cursor scan checks every leaf of its range and one on each side, which is as far as
LMDB's cursor steps before the scan sees a key outside it. Damage is a ``CorruptDataError``
naming the page: only the entries behind that page are lost, not the bundle.

A page is *sound* once its CRC, its layout and its keys' bounds (its parent's key range) have
passed and it is the child of one branch only (a page two branches claim, or a root one claims,
is damage): so its key range is fixed, and a later search may pass it without checking it again.
That search is ``CheckedPaths`` (_native.pyx), LMDB's descent over the mapped file through sound
pages: a lookup on checked pages costs ~0.3 µs and nothing held per lookup. (Remembering the
checked key ranges instead cost a list copy per new leaf, 46 µs at 8,192 ranges, and forgot them
all past that: random lookups over 10M files, 553 µs a path, ~80% of it that.)

Memory: three bits per page (384 KiB for a 4 GiB index), decoded branch pages (bounded), and
the key ranges cursor scans have checked (bounded: forgotten when too many).

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
from collections.abc import Callable
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.core.format import pages as lp
from bundlefs.errors import BundleClosedError, CorruptDataError, FormatError
from bundlefs.storage import native
from bundlefs.storage.index_fill import PageFill, RangeGet
from bundlefs.storage.key_ranges import END, KeyRanges

_MAX_BRANCHES = 16_384  # decoded branch pages kept (the Python walk's; the upper levels)


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
            self._table = open_page_table(index_dir, marker, page_size, whole=fetch is not None)
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
            self._checked = bytearray((pages + 7) // 8)  # its CRC passed
            self._sound = bytearray(len(self._checked))  # and its layout, bounds, one parent
            self._claimed = bytearray(len(self._checked))  # some branch or the main db holds it
            self._claiming: tuple[int, list[int]] | None = None
            self._branches: dict[int, lp.TreePage] = {}
            self._lock = threading.Lock()
            self._roots = self._main_databases()
            # Mapped for CheckedPaths only: it reads sound pages (a map is left to the collector,
            # as the table: a search racing a close must not read an unmapped page).
            try:
                data = mmap.mmap(self._fd, pages * page_size, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:  # ValueError: the file shrank since its check
                raise FormatError(f"cannot map the index: {e}") from None
            self._paths = native.checked_paths(data, self._sound, page_size)
        except BaseException:
            self.close()
            raise
        self._names: dict[int, bytes] = {}
        self._route_of: dict[int, tuple[Any, int, int]] = {}  # by id of LMDB's handle
        self._spans: dict[bytes, KeyRanges] = {name: KeyRanges() for name in self._roots}

    # -- opening -----------------------------------------------------------------------------

    def _main_databases(self) -> dict[bytes, lp.DatabaseRoot]:
        """The named databases' roots (``main_database``), each claimed, as every page of the
        main database: no branch of theirs may hold one."""
        self._last_pg, roots, main_pages = main_database(self._page, self._last_pg)
        for pgno in main_pages:
            self._claim(pgno)
        for root in roots.values():
            if root.root != lp.INVALID_PAGE and not self._claim(root.root):
                raise FormatError("the index's main database names one page as two roots")
        return roots

    def bind(self, handles: dict[bytes, object]) -> None:
        """Learn LMDB's handle of each named database (the reader passes handles, not names)."""
        for name, handle in handles.items():
            root = self._roots.get(name)
            if root is None:
                raise FormatError(f"the index's main database does not list {name.decode()}")
            self._names[id(handle)] = name
            self._route_of[id(handle)] = (self._paths, root.root, root.depth)

    def forked(self) -> None:
        """In a child after ``fork()``: a parent thread may have held the lock, and been
        claiming a branch's children."""
        self._lock = threading.Lock()
        if self._claiming is not None:
            self._undo_claim()
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

    def route(self, db: object) -> tuple[Any, int, int] | None:
        """What a compiled search needs to tell a checked path from one ``key`` must check:
        the ``CheckedPaths`` (None without the compiled module), ``db``'s root and depth."""
        return self._route_of[id(db)]

    def key(self, db: object, key: bytes) -> None:
        """Before ``get(key)``: the path to the leaf that holds ``key`` is checked."""
        paths, root, depth = self._route_of[id(db)]
        if paths is not None and paths.checked(root, depth, key):
            return
        # Walked without the lock: a walk may wait for the store (PageFill), and one lookup
        # must not wait out another's store timeout; two walks of one path check pages twice.
        self._walk(self._names[id(db)], key)

    def span(self, db: object, lo: bytes = b"", hi: bytes = END) -> None:
        """Before a cursor works between ``lo`` and ``hi`` (both included): every leaf of that
        range is checked, with the leaf before and the leaf after it."""
        name = self._names[id(db)]
        spans = self._spans[name]
        if spans.covers(lo, hi):  # as ``key``: no lock for a range already checked (per read)
            return
        first, end, _pgno = self._walk(name, lo)  # without the lock, as ``key``
        if first:
            self._walk(name, first, below=True)
        while end != END and end <= hi:
            end = self._walk(name, end)[1]
        if end != END:
            self._walk(name, end)
        with self._lock:
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

    def _walk(self, name: bytes, key: bytes, below: bool = False) -> tuple[bytes, bytes, int]:
        """Check LMDB's path to the leaf holding ``key`` (``below``: the leaf before it): that
        leaf's key range and page number (``INVALID_PAGE``: an empty database, where LMDB reads
        no page). A sound leaf is not read again. LMDB takes, in a branch, the last child whose
        key is not above the one searched (the first child's key counts as lower than all)."""
        root = self._roots[name]
        lo, hi, pgno = b"", END, root.root
        if pgno == lp.INVALID_PAGE:
            return lo, hi, pgno
        for depth in range(root.depth):
            at_leaf = depth == root.depth - 1
            if at_leaf and self._is_sound(pgno):
                return lo, hi, pgno
            page = self._branches.get(pgno) or self._check_page(name, pgno, lo, hi, at_leaf)
            if page.leaf:
                return lo, hi, pgno
            i = (bisect_left if below else bisect_right)(page.keys, key, 1) - 1
            if i > 0:
                lo = page.keys[i]
            if i + 1 < len(page.keys):
                hi = page.keys[i + 1]
            pgno = page.children[i]
        raise AssertionError("unreachable: the leaf level returns")

    def _check_page(
        self, name: bytes, pgno: int, lo: bytes, hi: bytes, at_leaf: bool
    ) -> lp.TreePage:
        """Page ``pgno`` decoded, its CRC, layout, bounds (``lo``, ``hi``: its parent's range)
        and kind (a leaf at the leaf level, else a branch) checked; the first time, its children
        claimed and the page marked sound."""
        try:
            page = native.tree_page(self._page(pgno), pgno, self._last_pg)
            for first, size in page.overflow:
                self._check_overflow(first, size)
            lp.check_bounds(page, pgno, lo, None if hi == END else hi)
            if page.leaf != at_leaf:
                raise self._damage(pgno, f"the tree of {name.decode()} is not as deep as it says")
        except CorruptDataError:
            raise
        except FormatError as e:  # checksum right, layout wrong: damage all the same
            raise CorruptDataError(str(e), bundle=self._bundle) from None
        with self._lock:  # two first walks of one branch must not see its children claimed
            if not self._is_sound(pgno):
                self._make_sound(pgno, page.children)
        if not page.leaf:
            if len(self._branches) >= _MAX_BRANCHES:
                self._branches.clear()
            self._branches[pgno] = page
        return page

    def _is_sound(self, pgno: int) -> bool:
        return bool(self._sound[pgno >> 3] & 1 << (pgno & 7))

    def _make_sound(self, pgno: int, children: list[int]) -> None:
        """Claim a checked page's children and mark it sound, all or nothing (callers hold the
        lock): a claim left half done, by a conflict, an interrupt or a fork from another
        thread, would make the page look held twice when checked again."""
        claimed, listed = self._claimed, set()
        for child in children:  # inline: ~280 a branch
            if child in listed or claimed[child >> 3] & 1 << (child & 7):
                raise self._damage(child, "is reached from two places in the tree")
            listed.add(child)
        self._claiming = (pgno, children)  # undone by ``forked`` in a child forked meanwhile
        try:
            for child in children:
                claimed[child >> 3] |= 1 << (child & 7)
            self._sound[pgno >> 3] |= 1 << (pgno & 7)
        except BaseException:
            self._undo_claim()
            raise
        self._claiming = None

    def _undo_claim(self) -> None:
        assert self._claiming is not None
        pgno, children = self._claiming
        for child in children:  # each was unclaimed before (checked under the lock)
            self._claimed[child >> 3] &= ~(1 << (child & 7)) & 0xFF
        self._sound[pgno >> 3] &= ~(1 << (pgno & 7)) & 0xFF
        self._claiming = None

    def _claim(self, pgno: int) -> bool:
        """Mark ``pgno`` as held by one parent; False if something held it already."""
        bit = 1 << (pgno & 7)
        if self._claimed[pgno >> 3] & bit:
            return False
        self._claimed[pgno >> 3] |= bit
        return True

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


def main_database(
    page: Callable[[int], bytes], last_pg: int
) -> tuple[int, dict[bytes, lp.DatabaseRoot], set[int]]:
    """Check both meta pages and every page of the main database (LMDB reads them at open and
    when a database is opened by name), read by ``page(pgno)``: the last page number the meta
    page in use gives, the named databases' roots, and the main database's pages."""
    metas = [lp.meta_main_root(page(n), last_pg) for n in (0, 1)]
    # The larger txnid, the first on a tie, as mdb_env_pick_meta.
    _txnid, last_pg, main = max(metas, key=lambda m: m[0])
    roots: dict[bytes, lp.DatabaseRoot] = {}
    seen: set[int] = set()

    def check(pgno: int, depth: int, lo: bytes, hi: bytes | None) -> None:
        """Page ``pgno`` and the pages below it: each reached once, its keys inside its
        parent's range, its leaves all at ``md_depth``."""
        if pgno in seen:
            raise FormatError("the index's main database reaches one page twice")
        seen.add(pgno)
        tree_page = lp.tree_page(page(pgno), pgno, last_pg, main=True)
        lp.check_bounds(tree_page, pgno, lo, hi)
        if tree_page.leaf != (depth == main.depth - 1):
            raise FormatError("the index's main database is not as deep as it says")
        if tree_page.leaf:
            roots.update(lp.database_roots(tree_page, last_pg))
        keys = tree_page.keys
        for i, child in enumerate(tree_page.children):
            check(child, depth + 1, keys[i] if i else lo, keys[i + 1] if i + 1 < len(keys) else hi)

    if main.root != lp.INVALID_PAGE:
        check(main.root, 0, b"", None)
    return last_pg, roots, seen


def open_page_table(
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
