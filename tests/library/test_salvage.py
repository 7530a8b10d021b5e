"""Reading past damage on real damaged bundles: salvage (a damaged file's good records, its lost
ranges named), ``extract(salvage=True)`` leaving holes, and ``iter_files`` streaming on past a
damaged file (``on_error``) — while the default stays "fail loudly"."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bundlefs import Bundle, CorruptDataError, PackOptions, pack
from bundlefs.read import salvage
from bundlefs.read.extract import ExtractSummary, extract
from bundlefs.read.salvage import LostRange, salvage_content, summary_line, write_map
from tests.conftest import HardLink, build_tree, flip_byte, pseudo_random_bytes
from tests.support.hostile import entry_put, forge, version_of

RECORD = 4096
NINE = pseudo_random_bytes(9 * RECORD, seed=9)  # records 0–8 of the shard
BYSTANDER = pseudo_random_bytes(3000, seed=10)
SHARD = "shard-00000000"


@pytest.fixture(scope="module", params=["lz4", "none"])
def nine_record_bundle(request, tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = build_tree(tmp_path_factory.mktemp("salvage") / "src", {"a-nine": NINE, "b": BYSTANDER})
    dest = src.parent / f"{request.param}.bundle"
    pack(str(src), str(dest), PackOptions(record_size=RECORD, compression=request.param))
    return dest


def _damage_records(bundle: Path, *indexes: int) -> None:
    """Flip a byte in each of the nine-record file's records ``indexes``."""
    with Bundle(bundle) as b:
        entry = b.resolve("a-nine")
        records = [b.content.record_at(entry.shard, entry.offset + i * RECORD) for i in indexes]
    for record in records:
        flip_byte(bundle / SHARD, record.stored_offset + 3)


def _salvage(bundle: Path, path: str = "a-nine") -> tuple[bytes, list[LostRange]]:
    """The salvaged bytes (zeros for lost ranges) and the lost ranges."""
    out, lost = bytearray(), []
    with Bundle(bundle) as b:
        for piece in salvage_content(b.content, b.resolve(path), path):
            if isinstance(piece, LostRange):
                assert piece.offset == len(out)
                lost.append(piece)
                out += bytes(piece.length)
            else:
                out += piece
    return bytes(out), lost


def test_one_bad_record_of_nine_loses_that_record_only(nine_record_bundle, copy_bundle) -> None:
    bundle = copy_bundle(nine_record_bundle)
    _damage_records(bundle, 4)
    with Bundle(bundle) as b, pytest.raises(CorruptDataError):
        b.read("a-nine")  # the default read still fails loudly
    data, lost = _salvage(bundle)
    assert [(r.path, r.offset, r.length) for r in lost] == [("a-nine", 4 * RECORD, RECORD)]
    assert "fails its checksum" in lost[0].reason and "shard 0" in lost[0].reason
    bad = slice(4 * RECORD, 5 * RECORD)
    assert data[: bad.start] == NINE[: bad.start] and data[bad.stop :] == NINE[bad.stop :]
    assert data[bad] == bytes(RECORD)  # 8 of 9 records' bytes recovered, the ninth named
    assert _salvage(bundle, "b") == (BYSTANDER, [])


def test_a_large_file_is_salvaged_chunk_by_chunk(nine_record_bundle, copy_bundle, monkeypatch):
    # A file over the whole-read limit is read a chunk at a time; only a failing chunk is read
    # again record by record (the limits made small, so the nine-record file is "large").
    monkeypatch.setattr(salvage, "WHOLE_READ_LIMIT", 0)
    monkeypatch.setattr(salvage, "_CHUNK", 2 * RECORD)
    bundle = copy_bundle(nine_record_bundle)
    _damage_records(bundle, 4, 8)
    data, lost = _salvage(bundle)
    assert [(r.offset, r.length) for r in lost] == [(4 * RECORD, RECORD), (8 * RECORD, RECORD)]
    assert data[: 4 * RECORD] == NINE[: 4 * RECORD]
    assert data[5 * RECORD : 8 * RECORD] == NINE[5 * RECORD : 8 * RECORD]
    assert _salvage(nine_record_bundle) == (NINE, [])


