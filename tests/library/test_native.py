"""The compiled index steps (``bundlefs.storage._native``) give what the pure-Python path gives.

Both paths run over real bundles (every version 3 to 6 layout the committed bundles and a fresh
pack hold): every entry decoded, every child name searched (and names that are not there), the
record of every file's first and last byte, every page of the index the page guard decodes.
Then damaged values: for every one the compiled
decoders accept, the Python decoders must accept it too and decode the same thing (they decline
everything else, and the Python path reports it). And the loader: a build whose source hash is
not the ``.pyx``'s is never used, and ``BUNDLEFS_NO_NATIVE`` turns the compiled path off.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bundlefs import Bundle
from bundlefs.core import format as fmt
from bundlefs.core.format import pages as lp
from bundlefs.errors import FormatError
from bundlefs.storage import native
from bundlefs.storage.index import IndexReader
from tests.support.legacy_trees import V3_BUNDLE, V4_BUNDLE, V5_BUNDLE

NATIVE = native.module
# Where it was not built (no Cython or compiler): nothing to compare. A stale build is not
# "not built": test_the_checkout_build_is_current fails on it.
needs_native = pytest.mark.skipif(
    native.status.startswith("not built"), reason=f"bundlefs.storage._native: {native.status}"
)


def _both(monkeypatch: pytest.MonkeyPatch, call: Callable[..., Any], *args: Any) -> list[Any]:
    """``call(*args)`` on the Python path, then on the compiled one (a result or an error)."""
    results: list[Any] = []
    for module in (None, NATIVE):
        monkeypatch.setattr(native, "module", module)
        try:
            results.append(call(*args))
        except FormatError as e:
            results.append(("FormatError", str(e)))
    return results


def _compare_bundle(path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    checked = 0
    with Bundle(path) as b:
        index: IndexReader = b.tree._index
        for ino in range(fmt.ROOT_INO, index.config.entry_count + 1):
            python, compiled = _both(monkeypatch, index.entry, ino)
            assert python == compiled, ino
            entry = python
            if entry.is_dir and entry.size:
                first, count = entry.first_child, entry.size
                names = [name for _ino, name in index.iter_names(first, count)]
                for name in [*names, b"", b"~", b"\xff" * 3, *(n + b"\0" for n in names[:3])]:
                    got = _both(monkeypatch, index.find_child, first, count, name)
                    assert got[0] == got[1], (ino, name)
                    want = first + names.index(name) if name in names else None
                    assert got[0] == want
                for start, count in ((1, 3), (entry.size - 1, 5), (0, entry.size)):
                    got = _both(monkeypatch, b.tree.dirent_stats, entry, start, count)
                    assert got[0] == got[1], (ino, start)
                names, stats = got[1]  # the whole listing, compiled
                listed = list(b.tree.children(entry))  # every child decoded in full
                assert names == [name for name, _ in listed]
                assert [stat[0] for stat in stats] == [e.ino for _, e in listed]
            if entry.is_file and not entry.is_link and entry.size:
                for at in (entry.offset, entry.offset + entry.size - 1):
                    got = _both(monkeypatch, index.record_at, entry.shard, at)
                    assert got[0] == got[1], (ino, at)
            checked += 1
    return checked


@pytest.mark.parametrize("path", [V3_BUNDLE, V4_BUNDLE, V5_BUNDLE], ids=["v3", "v4", "v5"])
@needs_native
def test_committed_bundles_read_the_same_both_ways(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _compare_bundle(path, monkeypatch) > 10


@needs_native
def test_current_bundles_read_the_same_both_ways(
    sample_bundle_path: Path, grafted_bundle_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _compare_bundle(sample_bundle_path, monkeypatch) > 10
    assert _compare_bundle(grafted_bundle_path, monkeypatch) > 10


def _file_entries() -> Iterator[fmt.Entry]:
    """Plain files in every layout the encoder writes: widths, owners, mtimes in seconds and
    nanoseconds, wide locations, NLINK, a content type, user data, a digest."""
    base = fmt.Entry(ino=7, mode=0o100644, owner=0, mtime_ns=0, size=0, name=b"f")
    for size in (0, 1, 300, 70_000, 2**33):
        for owner, mtime_ns in ((0, 1_700_000_000 * 10**9), (3, 1_700_000_000 * 10**9 + 5)):
            for shard, offset in ((0, 0), (2, 5000), (300, 2**40)):
                yield dataclasses.replace(
                    base, size=size, owner=owner, mtime_ns=mtime_ns, shard=shard, offset=offset
                )
    yield dataclasses.replace(base, flags=fmt.FLAG_NLINK, nlink=3, crc32c=0xDEADBEEF)
    yield dataclasses.replace(base, content_type=4, name=b"x.json")
    yield dataclasses.replace(base, user_data=b"u" * 40)
    yield dataclasses.replace(base, digest=bytes(range(16)), mtime_ns=-(10**9))
    yield dataclasses.replace(
        base, flags=fmt.FLAG_NLINK, nlink=2, content_type=1, user_data=b"x", digest=b"d" * 16
    )


def _mutations(value: bytes, rng: random.Random) -> Iterator[bytes]:
    yield value
    for cut in range(len(value)):
        yield value[:cut]
    for at in range(len(value)):
        for byte in (0, 0xFF, 0x2F, 0x2E, value[at] ^ (1 << rng.randrange(8))):
            yield value[:at] + bytes([byte]) + value[at + 1 :]
    yield value + b"/"
    yield value + b"\0"


def _mutated_file_values(rng: random.Random) -> Iterator[tuple[int, bytes]]:
    """(version, value): damaged values of every sample file entry in versions 3–6 (a digest
    only from version 5, where the format has one)."""
    for version in (3, 4, 5, 6):
        for entry in _file_entries():
            if entry.digest and version < 5:
                continue
            for value in _mutations(fmt.encode_entry(entry, version), rng):
                yield version, value


def _python_decode(ino: int, value: bytes, version: int) -> fmt.Entry | None:
    try:
        return fmt.decode_entry(ino, value, version)
    except FormatError:
        return None


@needs_native
def test_damaged_file_values_are_declined_or_decoded_as_python_does() -> None:
    assert NATIVE is not None
    accepted = 0
    for version, value in _mutated_file_values(random.Random(21)):
        for ino in (1, 7):
            got = NATIVE.decode_file(fmt.Entry, ino, value, version)
            if got is not None:
                accepted += 1
                assert got == _python_decode(ino, value, version), (version, value)
    assert accepted > 1000
    # Versions 1 and 2, directories, LINK entries, symlinks: always the Python path.
    dir_entry = fmt.Entry(ino=2, mode=0o040755, owner=0, mtime_ns=0, size=0, name=b"d")
    link = fmt.Entry(ino=3, mode=0o100644, owner=0, mtime_ns=0, size=0, name=b"l", target=9)
    link = dataclasses.replace(link, flags=fmt.FLAG_LINK)
    assert NATIVE.decode_file(fmt.Entry, 2, fmt.encode_entry(dir_entry, 6), 6) is None
    assert NATIVE.decode_file(fmt.Entry, 3, fmt.encode_entry(link, 6), 6) is None
    plain = next(_file_entries())
    assert NATIVE.decode_file(fmt.Entry, 7, fmt.encode_entry(plain, 2), 2) is None


@needs_native
def test_damaged_file_values_are_listed_as_their_decode_decodes_them() -> None:
    # A listing's compiled attributes: a value is read where decode_file reads it, its owner
    # and content type exist, and then exactly as that entry's stat; else left for the decode.
    assert NATIVE is not None
    owners = [(0, 0), (1000, 1000), (7, 8), (9, 9)]
    listed = 0
    for version, value in _mutated_file_values(random.Random(26)):
        names, stats, rest = NATIVE.file_stats([value], 7, version, owners, 3)
        decoded = NATIVE.decode_file(fmt.Entry, 7, value, version)
        takes = decoded is not None and decoded.owner < 4 and decoded.content_type < 3
        assert (rest == []) == takes, (version, value)
        if not takes:
            assert (names, stats, rest) == ([b""], [None], [0])
            continue
        listed += 1
        uid, gid = owners[decoded.owner]
        assert names == [decoded.name]
        assert stats == [
            (7, decoded.mode, decoded.nlink, uid, gid, decoded.size, decoded.mtime_ns, 0)
        ]
    assert listed > 1000
    # The root's inode, and values that are no file's: left for the decode.
    plain = fmt.encode_entry(next(_file_entries()), 6)
    assert NATIVE.file_stats([plain], 1, 6, owners, 3)[2] == [0]
    directory = fmt.Entry(ino=2, mode=0o040755, owner=0, mtime_ns=0, size=0, name=b"d")
    assert NATIVE.file_stats([fmt.encode_entry(directory, 6), plain], 2, 6, owners, 3)[2] == [0]


def _value_of(value: bytes, key: bytes, db: object) -> bytes:
    return value


def _no_check(db: object, key: bytes) -> None:
    pass


@needs_native
def test_damaged_names_are_found_as_python_names_them() -> None:
    """The name the compiled search compares is ``entry_name``'s, for every kind and damage."""
    assert NATIVE is not None
    rng = random.Random(22)
    kinds = [
        *_file_entries(),
        fmt.Entry(ino=2, mode=0o040755, owner=0, mtime_ns=0, size=2, name=b"d", first_child=5),
        fmt.Entry(ino=3, mode=0o120777, owner=0, mtime_ns=0, size=3, name=b"s", symlink=b"abc"),
        fmt.Entry(ino=4, mode=0o020644, owner=1, mtime_ns=0, size=0, name=b"c", rdev=0x0501),
        fmt.Entry(ino=6, mode=0o010644, owner=0, mtime_ns=0, size=0, name=b"p"),
    ]
    for entry in kinds:
        for value in _mutations(fmt.encode_entry(entry, 6), rng):
            try:
                name = fmt.entry_name(value, 6)
            except FormatError:
                continue
            found = NATIVE.find_child(
                functools.partial(_value_of, value), _no_check, None, 0, 0, None, 1, 1, name,
                fmt.entry_name, 6,
            )  # fmt: skip
            assert found == 1, value


