"""The index's page checksums (version 6) and the part of LMDB's page layout a reader checks.

docs/format.md §3.10: ``index/pages`` holds a CRC32C for every page of ``index/data.mdb``, so a
reader checks a page the first time a lookup could touch it instead of the whole file at open.
To know which pages a lookup touches, the reader follows LMDB's own search through the B-tree;
this module decodes the pages on that path (meta, branch, leaf and the first overflow page) and
validates every field it reads, so that a damaged or hostile page, even one whose checksum
matches, is refused here and never handed to LMDB.

LMDB's fields are native little-endian on the 64-bit builds the format supports (§3.1); the
page table, like everything else of ours, is big-endian.

May import: the standard library, ``bundlefs.errors``, ``bundlefs.core.format.constants``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bundlefs.errors import FormatError

if TYPE_CHECKING:
    import mmap

FIRST_PAGE_CHECK_VERSION = 6  # the first format version with index/pages
PAGES_FILE = "pages"  # in the index directory, beside data.mdb
PAGES_MAGIC = b"BNDLPAGE"
_PAGES_HEAD = struct.Struct(">8sII16sQ")  # magic, page_size, reserved, bundle_id, page_count
PAGES_HEAD_SIZE = _PAGES_HEAD.size  # 40
_CRC = struct.Struct(">I")
_NODE = struct.Struct("<HHHH")  # a node header (below), unpacked once per node of a page

# LMDB 0.9, 64-bit (mdb.c): the page header, the node header, page and node flags.
PAGE_HEADER = 16  # mp_pgno u64, mp_pad u16, mp_flags u16, mp_lower u16, mp_upper u16
NODE_HEADER = 8  # mn_lo u16, mn_hi u16, mn_flags u16, mn_ksize u16
P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
MAX_DEPTH = 32  # LMDB's CURSOR_STACK: no tree it reads is deeper
MAX_KEY = 511  # LMDB's MDB_MAXKEYSIZE, which it enforces on writes only
INVALID_PAGE = 0xFFFFFFFFFFFFFFFF  # md_root of an empty database
META_MAIN_DB = 16 + 72  # the main database's MDB_db in a meta page (after the free one's)
META_TXNID = 144
_MDB_DB = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow, entries, root
MDB_DB_SIZE = _MDB_DB.size  # 48


# --- the page table --------------------------------------------------------------------------


def encode_page_table(page_size: int, bundle_id: bytes, crcs: list[int], crc32c) -> bytes:
    """``index/pages``: header, one u32 per page, and the CRC32C of all that before it."""
    body = _PAGES_HEAD.pack(PAGES_MAGIC, page_size, 0, bundle_id, len(crcs))
    body += struct.pack(f">{len(crcs)}I", *crcs)
    return body + struct.pack(">I", crc32c(body))


def decode_page_table(
    data: bytes, *, page_size: int, index_size: int, bundle_id: bytes, crc32c
) -> bytes:
    """Check the whole page table of an index of ``index_size`` bytes and ``page_size`` pages
    and return it (``page_crc`` reads a page's CRC from it: unpacking a 100M-file index's
    million CRCs into Python ints would cost ~36 MB and ~15 ms at every open)."""
    if len(data) < PAGES_HEAD_SIZE + 4:
        raise FormatError("the index page table is too short")
    if not page_table_sound(data, crc32c):
        raise FormatError("the index page table fails its checksum")
    check_page_table_head(
        data, len(data), page_size=page_size, index_size=index_size, bundle_id=bundle_id
    )
    return data


def page_table_sound(table: bytes | mmap.mmap, crc32c: Callable) -> bool:
    """Whether a page table (at least its header and CRC long) matches its ``table_crc32c``."""
    with memoryview(table) as view:  # released at once: a mapping with a view cannot close
        return bool(_CRC.unpack_from(view, len(view) - 4)[0] == crc32c(view[:-4]))


def check_page_table_head(
    head: bytes, file_size: int, *, page_size: int, index_size: int, bundle_id: bytes
) -> None:
    """Check what the header of a page table of ``file_size`` bytes says against the index it
    must describe: all a reader checks before using the table entry by entry (§3.10)."""
    if len(head) < PAGES_HEAD_SIZE or file_size < PAGES_HEAD_SIZE + 4:
        raise FormatError("the index page table is too short")
    magic, size, _reserved, owner, count = _PAGES_HEAD.unpack_from(head)
    if magic != PAGES_MAGIC:
        raise FormatError("the index page table has a bad magic")
    if owner != bundle_id:
        raise FormatError("the index page table belongs to another bundle")
    if size != page_size or count * page_size != index_size:
        raise FormatError("the index page table does not describe this index file")
    if file_size != PAGES_HEAD_SIZE + 4 * count + 4:
        raise FormatError("the index page table has the wrong length")


def page_count(table: bytes | mmap.mmap) -> int:
    """How many pages a checked page table covers."""
    return (len(table) - PAGES_HEAD_SIZE - 4) // 4


def page_crc(table: bytes | mmap.mmap, pgno: int) -> int:
    """Page ``pgno``'s CRC32C from a checked page table (``pgno < page_count``)."""
    return _CRC.unpack_from(table, PAGES_HEAD_SIZE + 4 * pgno)[0]