def test_an_undamaged_file_salvages_whole_with_nothing_lost(nine_record_bundle) -> None:
    assert _salvage(nine_record_bundle) == (NINE, [])


def test_neighbouring_bad_records_are_one_lost_range(nine_record_bundle, copy_bundle) -> None:
    bundle = copy_bundle(nine_record_bundle)
    _damage_records(bundle, 0, 5, 6)
    data, lost = _salvage(bundle)
    assert [(r.offset, r.length) for r in lost] == [(0, RECORD), (5 * RECORD, 2 * RECORD)]
    assert data[RECORD : 5 * RECORD] == NINE[RECORD : 5 * RECORD]
    assert data[7 * RECORD :] == NINE[7 * RECORD :]


def test_a_truncated_shard_loses_the_missing_records_only(nine_record_bundle, copy_bundle) -> None:
    bundle = copy_bundle(nine_record_bundle)
    with Bundle(bundle) as b:
        entry = b.resolve("a-nine")
        cut = b.content.record_at(entry.shard, entry.offset + 6 * RECORD).stored_offset
    os.truncate(bundle / SHARD, cut + 10)
    data, lost = _salvage(bundle)
    assert [(r.offset, r.length) for r in lost] == [(6 * RECORD, 3 * RECORD)]
    assert data[: 6 * RECORD] == NINE[: 6 * RECORD]
    assert [(r.path, r.offset, r.length) for r in _salvage(bundle, "b")[1]] == [
        ("b", 0, len(BYSTANDER))
    ]


def _extract_damaged(
    bundle: Path, records: list[int], tmp_path: Path, paths=(), **options
) -> ExtractSummary:
    """Damage the nine-record file's ``records``, then extract into ``tmp_path/out``."""
    _damage_records(bundle, *records)
    with Bundle(bundle) as b:
        return extract(b, tmp_path / "out", paths, **options)


def test_extract_salvage_leaves_a_hole_where_the_record_was(
    nine_record_bundle, copy_bundle, tmp_path
) -> None:
    summary = _extract_damaged(copy_bundle(nine_record_bundle), [4], tmp_path, salvage=True)
    assert not summary.ok and summary.damaged == [] and summary.files == 2
    assert [(r.path, r.offset, r.length) for r in summary.lost] == [("a-nine", 4 * RECORD, RECORD)]
    got = (tmp_path / "out" / "a-nine").read_bytes()
    assert got == NINE[: 4 * RECORD] + bytes(RECORD) + NINE[5 * RECORD :]
    assert (tmp_path / "out" / "b").read_bytes() == BYSTANDER
    with open(tmp_path / "out" / "a-nine", "rb") as f:  # a hole, not written zeros
        assert os.lseek(f.fileno(), 4 * RECORD, os.SEEK_DATA) == 5 * RECORD


def test_extract_without_salvage_still_leaves_a_damaged_file_out(
    nine_record_bundle, copy_bundle, tmp_path
) -> None:
    summary = _extract_damaged(copy_bundle(nine_record_bundle), [4], tmp_path)
    assert summary.damaged == ["a-nine"] and summary.lost == []
    assert os.listdir(tmp_path / "out") == ["b"]


def test_a_damaged_last_record_leaves_a_hole_at_the_end(
    nine_record_bundle, copy_bundle, tmp_path
) -> None:
    _extract_damaged(copy_bundle(nine_record_bundle), [8], tmp_path, ["a-nine"], salvage=True)
    assert (tmp_path / "out" / "a-nine").read_bytes() == NINE[: 8 * RECORD] + bytes(RECORD)


