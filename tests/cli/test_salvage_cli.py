"""``extract --salvage`` and ``cat --salvage`` on a really damaged bundle: the good records are
written, the lost ranges named (a map, stderr), exit status 1; the defaults still fail loudly."""

from __future__ import annotations

import pytest

from bundlefs import Bundle, PackOptions, pack
from tests.conftest import build_tree, flip_byte, pseudo_random_bytes
from tests.support.trees import assert_one_line_error, run_cli

RECORD = 4096
NINE = pseudo_random_bytes(9 * RECORD, seed=9)
OTHER = b"undamaged\n"


@pytest.fixture
def damaged(tmp_path):
    """A bundle whose nine-record file ``a-nine`` has its fifth record (bytes 16384–20479)
    damaged."""
    src = build_tree(tmp_path / "src", {"a-nine": NINE, "b.txt": OTHER})
    bundle = tmp_path / "b.bundle"
    pack(str(src), str(bundle), PackOptions(record_size=RECORD))
    with Bundle(bundle) as b:
        entry = b.resolve("a-nine")
        record = b.content.record_at(entry.shard, entry.offset + 4 * RECORD)
    flip_byte(bundle / "shard-00000000", record.stored_offset + 3)
    return bundle


SALVAGED = NINE[: 4 * RECORD] + bytes(RECORD) + NINE[5 * RECORD :]


def test_extract_salvage_writes_the_good_records_and_a_map(damaged, tmp_path) -> None:
    dest = tmp_path / "out"
    result = run_cli("extract", "--salvage", damaged, dest)
    err = result.stderr.decode()
    assert result.returncode == 1, err
    assert (dest / "a-nine").read_bytes() == SALVAGED
    assert (dest / "b.txt").read_bytes() == OTHER
    map_file = tmp_path / "out.salvage-map"
    assert "salvage: lost 4096 bytes in 1 range of 1 of 2 files" in err and str(map_file) in err
    lines = [ln for ln in map_file.read_text().splitlines() if not ln.startswith("#")]
    assert lines == ["0x00004000\t0x00001000\ta-nine"]


def test_extract_salvage_map_goes_where_it_is_told(damaged, tmp_path) -> None:
    result = run_cli(
        "extract",
        "-q",
        "--salvage",
        "--salvage-map",
        tmp_path / "lost.map",
        damaged,
        tmp_path / "o",
    )
    assert result.returncode == 1
    assert "a-nine" in (tmp_path / "lost.map").read_text()


def test_extract_salvage_of_an_intact_bundle_loses_nothing(tmp_path) -> None:
    src = build_tree(tmp_path / "src", {"b.txt": OTHER})
    pack(str(src), str(tmp_path / "b.bundle"))
    result = run_cli("extract", "--salvage", tmp_path / "b.bundle", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert b"salvage: nothing was lost" in result.stdout
    assert (tmp_path / "out.salvage-map").read_text().count("\n0x") == 0


def test_extract_without_salvage_leaves_the_damaged_file_out(damaged, tmp_path) -> None:
    result = run_cli("extract", damaged, tmp_path / "out")
    assert result.returncode == 1
    assert b"a-nine was not extracted" in result.stderr
    assert not (tmp_path / "out" / "a-nine").exists()


def test_cat_salvage_writes_zeros_for_the_lost_range_and_names_it(damaged) -> None:
    result = run_cli("cat", "--salvage", damaged, "a-nine", "b.txt")
    assert result.returncode == 1
    assert result.stdout == SALVAGED + OTHER
    err = result.stderr.decode()
    assert "a-nine: lost 4096 bytes at offset 16384 (through 20479)" in err
    assert len(err.strip().splitlines()) == 1


def test_cat_without_salvage_writes_nothing_of_the_damaged_file(damaged) -> None:
    result = run_cli("cat", damaged, "a-nine")
    assert result.returncode == 1 and result.stdout == b""


def test_a_salvage_map_without_salvage_is_a_usage_error(damaged, tmp_path) -> None:
    result = run_cli("extract", "--salvage-map", tmp_path / "m", damaged, tmp_path / "out")
    assert "give --salvage too" in assert_one_line_error(result, 2)
    assert not (tmp_path / "out").exists()