def lmdb_page_size(head: bytes) -> int:
    """The page size an index's first meta page records (checked by ``check_lmdb_meta``)."""
    return struct.unpack_from("<I", head, 40)[0]


def page_crcs(index: bytes | memoryview, page_size: int, crc32c: Callable) -> list[int]:
    """The CRC32C of each whole page of ``index`` (a multiple of ``page_size`` bytes)."""
    view = memoryview(index)
    return [crc32c(view[at : at + page_size]) for at in range(0, len(view), page_size)]


# --- LMDB pages ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DatabaseRoot:
    """What the main database says of a named database (LMDB's MDB_db)."""

    root: int  # INVALID_PAGE: empty
    depth: int
    entries: int


@dataclass(frozen=True, slots=True)
class TreePage:
    """A checked branch or leaf page: its keys in order and, for a branch, its children."""

    leaf: bool
    keys: list[bytes]  # a branch's first key is LMDB's implicit "everything below the second"
    children: list[int]  # branch: the child page of each key; leaf: empty
    overflow: list[tuple[int, int]]  # leaf: (first overflow page, data size) of each big value
    values: list[bytes]  # leaf of the main database: each named database's MDB_db; else empty


def meta_main_root(meta: bytes, file_last_pg: int) -> tuple[int, int, DatabaseRoot]:
    """(txnid, last page, the main database) of a meta page (``check_lmdb_meta`` has checked its
    magic, version and page size); LMDB reads the meta with the larger txnid and refuses a page
    past its ``mm_last_pg`` (mdb_page_get), so that, not the file's end, bounds page numbers."""
    flags = struct.unpack_from("<H", meta, 10)[0]
    if flags != P_META:
        raise FormatError("an LMDB meta page is not marked as one")
    last_pg, txnid = struct.unpack_from("<QQ", meta, META_TXNID - 8)
    last_pg = min(last_pg, file_last_pg)
    return txnid, last_pg, _database(meta[META_MAIN_DB : META_MAIN_DB + MDB_DB_SIZE], last_pg)


def _database(value: bytes, last_pg: int) -> DatabaseRoot:
    if len(value) != MDB_DB_SIZE:
        raise FormatError("an LMDB database record has the wrong size")
    _pad, flags, depth, _b, _l, _o, entries, root = _MDB_DB.unpack(value)
    if flags:  # REVERSEKEY, DUPSORT, INTEGERKEY (0x08: another key order), ...: none of ours
        raise FormatError("an index database has flags this format does not use")
    if root != INVALID_PAGE and not (2 <= root <= last_pg and 1 <= depth <= MAX_DEPTH):
        raise FormatError("an index database's root page is out of range")
    return DatabaseRoot(root, depth, entries)


def database_roots(page: TreePage, last_pg: int) -> dict[bytes, DatabaseRoot]:
    """The named databases a leaf of the main database lists."""
    return {
        key: _database(value, last_pg) for key, value in zip(page.keys, page.values, strict=True)
    }


