"""Format version 6 checks the index page by page (docs/format.md §3.10): opening reads a few
pages, each other page is checked before LMDB first reads it, and damage in one page costs the
entries behind it, not the bundle.

The bundle here has 6,000 files: its entries database is a two-level tree of ~70 leaves, so the
walk through branch pages, the neighbours of a scan and the overflow pages are all exercised.
"""

from __future__ import annotations

import errno
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bundlefs import Bundle, pack
from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.core.format import pages as lp
from bundlefs.errors import CorruptDataError, FormatError
from bundlefs.read.verify import verify
from bundlefs.storage import native
from bundlefs.storage.index import IndexReader
from bundlefs.storage.index_guard import IndexPageGuard
from bundlefs.storage.key_ranges import END, KeyRanges
from tests.conftest import flip_byte
from tests.support.hostile import reseal
from tests.support.trees import assert_one_line_error, run_cli

FILES = 6000


@pytest.fixture(scope="module")
def paged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("paged-src")
    for i in range(FILES):
        d = src / f"d{i % 20:02d}"
        d.mkdir(exist_ok=True)
        (d / f"file-with-a-longer-name-{i:05d}.txt").write_bytes(b"%d\n" % i)
    (src / "big-user-data").write_bytes(b"x")
    out = tmp_path_factory.mktemp("paged") / "b"
    pack(str(src), str(out))
    return out