def test_a_file_whose_records_pass_but_whose_checksum_fails_is_not_salvaged(
    nine_record_bundle, copy_bundle, tmp_path
) -> None:
    # Only a forged index does this: no record is bad, so no range can be named.
    bundle = copy_bundle(nine_record_bundle)
    with Bundle(bundle) as b:
        entry = b.resolve("a-nine")
    forge(bundle, entry_put(entry, version=version_of(bundle), crc32c=entry.crc32c ^ 1))
    with pytest.raises(CorruptDataError, match="each of its records passes"):
        _salvage(bundle)
    with Bundle(bundle) as b:
        summary = extract(b, tmp_path / "out", salvage=True)
    assert summary.damaged == ["a-nine"] and summary.lost == []
    assert os.listdir(tmp_path / "out") == ["b"]


def test_the_map_names_each_lost_range_a_line(tmp_path) -> None:
    lost = [LostRange("a\tb\nc", 4096, 4096, "x"), LostRange("d", 0, 1, "y")]
    write_map(tmp_path / "map", "B", lost)
    lines = (tmp_path / "map").read_bytes().splitlines()
    assert all(line.startswith(b"#") for line in lines[:3])
    assert lines[3:] == [b"0x00001000\t0x00001000\ta\\tb\\nc", b"0x00000000\t0x00000001\td"]
    assert summary_line(lost, 5) == "salvage: lost 4097 bytes in 2 ranges of 2 of 5 files"
    assert summary_line([], 5) == "salvage: nothing was lost"


# --- iter_files past damage ----------------------------------------------------------------------

MANY = {f"f{i:02}": pseudo_random_bytes(RECORD, seed=i) for i in range(56)}


@pytest.fixture(scope="module")
def many_files_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = dict(MANY, **{"z-link": HardLink("f00")})
    src = build_tree(tmp_path_factory.mktemp("many") / "src", spec)
    dest = src.parent / "many.bundle"
    pack(str(src), str(dest), PackOptions(record_size=RECORD))
    return dest


def _damage_file(bundle: Path, path: str) -> None:
    with Bundle(bundle) as b:
        entry = b.resolve(path)
        record = b.content.record_at(entry.shard, entry.offset)
    flip_byte(bundle / SHARD, record.stored_offset + 3)


def test_iter_files_raises_at_a_damaged_file_by_default(many_files_bundle, copy_bundle) -> None:
    bundle = copy_bundle(many_files_bundle)
    _damage_file(bundle, "f00")
    with Bundle(bundle) as b, pytest.raises(CorruptDataError, match="f00"):
        list(b.iter_files())


def test_iter_files_skip_streams_every_undamaged_file(many_files_bundle, copy_bundle) -> None:
    bundle = copy_bundle(many_files_bundle)
    _damage_file(bundle, "f00")  # stored first: today the other 55 files never stream
    with Bundle(bundle) as b:
        got = dict(b.iter_files(on_error="skip"))
    assert got == {k: v for k, v in MANY.items() if k != "f00"}


def test_iter_files_on_error_callable_hears_each_name_and_may_stop(
    many_files_bundle, copy_bundle
) -> None:
    bundle = copy_bundle(many_files_bundle)
    _damage_file(bundle, "f00")
    heard: list[tuple[str, CorruptDataError]] = []
    with Bundle(bundle) as b:
        got = [p for p, _d in b.iter_files(on_error=lambda p, e: heard.append((p, e)))]

        def stop(path: str, error: CorruptDataError) -> None:
            raise RuntimeError(path)

        with pytest.raises(RuntimeError, match="f00"):
            list(b.iter_files(on_error=stop))
        with pytest.raises(ValueError, match="on_error"):
            list(b.iter_files(on_error="ignore"))  # type: ignore[call-overload]
    assert [p for p, _e in heard] == ["f00", "z-link"]  # the hard link's name too
    assert all(isinstance(e, CorruptDataError) for _p, e in heard)
    assert len(got) == 55 and "f00" not in got
