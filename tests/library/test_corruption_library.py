"""Damaged bundles through the library: corruption raises a specific error naming what is damaged,
never wrong bytes, and leaves undamaged files readable. (Hostile and fuzzed bundles: test_fuzz.)"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from bundlefs import (
    Bundle,
    CorruptDataError,
    FormatError,
    IncompleteBundleError,
    NotABundleError,
    PackOptions,
    pack,
)
from bundlefs.core import format as fmt
from bundlefs.read.verify import verify
from tests.conftest import build_tree, flip_byte, pseudo_random_bytes

RECORD = 4096
# Sizes are record multiples, so each file has records of its own:
# a-victim = records 0–1, b-bystander = records 2–3, c-last = record 4 (the shard's last).
SPEC = {
    "a-victim": pseudo_random_bytes(2 * RECORD, seed=1),
    "b-bystander": pseudo_random_bytes(2 * RECORD, seed=2),
    "c-last": pseudo_random_bytes(100, seed=3),
}


def _pack(tmp_path_factory: pytest.TempPathFactory, compression: str) -> Path:
    src = build_tree(tmp_path_factory.mktemp("corrupt") / "src", SPEC)
    dest = src.parent / f"{compression}.bundle"
    pack(str(src), str(dest), PackOptions(record_size=RECORD, compression=compression))
    return dest


@pytest.fixture(scope="module")
def lz4_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _pack(tmp_path_factory, "lz4")


@pytest.fixture(scope="module")
def raw_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _pack(tmp_path_factory, "none")


SHARD = "shard-00000000"


def _record_of(bundle: Path, path: str, offset_in_file: int = 0) -> fmt.Record:
    with Bundle(bundle) as b:
        entry = b.resolve(path)
        return b.content.record_at(entry.shard, entry.offset + offset_in_file)


# --- damaged shard data ---------------------------------------------------------------------------


def test_flipped_byte_in_a_shard_makes_read_raise_naming_the_file(lz4_bundle, copy_bundle) -> None:
    bundle = copy_bundle(lz4_bundle)
    record = _record_of(bundle, "a-victim")
    assert record.flags == 0  # lz4: the record CRC is what catches it
    flip_byte(bundle / SHARD, record.stored_offset + 3)
    with Bundle(bundle) as b, pytest.raises(CorruptDataError) as caught:
        b.read("a-victim")
    e = caught.value
    assert "a-victim" in str(e)
    assert str(bundle) in str(e)
    assert (e.path, e.shard, e.record) == ("a-victim", 0, record.offset)


def test_other_records_still_read_after_a_flipped_byte(lz4_bundle, copy_bundle) -> None:
    bundle = copy_bundle(lz4_bundle)
    flip_byte(bundle / SHARD, _record_of(bundle, "a-victim").stored_offset + 3)
    with Bundle(bundle) as b:
        with pytest.raises(CorruptDataError):
            b.read("a-victim")
        assert b.read("b-bystander") == SPEC["b-bystander"]
        assert b.read("c-last") == SPEC["c-last"]
        # The undamaged second record of the victim itself is still readable on its own.
        with b.open("a-victim") as f:
            f.seek(RECORD)
            assert f.read(RECORD) == SPEC["a-victim"][RECORD:]


def test_partial_read_of_a_damaged_record_raises(lz4_bundle, copy_bundle) -> None:
    bundle = copy_bundle(lz4_bundle)
    flip_byte(bundle / SHARD, _record_of(bundle, "a-victim").stored_offset + 3)
    with Bundle(bundle) as b, b.open("a-victim") as f:
        f.seek(10)
        with pytest.raises(CorruptDataError, match="a-victim"):
            f.read(5)


def test_corruption_is_reported_again_on_every_read(lz4_bundle, copy_bundle) -> None:
    bundle = copy_bundle(lz4_bundle)
    flip_byte(bundle / SHARD, _record_of(bundle, "a-victim").stored_offset + 3)
    with Bundle(bundle) as b:
        for _ in range(3):
            with pytest.raises(CorruptDataError):
                b.read("a-victim")


@pytest.mark.parametrize("whole", [True, False], ids=["whole-file", "range"])
def test_flipped_byte_in_a_raw_record_is_caught(raw_bundle, copy_bundle, whole: bool) -> None:
    # A whole-file read of a RAW record skips the record CRC and relies on the file CRC; a range
    # read relies on the record CRC. Both must catch the damage.
    bundle = copy_bundle(raw_bundle)
    record = _record_of(bundle, "b-bystander")
    assert record.flags == fmt.RECORD_RAW
    flip_byte(bundle / SHARD, record.stored_offset + 100)
    with Bundle(bundle) as b, pytest.raises(CorruptDataError, match="b-bystander"):
        if whole:
            b.read("b-bystander")
        else:
            with b.open("b-bystander") as f:
                f.seek(50)
                f.read(100)


@pytest.mark.parametrize("damaged", [0, 1], ids=["first-record", "second-record"])
def test_a_read_of_whole_raw_records_checks_each_record(raw_bundle, copy_bundle, damaged) -> None:
    # A range read that covers whole RAW records reads them straight into its buffer, uncached:
    # each record's own CRC must still catch damage, and the bystander's bytes stay right.
    bundle = copy_bundle(raw_bundle)
    record = _record_of(bundle, "a-victim", damaged * RECORD)
    flip_byte(bundle / SHARD, record.stored_offset + 7)
    with Bundle(bundle) as b:
        entry = b.resolve("a-victim")
        with pytest.raises(CorruptDataError, match="a-victim"):
            b.content.read_at(
                entry, 0, 2 * RECORD - 1
            )  # not the whole file: the record CRCs decide
        bystander = b.resolve("b-bystander")
        assert (
            b.content.read_at(bystander, 0, 2 * RECORD - 1) == SPEC["b-bystander"][: 2 * RECORD - 1]
        )
        assert b.cache.stats().entries <= 2  # the covered records were not cached


def test_a_shard_header_with_another_version_is_damage_not_a_version_error(
    lz4_bundle, copy_bundle
) -> None:
    # The bundle opened, so a shard header that disagrees with it is damage to that shard: a
    # CorruptDataError per file (which extract and the mount handle per file), found by make fuzz.
    bundle = copy_bundle(lz4_bundle)
    flip_byte(bundle / SHARD, 8)
    with Bundle(bundle) as b, pytest.raises(CorruptDataError, match="a-victim"):
        b.read("a-victim")


def test_flipped_byte_in_padding_harms_nothing(lz4_bundle, copy_bundle) -> None:
    bundle = copy_bundle(lz4_bundle)
    record = _record_of(bundle, "c-last")
    flip_byte(bundle / SHARD, record.stored_offset + record.stored_length)  # first padding byte
    with Bundle(bundle) as b:
        assert b.read("c-last") == SPEC["c-last"]


def test_truncated_shard_raises_for_the_lost_records_only(lz4_bundle, copy_bundle) -> None:
    bundle = copy_bundle(lz4_bundle)
    last = _record_of(bundle, "c-last")
    os.truncate(bundle / SHARD, last.stored_offset + last.stored_length // 2)
    with Bundle(bundle) as b:
        with pytest.raises(CorruptDataError, match="c-last") as caught:
            b.read("c-last")
        assert "truncated" in str(caught.value)
        assert b.read("a-victim") == SPEC["a-victim"]
        assert b.read("b-bystander") == SPEC["b-bystander"]


def test_missing_shard_raises_on_read_not_on_open(lz4_bundle, copy_bundle) -> None:
    bundle = copy_bundle(lz4_bundle)
    os.unlink(bundle / SHARD)
    with Bundle(bundle) as b:
        assert b.listdir("") == sorted(SPEC)
        with pytest.raises(CorruptDataError, match="a-victim"):
            b.read("a-victim")


def test_shard_of_another_bundle_is_refused(lz4_bundle, raw_bundle, copy_bundle) -> None:
    bundle = copy_bundle(lz4_bundle)
    os.replace(copy_bundle(raw_bundle) / SHARD, bundle / SHARD)
    with Bundle(bundle) as b, pytest.raises(CorruptDataError, match="another bundle"):
        b.read("c-last")


# --- damaged index --------------------------------------------------------------------------------


def test_flipped_byte_in_the_index_is_refused_before_its_page_is_used(
    lz4_bundle, copy_bundle
) -> None:
    # Version 6 checks each index page before LMDB reads it (docs/format.md §3.10): the bundle
    # may open, but no byte built on the damaged page is served, and verify names the page.
    with Bundle(lz4_bundle) as b:
        expected = {path: b.read(path) for path in b.paths() if b.isfile(path)}
    assert expected
    bundle = copy_bundle(lz4_bundle)
    index = bundle / "index" / "data.mdb"
    flip_byte(index, index.stat().st_size // 2)
    with contextlib.suppress(FormatError), Bundle(bundle) as b:
        for path, data in expected.items():
            with contextlib.suppress(FormatError):
                assert b.read(path) == data
    report = verify(bundle)
    assert [p.message for p in report.problems if "fails its checksum" in p.message]


def test_truncated_index_is_refused_before_lmdb_maps_it(lz4_bundle, copy_bundle) -> None:
    bundle = copy_bundle(lz4_bundle)
    index = bundle / "index" / "data.mdb"
    os.truncate(index, index.stat().st_size - 4096)
    with pytest.raises(FormatError, match="truncated"):
        Bundle(bundle)


def test_missing_index_is_not_a_bundle(lz4_bundle, copy_bundle) -> None:
    bundle = copy_bundle(lz4_bundle)
    os.unlink(bundle / "index" / "data.mdb")
    with pytest.raises(NotABundleError):
        Bundle(bundle)


# --- damaged or missing completion marker ---------------------------------------------------------


def test_missing_marker_is_an_incomplete_bundle(lz4_bundle, copy_bundle) -> None:
    bundle = copy_bundle(lz4_bundle)
    os.unlink(bundle / "COMPLETE")
    with pytest.raises(IncompleteBundleError, match="incomplete"):
        Bundle(bundle)


@pytest.mark.parametrize("offset", [0, 9, 20, 35, 41, 45, 50])
def test_garbled_marker_is_not_a_bundle(lz4_bundle, copy_bundle, offset: int) -> None:
    bundle = copy_bundle(lz4_bundle)
    flip_byte(bundle / "COMPLETE", offset)
    with pytest.raises(NotABundleError):
        Bundle(bundle)


@pytest.mark.parametrize("length", [0, 51])
def test_truncated_marker_is_not_a_bundle(lz4_bundle, copy_bundle, length: int) -> None:
    bundle = copy_bundle(lz4_bundle)
    os.truncate(bundle / "COMPLETE", length)
    with pytest.raises(NotABundleError):
        Bundle(bundle)


def test_marker_of_another_bundle_is_refused(lz4_bundle, raw_bundle, copy_bundle) -> None:
    bundle = copy_bundle(lz4_bundle)
    (bundle / "COMPLETE").write_bytes((raw_bundle / "COMPLETE").read_bytes())
    with pytest.raises(FormatError):
        Bundle(bundle)


def test_empty_directory_is_not_a_bundle_and_not_incomplete(tmp_path: Path) -> None:
    with pytest.raises(NotABundleError) as caught:
        Bundle(tmp_path)
    assert not isinstance(caught.value, IncompleteBundleError)


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_path_that_is_not_a_directory_is_not_a_bundle(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x"
    if kind == "file":
        path.write_bytes(b"")
    with pytest.raises(NotABundleError):
        Bundle(path)