def _copy(bundle: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "copy"
    dest.mkdir()
    (dest / fmt.INDEX_DIR).mkdir()
    for name in os.listdir(bundle):
        if name != fmt.INDEX_DIR:
            os.link(bundle / name, dest / name)
    for name in os.listdir(bundle / fmt.INDEX_DIR):
        (dest / fmt.INDEX_DIR / name).write_bytes((bundle / fmt.INDEX_DIR / name).read_bytes())
    return dest


@contextmanager
def _reader(bundle: Path, **options) -> Iterator[IndexReader]:
    index = IndexReader(str(bundle), **options)
    try:
        yield index
    finally:
        index.close()


def _guard(index: IndexReader) -> IndexPageGuard:
    guard = index._pages
    assert isinstance(guard, IndexPageGuard)
    return guard


def _checked(guard: IndexPageGuard) -> int:
    return sum(bin(byte).count("1") for byte in guard._checked)


def _leaf_pages(bundle: Path, db: bytes) -> list[int]:
    """The leaf pages of ``db``, in key order (from the guard's own walk)."""
    with _reader(bundle) as index:
        guard = _guard(index)
        pages, key = [], b""
        while True:
            _lo, hi, pgno = guard._walk(db, key)
            pages.append(pgno)
            if hi == END:
                return pages
            key = hi


def _leaf(guard: IndexPageGuard, pgno: int) -> lp.TreePage:
    return native.tree_page(guard._page(pgno), pgno, guard._last_pg)


def test_the_packer_writes_a_page_table_of_the_index(paged: Path) -> None:
    index = (paged / fmt.INDEX_DIR / fmt.INDEX_FILE).read_bytes()
    table = (paged / fmt.INDEX_DIR / lp.PAGES_FILE).read_bytes()
    with Bundle(paged) as b:
        marker = b._parts.index.marker
    checked = lp.decode_page_table(
        table,
        page_size=4096,
        index_size=len(index),
        bundle_id=marker.bundle_id,
        crc32c=crc32c,
    )
    crcs = [lp.page_crc(checked, n) for n in range(lp.page_count(checked))]
    assert crcs == lp.page_crcs(index, 4096, crc32c)


def test_opening_checks_a_few_pages_not_the_index(paged: Path) -> None:
    with _reader(paged) as index:
        guard = _guard(index)
        assert lp.page_count(guard._table) > 100
        assert _checked(guard) <= 20


def test_every_key_lmdb_holds_is_in_the_leaf_the_guard_walks_to(paged: Path) -> None:
    with _reader(paged) as index:
        guard = _guard(index)
        assert guard._roots[fmt.DB_ENTRIES].depth >= 2
        for name, db in index._dbs.items():
            for key in index._txn().cursor(db=db).iternext(keys=True, values=False):
                assert key in _leaf(guard, guard._walk(name, key)[2]).keys


def _every_file(index: IndexReader) -> list[int]:
    """Each file found by name in its directory (the binary search the mount makes)."""
    found = []
    root = index.entry(fmt.ROOT_INO)
    for ino, _name in index.iter_names(root.first_child, root.size):
        directory = index.entry(ino)
        if not directory.is_dir:
            continue
        for _ino, name in index.iter_names(directory.first_child, directory.size):
            found.append(index.find_child(directory.first_child, directory.size, name))
    return found


def test_a_lookup_again_checks_no_page_again(paged: Path, monkeypatch) -> None:
    with _reader(paged) as index:
        guard = _guard(index)
        first = _every_file(index)
        assert len(first) == FILES and _checked(guard) > 20

        def checked_again(*args) -> None:
            raise AssertionError(f"a page checked again: {args}")

        monkeypatch.setattr(guard, "_check_page", checked_again)
        assert _every_file(index) == first


@pytest.mark.skipif(native.module is None, reason="needs the compiled module")
def test_a_lookup_on_checked_pages_is_answered_without_walking(paged: Path, monkeypatch) -> None:
    with _reader(paged) as index:
        guard = _guard(index)
        first = _every_file(index)
        walks: list[bytes] = []
        monkeypatch.setattr(guard, "_walk", lambda name, key, **kw: walks.append(key))
        assert _every_file(index) == first and not walks


def test_branches_decoded_again_are_not_taken_for_pages_held_twice(paged, monkeypatch) -> None:
    from bundlefs.storage import index_guard

    monkeypatch.setattr(index_guard, "_MAX_BRANCHES", 1)
    with _reader(paged) as index:
        assert _every_file(index) == _every_file(index)


class _FailingBits(bytearray):
    """A bitmap whose third write raises, as an interrupt would land."""

    writes = 0

    def __setitem__(self, at, value) -> None:
        type(self).writes += 1
        if type(self).writes == 3:
            raise KeyboardInterrupt
        super().__setitem__(at, value)


def test_a_claim_interrupted_half_way_is_undone(paged) -> None:
    with _reader(paged) as index:
        guard = _guard(index)
        key = fmt.entry_key(FILES // 2)
        guard._claimed = _FailingBits(guard._claimed)
        with pytest.raises(KeyboardInterrupt):
            guard._walk(fmt.DB_ENTRIES, key)
        assert key in _leaf(guard, guard._walk(fmt.DB_ENTRIES, key)[2]).keys


def test_a_child_forked_during_a_claim_checks_that_branch_again(paged) -> None:
    with _reader(paged) as index:
        guard = _guard(index)
        root = guard._roots[fmt.DB_ENTRIES].root
        children = native.tree_page(guard._page(root), root, guard._last_pg).children
        for child in children[:3]:  # as a thread forked from leaves them: half claimed
            guard._claimed[child >> 3] |= 1 << (child & 7)
        guard._claiming = (root, children[:3])
        guard.forked()
        key = fmt.entry_key(FILES // 2)
        assert key in _leaf(guard, guard._walk(fmt.DB_ENTRIES, key)[2]).keys


def test_reading_every_file_checks_the_pages_it_needs(paged: Path) -> None:
    with Bundle(paged) as b:
        for i in range(0, FILES, 97):
            path = f"d{i % 20:02d}/file-with-a-longer-name-{i:05d}.txt"
            assert b.read(path) == b"%d\n" % i
        assert sum(1 for _ in b.walk("/")) == 21


def test_a_damaged_entries_leaf_fails_only_the_files_behind_it(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    leaves = _leaf_pages(bundle, fmt.DB_ENTRIES)
    flip_byte(bundle / fmt.INDEX_DIR / fmt.INDEX_FILE, leaves[len(leaves) // 2] * 4096 + 2000)
    ok, damaged = 0, 0
    with Bundle(bundle) as b:  # opens: the damaged page is not one opening reads
        for i in range(FILES):
            try:
                b.read(f"d{i % 20:02d}/file-with-a-longer-name-{i:05d}.txt")
                ok += 1
            except CorruptDataError as e:
                assert "index page" in str(e)
                damaged += 1
    assert damaged > 0 and ok > FILES * 0.8  # the leaf's entries, lookups that pass it


def test_verify_reports_a_damaged_page_no_lookup_touched(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    leaves = _leaf_pages(bundle, fmt.DB_ENTRIES)
    flip_byte(bundle / fmt.INDEX_DIR / fmt.INDEX_FILE, leaves[-1] * 4096 + 3000)
    with Bundle(bundle) as b:
        assert b.read("d00/file-with-a-longer-name-00000.txt") == b"0\n"
    report = verify(bundle)
    assert not report.ok
    assert any("index page" in p.message for p in report.problems)


def test_verify_names_the_damaged_page_and_the_entries_behind_it_and_checks_the_rest(
    paged, tmp_path
) -> None:
    bundle = _copy(paged, tmp_path)
    leaves = _leaf_pages(bundle, fmt.DB_ENTRIES)
    pgno = leaves[len(leaves) // 2]
    flip_byte(bundle / fmt.INDEX_DIR / fmt.INDEX_FILE, pgno * 4096 + 2000)
    report = verify(bundle)
    assert [p.message for p in report.problems if p.kind == "index"] == [
        f"index page {pgno} fails its checksum"
    ]
    lost = [p.message for p in report.problems if p.kind == "entry"]
    assert 0 < len(lost) < 200 and all(f"index page {pgno}" in m for m in lost)
    assert report.shards_checked or report.shards


def test_a_page_whose_checksum_matches_but_whose_layout_is_wrong_is_damage(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    leaves = _leaf_pages(bundle, fmt.DB_ENTRIES)
    index_path = bundle / fmt.INDEX_DIR / fmt.INDEX_FILE
    pgno = leaves[3]
    with open(index_path, "r+b") as f:  # the first node offset points past the page
        f.seek(pgno * 4096 + 16)
        f.write(struct.pack("<H", 4095))
    _reseal_pages(bundle)
    with Bundle(bundle) as b, pytest.raises(CorruptDataError, match="outside its body"):
        for i in range(FILES):
            b.read(f"d{i % 20:02d}/file-with-a-longer-name-{i:05d}.txt")


def _reseal_pages(bundle: Path) -> None:
    """Rewrite the page table for the index as it is now (a hostile bundle's checksums agree)."""
    index = (bundle / fmt.INDEX_DIR / fmt.INDEX_FILE).read_bytes()
    table_path = bundle / fmt.INDEX_DIR / lp.PAGES_FILE
    bundle_id = table_path.read_bytes()[16:32]
    crcs = lp.page_crcs(index, 4096, crc32c)
    table_path.write_bytes(lp.encode_page_table(4096, bundle_id, crcs, crc32c))


def _damage_table_entry(bundle: Path, pgno: int) -> None:
    flip_byte(bundle / fmt.INDEX_DIR / lp.PAGES_FILE, lp.PAGES_HEAD_SIZE + 4 * pgno + 1)


def test_a_damaged_page_table_entry_costs_only_the_files_behind_its_page(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    leaves = _leaf_pages(bundle, fmt.DB_ENTRIES)
    pgno = leaves[len(leaves) // 2]
    _damage_table_entry(bundle, pgno)
    ok, damaged = 0, 0
    with Bundle(bundle) as b:  # opens: the table's entries are read as their pages are checked
        for i in range(FILES):
            try:
                b.read(f"d{i % 20:02d}/file-with-a-longer-name-{i:05d}.txt")
                ok += 1
            except CorruptDataError as e:
                assert f"index page {pgno} fails its checksum" in str(e)
                assert "page table fails its own checksum" in str(e)
                damaged += 1
    assert damaged > 0 and ok > FILES * 0.8


def test_verify_refuses_a_page_table_that_fails_its_checksum(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    _damage_table_entry(bundle, _leaf_pages(bundle, fmt.DB_ENTRIES)[-1])
    with Bundle(bundle) as b:
        assert b.read("d00/file-with-a-longer-name-00000.txt") == b"0\n"
    report = verify(bundle)
    assert not report.ok
    assert any("page table fails its checksum" in p.message for p in report.problems)


def test_a_page_table_of_the_wrong_length_refuses_the_bundle(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    with open(bundle / fmt.INDEX_DIR / lp.PAGES_FILE, "ab") as f:
        f.write(b"\0")
    with pytest.raises(FormatError, match="page table has the wrong length"):
        Bundle(bundle)


def test_a_missing_page_table_refuses_the_bundle(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    os.unlink(bundle / fmt.INDEX_DIR / lp.PAGES_FILE)
    with pytest.raises(FormatError, match="cannot read the index page table"):
        Bundle(bundle)


def test_a_page_table_of_another_bundle_is_refused(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    table = bundle / fmt.INDEX_DIR / lp.PAGES_FILE
    data = bytearray(table.read_bytes())
    data[16] ^= 0xFF
    data[-4:] = struct.pack(">I", crc32c(bytes(data[:-4])))
    table.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="belongs to another bundle"):
        Bundle(bundle)


def test_a_damaged_meta_page_refuses_the_bundle(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    flip_byte(bundle / fmt.INDEX_DIR / fmt.INDEX_FILE, 4096 + 300)
    with pytest.raises(CorruptDataError, match="index page 1 fails its checksum"):
        Bundle(bundle)


def test_the_cli_names_the_damaged_page_in_one_sentence(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    flip_byte(bundle / fmt.INDEX_DIR / fmt.INDEX_FILE, 300)
    message = assert_one_line_error(run_cli("ls", bundle))
    assert "index page 0 fails its checksum" in message


def test_without_the_index_check_no_page_is_checked(paged) -> None:
    with _reader(paged, check_checksum=False) as index:
        assert not isinstance(index._pages, IndexPageGuard)
        assert index.entry(fmt.ROOT_INO).is_dir


# --- the remembered key ranges -------------------------------------------------------------


def test_key_ranges_join_what_touches_and_keep_what_does_not() -> None:
    ranges = KeyRanges()
    ranges.add(b"b", b"d")
    ranges.add(b"f", b"h")
    assert ranges.covers(b"b", b"c") and not ranges.covers(b"d", b"d")
    assert not ranges.covers(b"c", b"f")
    ranges.add(b"d", b"f")
    assert ranges.starts == [b"b"] and ranges.ends == [b"h"]
    assert ranges.covers(b"c", b"g")


def test_key_ranges_to_the_end_cover_every_key_after_their_start() -> None:
    ranges = KeyRanges()
    ranges.add(b"m", END)
    assert ranges.covers(b"m", END) and ranges.covers(b"\xff" * 40, b"\xff" * 511)
    assert not ranges.covers(b"a", b"n")
    ranges.add(b"", b"b")
    assert ranges.covers(b"", b"a") and not ranges.covers(b"", b"c")


# --- through a real mount --------------------------------------------------------------------


@pytest.mark.mount
@pytest.mark.parametrize("workers", ["1", "4"])
def test_a_mount_answers_eio_behind_a_damaged_index_page_and_serves_the_rest(
    paged, tmp_path, mount_bundle, workers
) -> None:
    bundle = _copy(paged, tmp_path)
    leaves = _leaf_pages(bundle, fmt.DB_ENTRIES)
    flip_byte(bundle / fmt.INDEX_DIR / fmt.INDEX_FILE, leaves[len(leaves) // 2] * 4096 + 2000)
    m = mount_bundle(
        bundle,
        "--workers",
        workers,
        allowed_log=[r"damaged data, read failed with EIO: index page"],
    )
    ok, eio = 0, 0
    for i in range(FILES):
        path = m.mountpoint / f"d{i % 20:02d}" / f"file-with-a-longer-name-{i:05d}.txt"
        try:
            assert path.read_bytes() == b"%d\n" % i
            ok += 1
        except OSError as e:
            assert e.errno == errno.EIO, e
            eio += 1
    assert eio > 0 and ok > FILES * 0.8
    assert m.process.poll() is None
    assert "index page" in m.log_path.read_text()


# --- hostile pages whose checksums agree: refused before LMDB sees them ----------------------

_PROBE = """
import sys
from bundlefs import Bundle
from bundlefs.errors import BundleError
try:
    with Bundle(sys.argv[1]) as b:
        for path in b.paths():
            if b.isfile(path):
                b.read(path)
except BundleError as e:
    print("refused:", e)
else:
    print("read")
"""


def _probe(bundle: Path) -> str:
    """Open and read everything in a child process (LMDB aborts or faults on what the guard
    lets through): its outcome, asserting it did not crash."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(bundle)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _edit_page(bundle: Path, pgno: int, edit) -> None:
    """Apply ``edit(bytearray of the page)`` and reseal: marker and page table agree."""
    path = bundle / fmt.INDEX_DIR / fmt.INDEX_FILE
    data = bytearray(path.read_bytes())
    page = data[pgno * 4096 : (pgno + 1) * 4096]
    edit(page)
    data[pgno * 4096 : (pgno + 1) * 4096] = page
    path.write_bytes(bytes(data))
    reseal(bundle)


def _root_of(bundle: Path, db: bytes) -> int:
    with _reader(bundle) as index:
        return _guard(index)._roots[db].root


def test_a_branch_of_one_node_is_refused_where_lmdb_would_abort(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    _edit_page(
        bundle,
        _root_of(bundle, fmt.DB_ENTRIES),
        lambda p: p.__setitem__(slice(12, 14), struct.pack("<H", 18)),
    )
    assert "holds too few nodes" in _probe(bundle)


def test_a_database_with_lmdb_flags_is_refused(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    index = (bundle / fmt.INDEX_DIR / fmt.INDEX_FILE).read_bytes()
    metas = [lp.meta_main_root(index[n * 4096 : (n + 1) * 4096], 10**9) for n in (0, 1)]
    root = max(metas, key=lambda m: m[0])[2].root  # the main database: one leaf here
    page = index[root * 4096 : (root + 1) * 4096]
    # The node of ``entries``: flags F_SUBDATA, key size, the name, then its MDB_db.
    at = root * 4096 + page.find(struct.pack("<HH", 2, len(fmt.DB_ENTRIES)) + fmt.DB_ENTRIES)
    flags_at = at + 4 + len(fmt.DB_ENTRIES) + 4  # md_flags, after md_pad

    def set_flags(page: bytearray) -> None:
        page[flags_at % 4096] = 0x08  # MDB_INTEGERKEY: LMDB would order the keys as integers

    _edit_page(bundle, at // 4096, set_flags)
    assert "flags this format does not use" in _probe(bundle)


def test_meta_pages_that_disagree_on_the_page_size_are_refused(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)

    def second_meta(page: bytearray) -> None:
        page[40:44] = struct.pack("<I", 8192)
        page[144:152] = struct.pack("<Q", 2**40)  # the larger txnid: LMDB would pick this one

    _edit_page(bundle, 1, second_meta)
    assert "meta pages disagree" in _probe(bundle)


def test_a_leaf_holding_a_key_outside_its_parents_range_is_refused(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    leaf = _leaf_pages(bundle, fmt.DB_ENTRIES)[5]

    def lower_first_key(page: bytearray) -> None:
        ptr = struct.unpack_from("<H", page, 16)[0]
        (first,) = struct.unpack_from(">I", page, ptr + 8)
        page[ptr + 8 : ptr + 12] = struct.pack(">I", first - 1)  # still below the second key

    _edit_page(bundle, leaf, lower_first_key)
    assert "outside its parent's range" in _probe(bundle)


def test_a_page_two_branches_hold_is_refused(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    root = _root_of(bundle, fmt.DB_ENTRIES)

    def second_child_is_the_first(page: bytearray) -> None:
        first, second = struct.unpack_from("<HH", page, 16)
        page[second : second + 6] = page[first : first + 6]  # a child's page number

    _edit_page(bundle, root, second_child_is_the_first)
    assert "is reached from two places in the tree" in _probe(bundle)


def test_a_database_root_a_branch_also_holds_is_refused(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    root, other = _root_of(bundle, fmt.DB_ENTRIES), _root_of(bundle, fmt.DB_RECORDS)
    assert other != lp.INVALID_PAGE

    def first_child_is_another_root(page: bytearray) -> None:
        (first,) = struct.unpack_from("<H", page, 16)
        page[first : first + 6] = struct.pack("<Q", other)[:6]

    _edit_page(bundle, root, first_child_is_another_root)
    assert "is reached from two places in the tree" in _probe(bundle)


def test_a_branch_holding_a_page_of_the_main_database_is_refused(paged, tmp_path) -> None:
    bundle = _copy(paged, tmp_path)
    index = (bundle / fmt.INDEX_DIR / fmt.INDEX_FILE).read_bytes()
    metas = [lp.meta_main_root(index[n * 4096 : (n + 1) * 4096], 10**9) for n in (0, 1)]
    main = max(metas, key=lambda m: m[0])[2].root

    def first_child_is_the_main_database(page: bytearray) -> None:
        (first,) = struct.unpack_from("<H", page, 16)
        page[first : first + 6] = struct.pack("<Q", main)[:6]

    _edit_page(bundle, _root_of(bundle, fmt.DB_ENTRIES), first_child_is_the_main_database)
    assert "is reached from two places in the tree" in _probe(bundle)


def test_a_damaged_source_record_page_is_refused_by_strict_lookups_and_verify(
    paged, tmp_path
) -> None:
    from bundlefs.storage.source_records import source_record

    bundle = _copy(paged, tmp_path)
    leaf = _leaf_pages(bundle, fmt.DB_SOURCES)[0]
    flip_byte(bundle / fmt.INDEX_DIR / fmt.INDEX_FILE, leaf * 4096 + 2048)
    with _reader(bundle) as index, pytest.raises(CorruptDataError, match=f"index page {leaf}"):
        for ino in range(1, index.config.entry_count + 1):
            source_record(index, ino)
    assert f"index page {leaf} fails its checksum" in [p.message for p in verify(bundle).problems]