def tree_page(page: bytes, pgno: int, last_pg: int, *, main: bool = False) -> TreePage:
    """Decode and validate branch or leaf page ``pgno`` of ``page_size == len(page)`` bytes."""
    size = len(page)
    number, _pad, flags, lower, upper = struct.unpack_from("<QHHHH", page)
    if number != pgno:
        raise FormatError(f"index page {pgno} says it is page {number}")
    if flags not in (P_BRANCH, P_LEAF):  # LMDB's other flags are never on a written page
        raise FormatError(f"index page {pgno} is neither a branch nor a leaf")
    if lower < PAGE_HEADER or lower > upper or upper > size or lower % 2:
        raise FormatError(f"index page {pgno} has inconsistent bounds")
    leaf = bool(flags & P_LEAF)
    count = (lower - PAGE_HEADER) // 2
    if count < (1 if leaf else 2):  # LMDB asserts (aborts) on a branch of one node
        raise FormatError(f"index page {pgno} holds too few nodes")
    keys: list[bytes] = []
    children: list[int] = []
    overflow: list[tuple[int, int]] = []
    values: list[bytes] = []
    node = _NODE.unpack_from
    for ptr in struct.unpack_from(f"<{count}H", page, PAGE_HEADER):
        if ptr < upper or ptr % 2 or ptr + NODE_HEADER > size:
            raise FormatError(f"index page {pgno} has a node outside its body")
        lo, hi, nflags, ksize = node(page, ptr)
        start = ptr + NODE_HEADER
        end = start + ksize
        if end > size or ksize > MAX_KEY or (ksize == 0 and (leaf or keys)):
            raise FormatError(f"index page {pgno} has a key of a size LMDB never writes")
        keys.append(page[start:end])
        if not leaf:
            child = lo | hi << 16 | nflags << 32
            if not 2 <= child <= last_pg:
                raise FormatError(f"index page {pgno} points to a page out of range")
            children.append(child)
        elif nflags or main or end + (lo | hi << 16) > size:  # else a plain value that fits
            _leaf_value(page, pgno, end, lo | hi << 16, nflags, main, overflow, values)
    # Strictly ascending (a branch's first key is never compared): sorted() is C's, and finds
    # a sorted list so in one pass; ~3x cheaper per page than comparing pairs in Python.
    compared = keys[1:] if not leaf else keys
    if compared != sorted(compared) or len(set(compared)) != len(compared):
        raise FormatError(f"index page {pgno} holds keys out of order")
    return TreePage(leaf, keys, children, overflow, values)


def check_bounds(page: TreePage, pgno: int, lo: bytes, hi: bytes | None) -> None:
    """A page's keys lie within the range its parent gave it, ``[lo, hi)`` (``hi`` None: no
    end): true of every tree LMDB writes, and what makes the search that found the page and
    LMDB's moves to a neighbour by position land on the same pages."""
    keys = page.keys if page.leaf else page.keys[1:]
    if keys[0] < lo or (not page.leaf and keys[0] == lo) or (hi is not None and keys[-1] >= hi):
        raise FormatError(f"index page {pgno} holds keys outside its parent's range")


def _leaf_value(page, pgno, at, dsize, nflags, main, overflow, values) -> None:
    """Check one leaf node's value; note a big value's overflow page, a main-database record."""
    if nflags & ~(F_BIGDATA | F_SUBDATA) or bool(nflags & F_SUBDATA) != main:
        raise FormatError(f"index page {pgno} has a node of a kind this format does not use")
    if nflags & F_BIGDATA:
        if main or at + 8 > len(page):
            raise FormatError(f"index page {pgno} has a bad overflow reference")
        overflow.append((struct.unpack_from("<Q", page, at)[0], dsize))
        return
    if at + dsize > len(page):
        raise FormatError(f"index page {pgno} has a value past its end")
    if main:
        values.append(page[at : at + dsize])


def overflow_pages(page: bytes, pgno: int, dsize: int, last_pg: int) -> int:
    """How many pages the overflow run starting at ``pgno`` covers (its first page decoded)."""
    number, _pad, flags, count = struct.unpack_from("<QHHI", page)
    if number != pgno or not flags & P_OVERFLOW:
        raise FormatError(f"index page {pgno} is not the overflow page a value names")
    if count < 1 or pgno + count - 1 > last_pg or count * len(page) - PAGE_HEADER < dsize:
        raise FormatError(f"index overflow run at page {pgno} has a bad length")
    return count