@needs_native
def test_damaged_records_are_declined_or_decoded_as_python_does() -> None:
    assert NATIVE is not None
    rng = random.Random(23)
    config = fmt.Config(record_size=256 * 1024, block_size=4096)
    records = [
        fmt.Record(0, 0, 4096, 100, 1000, 7, 0),
        fmt.Record(1, 5000, 8192, 1000, 1000, 7, fmt.RECORD_RAW),
        fmt.Record(2, 0, 4096, 0, 256 * 1024, 0, fmt.RECORD_ZEROS),
    ]
    accepted = 0
    for record in records:
        for value in _mutations(fmt.encode_record(record), rng):
            for codec in (fmt.COMPRESSION_LZ4, fmt.COMPRESSION_NONE):
                got = NATIVE.decode_record(
                    fmt.Record, record.shard, record.offset, value, config.record_size,
                    config.block_size, codec != fmt.COMPRESSION_NONE,
                )  # fmt: skip
                if got is not None:
                    accepted += 1
                    assert got == fmt.decode_record(
                        record.shard, record.offset, value, config, codec
                    )
    assert accepted > 50


def test_a_stale_build_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "_native.pyx"
    source.write_text("# another source\n")
    monkeypatch.setattr(native, "SOURCE", source)
    module, status = native._load()
    assert module is None and status.startswith("stale")


