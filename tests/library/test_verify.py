"""``verify``: reads everything, keeps going after damage, names every damaged file, never raises
for damage (only for a directory that is not a bundle at all)."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from bundlefs import Bundle, NotABundleError, PackOptions, pack
from bundlefs.core.format import MARKER_NAME, shard_filename
from bundlefs.read.verify import verify
from tests.conftest import flip_byte, pseudo_random_bytes
from tests.support.trees import assert_one_line_error, build_rich_tree, run_cli

RECORD = 16 * 1024


@pytest.fixture(scope="module")
def intact(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("verify")
    src = build_rich_tree(base / "src")
    bundle = base / "rich.bundle"
    pack(str(src), str(bundle), PackOptions(record_size=RECORD))
    return bundle


@pytest.fixture
def fresh(intact, tmp_path):
    """A private copy of the intact bundle that the test may damage."""
    copy = tmp_path / "copy.bundle"
    shutil.copytree(intact, copy)
    return copy


def _pack_files(tmp_path, files: dict[str, bytes], **options):
    src = tmp_path / "src"
    src.mkdir()
    for name, data in files.items():
        (src / name).write_bytes(data)
    pack(str(src), str(tmp_path / "b"), PackOptions(record_size=RECORD, **options))
    return tmp_path / "b"


def test_verify_of_an_intact_bundle_is_ok_and_counts_everything(intact):
    report = verify(intact)
    assert report.ok, report.problems
    assert report.damaged_files == []
    assert (report.files, report.symlinks, report.hardlinks) == (12, 4, 1)
    assert report.dirs == 6
    assert report.records > 0 and report.bytes_checked > 0


def test_cli_verify_of_an_intact_bundle_exits_0(intact):
    result = run_cli("verify", intact)
    assert result.returncode == 0, result.stderr
    assert b"OK" in result.stdout


def test_a_flipped_byte_in_a_shard_makes_cli_verify_exit_1_naming_the_file(tmp_path):
    bundle = _pack_files(tmp_path, {"a.bin": os.urandom(5000), "b.bin": os.urandom(50_000)})
    # a.bin is the first file: its bytes start right after the 4 KiB header block.
    flip_byte(bundle / shard_filename(0), 4096 + 100)
    result = run_cli("verify", bundle)
    assert result.returncode == 1
    assert b"a.bin" in result.stdout
    assert b"Traceback" not in result.stderr


def test_a_damaged_record_names_every_file_that_overlaps_it(tmp_path):
    files = {f"small-{i}.txt": f"file {i}\n".encode() * 20 for i in range(5)}
    bundle = _pack_files(tmp_path, files)  # all five share the first (compressed) record
    flip_byte(bundle / shard_filename(0), 4096 + 5)
    report = verify(bundle)
    assert not report.ok
    assert report.damaged_files == sorted(files)


def test_damage_is_local_other_files_are_not_named(tmp_path):
    files = {"first.bin": os.urandom(3 * RECORD), "second.bin": os.urandom(3 * RECORD)}
    bundle = _pack_files(tmp_path, files)
    flip_byte(bundle / shard_filename(0), 4096 + RECORD + 7)  # the second record of first.bin
    assert verify(bundle).damaged_files == ["first.bin"]


def test_a_damaged_hard_linked_file_is_named_by_all_its_names(fresh):
    # The rich tree's "shared" and "a/b/shared-too" are one inode; find where its bytes live.
    from bundlefs import Bundle

    with Bundle(fresh) as b:
        entry = b.resolve("shared")
        record = b.content.record_at(entry.shard, entry.offset)
    flip_byte(fresh / shard_filename(entry.shard), record.stored_offset)
    report = verify(fresh)
    assert {"shared", "a/b/shared-too"} <= set(report.damaged_files)


def test_a_truncated_shard_is_reported_without_raising(fresh):
    shard = fresh / shard_filename(0)
    os.truncate(shard, 8192)
    report = verify(fresh)
    assert not report.ok
    assert any(p.kind == "shard" for p in report.problems)
    assert "a/multi.bin" in report.damaged_files


def test_a_damaged_index_is_a_problem_not_a_crash(fresh):
    index = fresh / "index" / "data.mdb"
    flip_byte(index, os.path.getsize(index) // 2)
    report = verify(fresh)
    assert not report.ok
    # Version 6: the page is named first, then what lies behind it (docs/format.md §3.10).
    assert report.problems[0].kind == "index" and "fails its checksum" in report.problems[0].message


def test_a_shard_from_another_bundle_is_reported(fresh, tmp_path):
    other = _pack_files(tmp_path, {"x": b"x"})
    shutil.copyfile(other / shard_filename(0), fresh / shard_filename(0))
    report = verify(fresh)
    assert any("header" in p.message for p in report.problems)


def test_verify_of_a_directory_without_a_marker_raises_not_a_bundle(fresh):
    os.unlink(fresh / MARKER_NAME)
    with pytest.raises(NotABundleError):
        verify(fresh)


def test_cli_verify_of_a_non_bundle_is_one_line(tmp_path):
    assert_one_line_error(run_cli("verify", tmp_path))


def test_an_unreadable_shard_descriptor_is_reported_for_its_shard_alone(tmp_path):
    from bundlefs.core import format as fmt
    from tests.support.hostile import forge

    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"f{i}").write_bytes(os.urandom(40_000))
    bundle = tmp_path / "b"
    pack(str(src), str(bundle), PackOptions(record_size=4096, shard_size=48 * 1024))
    assert len(list(bundle.glob("shard-*"))) >= 2
    forge(str(bundle), {(fmt.DB_SHARDS, fmt.shard_key(1)): b"bad"})
    report = verify(bundle)
    assert not report.ok
    shard_problems = {p.shard for p in report.problems if p.kind == "shard"}
    assert shard_problems == {1}, [str(p) for p in report.problems]


# -- damage noticed early, reported short (issue 22) -----------------------------------------------


@pytest.fixture
def truncated(tmp_path):
    """A bundle of 300 files in 2 shards whose first shard lost its last quarter."""
    src = tmp_path / "src"
    for d in range(3):
        (src / f"d{d}").mkdir(parents=True)
        for i in range(100):
            (src / f"d{d}" / f"f{i:03}").write_bytes(pseudo_random_bytes(3000, d * 1000 + i))
    bundle = tmp_path / "t.bundle"
    pack(str(src), str(bundle), PackOptions(record_size=RECORD, shard_size=600_000))
    assert len(list(bundle.glob("shard-*"))) == 2
    shard = bundle / shard_filename(0)
    size = shard.stat().st_size
    os.truncate(shard, size * 3 // 4)
    return bundle, size, size * 3 // 4


def test_opening_a_bundle_names_a_truncated_shard(truncated):
    bundle, size, now = truncated
    with Bundle(bundle) as b:
        [damage] = b.damaged_shards
        assert (damage.shard, damage.expected, damage.actual) == (0, size, now)
        assert str(damage) == (
            f"shard 0 ({shard_filename(0)}) is {size - now:,} bytes short: {now:,} of the "
            f"{size:,} its table entry says (truncated?)"
        )


def test_opening_an_intact_bundle_finds_no_damaged_shard(intact):
    with Bundle(intact) as b:
        assert b.damaged_shards == []


def test_info_warns_of_a_truncated_shard_and_lists_it_in_json(truncated):
    bundle, _size, _now = truncated
    result = run_cli("info", bundle)
    assert result.returncode == 0
    [line] = result.stderr.decode().splitlines()
    assert line.startswith(f"bundlefs: warning: {bundle}: shard 0 ({shard_filename(0)}) is ")
    assert line.endswith(f"('bundlefs verify {bundle}' names them)")
    facts = json.loads(run_cli("info", "--json", bundle).stdout)
    assert [d["shard"] for d in facts["damaged_shards"]] == [0]


def test_verify_summarises_a_truncated_shard_first_and_briefly(truncated):
    bundle, size, now = truncated
    result = run_cli("verify", bundle)
    assert result.returncode == 1
    lines = result.stdout.decode().splitlines()
    assert len(lines) <= 12, lines
    assert lines[1:3] == [
        "shard 0:",
        "  1 shard problem:",
    ]
    assert lines[3].startswith(f"    shard 0 ({shard_filename(0)}) is {size - now:,} bytes short")
    assert (
        lines[-1]
        == f"'bundlefs verify --list {bundle}' prints every problem and every damaged file"
    )
    # Positions cited are in the file the index describes, never past its indexed size.
    for position in re.findall(r"stored at byte ([0-9,]+)", result.stdout.decode()):
        assert int(position.replace(",", "")) < size
    assert result.stderr.decode().startswith(f"bundlefs: error: {bundle} is damaged: ")


def test_verify_list_prints_every_damaged_file_and_json_the_whole_report(truncated):
    bundle, _size, _now = truncated
    report = verify(bundle)
    listed = run_cli("verify", "--list", bundle).stdout.decode().splitlines()
    assert set(report.damaged_files) <= {line.strip() for line in listed}
    facts = json.loads(run_cli("verify", "--json", bundle).stdout)
    assert facts["damaged_files"] == report.damaged_files
    assert len(facts["problems"]) == len(report.problems)


def test_verify_bytes_checked_is_infos_stored_bytes_and_never_more(intact, truncated):
    info = json.loads(run_cli("info", "--json", intact).stdout)
    report = verify(intact)
    assert report.bytes_checked == report.stored_bytes == info["stored_bytes"]
    assert report.index_bytes == info["index_bytes"]
    damaged = verify(truncated[0])
    assert 0 < damaged.bytes_checked < damaged.stored_bytes


# --- verify --shard: some shards only (incremental transfers) --------------------------------


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory):
    """Twelve incompressible 40 KB files in shards of about 64 KiB: one file a shard or two."""
    base = tmp_path_factory.mktemp("sharded")
    src = base / "src"
    src.mkdir()
    for i in range(12):
        (src / f"f{i:02}.bin").write_bytes(pseudo_random_bytes(40_000, seed=i, compressible=False))
    bundle = base / "b.bundle"
    pack(str(src), str(bundle), PackOptions(record_size=RECORD, shard_size=64 * 1024))
    return bundle


def _files_by_shard(bundle) -> dict[int, set[str]]:
    with Bundle(bundle) as b:
        where: dict[int, set[str]] = {}
        for path in b:
            where.setdefault(b.resolve(path).shard, set()).add(path)
        return where


def test_verify_of_some_shards_checks_only_them_and_their_files(sharded):
    where = _files_by_shard(sharded)
    assert len(where) >= 4
    whole = verify(sharded)
    some = verify(sharded, shards=[1, 2])
    assert some.ok and some.shards_checked == [1, 2] and whole.shards_checked is None
    assert some.files_checked == len(where[1] | where[2]) < whole.files_checked == 12
    assert 0 < some.records < whole.records
    assert 0 < some.bytes_checked == some.stored_bytes < whole.stored_bytes


def test_damage_in_a_shard_not_checked_is_not_seen_and_in_one_checked_is(sharded, tmp_path):
    copy = tmp_path / "copy.bundle"
    shutil.copytree(sharded, copy)
    where = _files_by_shard(copy)
    flip_byte(copy / shard_filename(0), 4096 + 100)
    os.remove(copy / shard_filename(3))  # not transferred yet
    assert verify(copy, shards=[1, 2]).ok
    damaged = verify(copy, shards=[0, 1])
    assert set(damaged.damaged_files) == {sorted(where[0])[0]}
    assert {p.shard for p in damaged.problems} == {0}
    missing = verify(copy, shards=[3])
    assert set(missing.damaged_files) == where[3]


def test_a_shard_the_bundle_lacks_is_refused(sharded):
    from bundlefs.read.verify import UnknownShard

    with pytest.raises(UnknownShard, match="no shard 99"):
        verify(sharded, shards=[0, 99])


def test_cli_verify_shard_takes_numbers_and_ranges_and_says_what_it_checked(sharded, tmp_path):
    result = run_cli("verify", "--shard", "1-2", "--shard", "0", sharded)
    assert result.returncode == 0, result.stderr
    first = result.stdout.decode().splitlines()[0]
    assert first.startswith("checked shards 0-2 of ")
    report = json.loads(run_cli("verify", "--json", "--shard", "2,0", sharded).stdout)
    assert report["shards_checked"] == [0, 2] and report["ok"]
    copy = tmp_path / "copy.bundle"
    shutil.copytree(sharded, copy)
    flip_byte(copy / shard_filename(1), 4096 + 100)
    assert run_cli("verify", "--shard", "0", copy).returncode == 0
    assert run_cli("verify", "--shard", "1", copy).returncode == 1
    for bad in ("x", "3-1", "-1"):
        assert run_cli("verify", "--shard", bad, sharded).returncode == 2
    refused = run_cli("verify", "--shard", "99", sharded)
    assert "no shard 99" in assert_one_line_error(refused, status=2)