@needs_native
def test_the_checkout_build_is_current() -> None:
    # In a checkout the .pyx sits beside the build: an edit without `make install` fails here
    # (and the mount would run the Python path, with a warning) instead of testing old code.
    assert native.status == "compiled"


def test_the_compiled_path_can_be_turned_off() -> None:
    code = "from bundlefs.storage import native; print(native.module, native.status)"
    env = {**os.environ, native.DISABLE_ENV: "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("None turned off")


def _index_pages(path: Path) -> Iterator[tuple[int, bytes]]:
    data = (path / fmt.INDEX_DIR / fmt.INDEX_FILE).read_bytes()
    size = 4096
    for pgno in range(2, len(data) // size):
        yield pgno, data[pgno * size : (pgno + 1) * size]


def _python_page(page: bytes, pgno: int, last_pg: int) -> lp.TreePage | None:
    try:
        return lp.tree_page(page, pgno, last_pg)
    except (FormatError, struct.error):
        return None


@needs_native
def test_index_pages_decode_as_python_decodes_them(
    sample_bundle_path: Path, grafted_bundle_path: Path
) -> None:
    """Every page of real indexes; then damaged branch and leaf pages: what the compiled decode
    accepts, the Python one accepts and decodes the same (it declines the rest)."""
    assert NATIVE is not None
    rng = random.Random(24)
    decoded = accepted = 0
    for path in (sample_bundle_path, grafted_bundle_path):
        pages = list(_index_pages(path))
        last_pg = len(pages) + 1
        for pgno, page in pages:
            want = _python_page(page, pgno, last_pg)
            got = NATIVE.tree_page(lp.TreePage, page, pgno, last_pg)
            if want is not None and not want.values:  # the main database's: Python's alone
                decoded += 1
                assert got == want, pgno
            elif got is not None:
                assert got == want, pgno
            if want is None or want.values:
                continue
            for _ in range(60):
                damaged = bytearray(page)
                at = rng.choice((rng.randrange(16), rng.randrange(16, 64), rng.randrange(4096)))
                damaged[at] = rng.randrange(256)
                got = NATIVE.tree_page(lp.TreePage, bytes(damaged), pgno, last_pg)
                if got is not None:
                    accepted += 1
                    assert got == _python_page(bytes(damaged), pgno, last_pg), (pgno, at)
            assert NATIVE.tree_page(lp.TreePage, page[:15], pgno, last_pg) is None
    assert decoded > 4 and accepted > 10


@needs_native
def test_the_compiled_search_checks_every_page_it_reads(sample_bundle_path: Path) -> None:
    """Each probe's key is checked by the page guard unless its path's pages are sound."""
    assert NATIVE is not None
    with Bundle(sample_bundle_path) as b:
        index: IndexReader = b.tree._index
        root = index.entry(fmt.ROOT_INO)
        names = [name for _ino, name in index.iter_names(root.first_child, root.size)]
        db, txn = index._dbs[fmt.DB_ENTRIES], index._txn()
        sound = bytearray(len(index._pages._sound))  # no page sound: every probe checked
        data = (Path(index._pages.path)).read_bytes()
        paths = NATIVE.CheckedPaths(data, sound, 4096)
        _paths, pgno, depth = index._pages.route(db)
        checked: list[bytes] = []
        args = (paths, pgno, depth, db, root.first_child, root.size, names[-1], fmt.entry_name, 6)
        found = NATIVE.find_child(txn.get, lambda _db, key: checked.append(key), *args)
        assert found == root.first_child + len(names) - 1
        probes = len(checked)
        assert probes >= 1 and len(set(checked)) == probes
        sound[:] = b"\xff" * len(sound)  # every page sound: no more calls
        assert NATIVE.find_child(txn.get, lambda _db, key: checked.append(key), *args)
        assert len(checked) == probes


@needs_native
def test_the_compiled_descent_takes_the_branch_lmdb_takes(tmp_path: Path) -> None:
    """Over a three-level tree of keys that are prefixes of one another, ``CheckedPaths`` says
    a key's path is checked exactly when the pages the guard's walk reaches are sound."""
    import bisect

    import lmdb

    assert NATIVE is not None
    rng = random.Random(29)
    alphabet = [0x00, 0x01, 0x61, 0xFE, 0xFF]
    keys = {bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 14))) for _ in range(40_000)}
    with lmdb.open(str(tmp_path), map_size=1 << 28, max_dbs=2) as env:
        db = env.open_db(b"x")
        with env.begin(write=True) as txn:
            for key in keys:
                txn.put(key, b"v" * rng.randint(0, 40), db=db)
    data = (tmp_path / "data.mdb").read_bytes()
    pages = len(data) // 4096
    decoded: dict[int, lp.TreePage] = {}

    def page(pgno: int) -> lp.TreePage:
        if pgno not in decoded:
            decoded[pgno] = lp.tree_page(data[pgno * 4096 : (pgno + 1) * 4096], pgno, pages - 1)
        return decoded[pgno]

    metas = [lp.meta_main_root(data[n * 4096 : (n + 1) * 4096], pages - 1) for n in (0, 1)]
    main = max(metas, key=lambda m: m[0])[2]
    mains = lp.tree_page(
        data[main.root * 4096 : (main.root + 1) * 4096], main.root, pages, main=True
    )
    root = lp.database_roots(mains, pages - 1)[b"x"]
    assert root.depth >= 3

    def path(key: bytes) -> list[int]:
        found, pgno = [root.root], root.root
        while not page(pgno).leaf:
            tree = page(pgno)
            pgno = tree.children[bisect.bisect_right(tree.keys, key, 1) - 1]
            found.append(pgno)
        return found

    def bits(on: list[int], off: list[int], default: int) -> bytearray:
        sound = bytearray([default]) * ((pages + 7) // 8)
        for pgno in on:
            sound[pgno >> 3] |= 1 << (pgno & 7)
        for pgno in off:
            sound[pgno >> 3] &= ~(1 << (pgno & 7)) & 0xFF
        return sound

    sample = rng.sample(sorted(keys), 2_000)
    queries = sample + [k[:-1] for k in sample] + [k + b"\0" for k in sample] + [b"", b"\xff" * 20]
    for key in queries:
        walked = path(key)
        assert NATIVE.CheckedPaths(data, bits(walked, [], 0), 4096).checked(
            root.root, root.depth, key
        ), key
        for unchecked in walked:  # any page of the path not sound: not checked
            assert not NATIVE.CheckedPaths(data, bits([], [unchecked], 0xFF), 4096).checked(
                root.root, root.depth, key
            ), (key, unchecked)
