"""``info --dead`` and ``compact``: the stored bytes no file uses, and a bundle without them.

Dead records are made the way generations make them: a tree is packed, then some of its files
change and a second bundle holding only those is merged over the first with ``--on-clash last``
(what a pack on a base does), so the first bundle's records of the replaced files are no file's.
Compaction must drop exactly those, keep every file identical, link the shards it keeps, copy
records without decompressing them, and publish nothing when killed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bundlefs import Bundle, CompactOptions, PackOptions, compact, pack
from bundlefs.core import format as fmt
from bundlefs.errors import NotABundleError, PackError
from bundlefs.packing.compact import plan
from bundlefs.packing.merge import MergeOptions, merge
from bundlefs.read.verify import verify
from bundlefs.storage.index import IndexReader
from bundlefs.storage.liveness import ShardLiveness, shard_liveness
from tests.support.pausing import interrupted, paused
from tests.support.trees import assert_one_line_error, build_rich_tree, diff_r, run_cli

DATA = Path(__file__).resolve().parents[1] / "data"
RECORD = 16 * 1024
SHARD = 256 * 1024


def _text(seed: int, size: int) -> bytes:
    """Compressible bytes, different for each seed."""
    line = b"line %d of a file that changes between generations\n" % seed
    return (line * (size // len(line) + 1))[:size]


def _write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def _generation(root: Path, base: Path, changes: dict[str, bytes], name: str, **options) -> Path:
    """``base`` with ``changes`` (path -> new bytes): their bundle merged over it, last wins."""
    changed = _write_tree(root / f"{name}.changes", changes)
    pack(str(changed), str(root / f"{name}.changes.bundle"), PackOptions(**options))
    out = root / f"{name}.bundle"
    merge([base, root / f"{name}.changes.bundle"], str(out), MergeOptions(on_clash="last"))
    return out


@pytest.fixture(scope="module")
def gens(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the source tree, the current tree on disk, the second generation's bundle): a tree of
    small and multi-record files in several shards, then a whole directory and a few scattered
    files changed."""
    root = tmp_path_factory.mktemp("compact")
    src = build_rich_tree(root / "src")
    files = {f"many/d{i % 5}/f{i:03d}.txt": _text(i, 500 + 97 * i) for i in range(200)}
    files.update({f"big/b{i}.bin": _text(1000 + i, 3 * RECORD + 1234 * i) for i in range(6)})
    _write_tree(src, files)
    options = {"record_size": RECORD, "shard_size": SHARD}
    pack(str(src), str(root / "old.bundle"), PackOptions(**options))
    changes = {
        rel: _text(5000 + n, len(data) // 2 + 10)
        for n, (rel, data) in enumerate(files.items())
        if rel.startswith("many/d1/") or rel.startswith("big/") or n % 17 == 0
    }
    gen2 = _generation(root, root / "old.bundle", changes, "gen2", **options)
    current = root / "current"
    shutil.copytree(src, current, symlinks=True)
    _write_tree(current, changes)
    return src, current, gen2


def _reference_dead_bytes(bundle: Path) -> int:
    """Dead bytes by the definition, counted naively: every record against every file."""
    reader = IndexReader(str(bundle))
    try:
        block = reader.config.block_size
        files = [
            e
            for e in reader.iter_entries(1, reader.config.entry_count)
            if e.is_file and not e.is_link and e.size
        ]
        dead = 0
        for shard in range(reader.config.shard_count):
            records = list(reader.iter_records(shard))
            live = [
                r
                for r in records
                if any(
                    f.shard == shard and f.offset < r.end and r.offset < f.offset + f.size
                    for f in files
                )
            ]
            size = reader.shard_info(shard).file_size
            used = block + sum(fmt.pad_to(r.stored_length, block) for r in live) if live else 0
            dead += size - used
        return dead
    finally:
        reader.close()


def _facts(bundle: Path) -> list[tuple]:
    """Every entry as the user sees it: path, its whole stat (owner, content type and user data
    included) and its content or target."""
    out = []
    with Bundle(bundle) as b:
        for path, entry in b.tree:
            if entry.is_dir:
                data = b""
            elif entry.is_symlink:
                data = os.fsencode(b.readlink(path))
            else:
                data = b.read(path)
            out.append((path, b.lstat(path), data))
    return out


# --- info --dead ----------------------------------------------------------------------------------


def test_info_counts_the_dead_bytes_a_naive_count_of_every_record_finds(gens) -> None:
    _src, _current, gen2 = gens
    with Bundle(gen2) as b:
        facts = b.info(dead=True)
    assert facts.liveness is not None
    assert facts.liveness.dead_bytes == _reference_dead_bytes(gen2) > 0
    assert facts.liveness.live_bytes + facts.liveness.dead_bytes == facts.shard_bytes


def test_dead_bytes_are_exactly_the_records_of_the_replaced_files(tmp_path) -> None:
    # Uncompressed 4 KiB records, files over the 1 MiB large-file threshold (each starts its own
    # records): a replaced file of n bytes leaves exactly ceil(n / 4096) dead 4 KiB blocks.
    sizes = {f"f{i}.bin": 1024 * 1024 + 5000 * i + 1 for i in range(6)}
    src = _write_tree(tmp_path / "src", {rel: os.urandom(n) for rel, n in sizes.items()})
    options = {"record_size": 4096, "compression": "none"}
    pack(str(src), str(tmp_path / "old.bundle"), PackOptions(**options))
    replaced = ["f1.bin", "f4.bin"]
    gen2 = _generation(
        tmp_path, tmp_path / "old.bundle", {r: b"new" for r in replaced}, "g", **options
    )
    with Bundle(gen2) as b:
        liveness = b.info(dead=True).liveness
    assert liveness is not None
    assert liveness.dead_bytes == sum(-(-sizes[r] // 4096) * 4096 for r in replaced)


def test_info_without_dead_reads_no_liveness(gens) -> None:
    with Bundle(gens[2]) as b:
        assert b.info().liveness is None
        assert "dead_bytes" not in b.info().to_dict()


def test_a_fresh_pack_has_no_dead_bytes(gens, tmp_path) -> None:
    src, _current, _gen2 = gens
    pack(
        str(src), str(tmp_path / "fresh.bundle"), PackOptions(record_size=RECORD, shard_size=SHARD)
    )
    with Bundle(tmp_path / "fresh.bundle") as b:
        liveness = b.info(dead=True).liveness
    assert liveness is not None and liveness.dead_bytes == 0 and liveness.sparse_shards == 0


def test_the_cli_info_dead_says_live_dead_and_sparse_shards(gens) -> None:
    result = run_cli("info", "--dead", "--min-live", "90%", gens[2])
    assert result.returncode == 0, result.stderr
    text = result.stdout.decode()
    assert "live bytes" in text and "dead bytes" in text and "less than 90% live" in text
    plain = run_cli("info", gens[2])
    assert "dead bytes" not in plain.stdout.decode()


def test_the_cli_info_dead_json_has_the_figures(gens) -> None:
    result = run_cli("info", "--dead", "--json", gens[2])
    facts = json.loads(result.stdout)
    assert facts["dead_bytes"] == _reference_dead_bytes(gens[2])
    assert facts["live_bytes"] + facts["dead_bytes"] == facts["stored_bytes"]
    assert facts["min_live"] == 0.5 and facts["dead_records"] > 0


# --- compact ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compacted(gens, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("compacted") / "new.bundle"
    compact(gens[2], str(out), CompactOptions(shard_size=SHARD))
    return out


def test_compacting_drops_the_dead_bytes_of_every_shard_it_rewrites(gens, tmp_path) -> None:
    gen2, out = gens[2], tmp_path / "new.bundle"
    summary = compact(gen2, str(out), CompactOptions(min_live=1.0, shard_size=SHARD))
    with Bundle(gen2) as before, Bundle(out) as after:
        old, new = before.info(dead=True).liveness, after.info(dead=True).liveness
    assert old is not None and new is not None
    assert new.dead_bytes == 0 and new.live_records == old.live_records
    # The live records of the rewritten shards that had any, in fewer shards: one header block
    # less per shard saved.
    with_live = old.shards - old.dead_shards - summary.kept
    headers = (with_live - summary.written) * 4096
    assert new.stored_bytes == old.live_bytes - headers < old.stored_bytes


def test_shards_live_enough_are_kept_with_their_dead_bytes(gens, compacted) -> None:
    reader = IndexReader(str(gens[2]))
    try:
        shards = shard_liveness(reader)
    finally:
        reader.close()
    rewritten = plan(shards, 0.5, SHARD // 4)
    kept_dead = sum(s.file_size - s.live_bytes for s in shards if s.shard not in rewritten)
    with Bundle(compacted) as b:
        liveness = b.info(dead=True).liveness
    assert liveness is not None and liveness.dead_bytes == kept_dead


def test_every_file_of_the_compacted_bundle_is_the_sources(gens, compacted, tmp_path) -> None:
    _src, current, _gen2 = gens
    run_cli("extract", compacted, tmp_path / "out").check_returncode()
    result = diff_r(current, tmp_path / "out")
    assert result.returncode == 0, result.stdout.decode()


@pytest.mark.mount
def test_a_compacted_bundle_mounts_and_diffs_clean_against_the_source(
    gens, compacted, mount_bundle
) -> None:
    m = mount_bundle(compacted)
    result = diff_r(gens[1], m.mountpoint)
    assert result.returncode == 0, result.stdout.decode()


@pytest.mark.mount
def test_info_dead_of_a_mount_point_says_the_served_bundles_dead_bytes(gens, mount_bundle) -> None:
    m = mount_bundle(gens[2])
    result = run_cli("info", "--dead", "--json", m.mountpoint)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert "daemon" in facts and facts["dead_bytes"] == _reference_dead_bytes(gens[2])


def test_the_compacted_tree_is_the_bundles_entry_for_entry(gens, compacted) -> None:
    assert _facts(compacted) == _facts(gens[2])


def test_the_compacted_bundle_keeps_metadata_owners_and_creation_time(tmp_path) -> None:
    src = build_rich_tree(tmp_path / "src")
    old = tmp_path / "old.bundle"
    pack(str(src), str(old), PackOptions(meta=(("dataset", "labels"),), created_ns=10**18))
    compact(old, str(tmp_path / "new.bundle"))
    with Bundle(old) as a, Bundle(tmp_path / "new.bundle") as b:
        ia, ib = a.info(), b.info()
        assert ib.meta == ia.meta == {"dataset": "labels"}
        assert ib.config.created_ns == ia.config.created_ns
        assert ib.bundle_id != ia.bundle_id


def test_the_compacted_bundle_verifies(compacted) -> None:
    report = verify(compacted)
    assert report.ok, report.problems


def test_shards_kept_are_hard_links_of_the_bundles_files(gens, tmp_path) -> None:
    _src, _current, gen2 = gens
    out = tmp_path / "new.bundle"
    summary = compact(gen2, str(out), CompactOptions(shard_size=SHARD // 16))
    assert summary.kept and summary.rewritten
    old_inodes = {os.stat(p).st_ino for p in gen2.glob("shard-*")}
    new_files = sorted(out.glob("shard-*"))
    linked = [p for p in new_files if os.stat(p).st_ino in old_inodes]
    assert len(linked) == summary.kept
    assert all(os.stat(p).st_nlink > 1 for p in linked)
    assert len(new_files) == summary.kept + summary.written


def test_a_tiny_shard_size_never_splits_a_file_across_shards(gens, tmp_path) -> None:
    # Every record would start a new shard, but a file's records stay together.
    out = tmp_path / "new.bundle"
    compact(gens[2], str(out), CompactOptions(shard_size=1, min_live=1.0))
    report = verify(out)
    assert report.ok, report.problems
    assert _facts(out) == _facts(gens[2])


def test_compacting_never_changes_the_bundle(gens, tmp_path) -> None:
    gen2 = gens[2]
    before = {
        p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in gen2.rglob("*") if p.is_file()
    }
    compact(gen2, str(tmp_path / "new.bundle"), CompactOptions(min_live=1.0, shard_size=1))
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in gen2.rglob("*") if p.is_file()}
    assert after == before


def test_no_record_is_decompressed_or_recompressed(gens, tmp_path) -> None:
    # A zstd bundle compacted in a process that cannot import zstandard: any decode or encode of
    # a record would fail there (the process first shows that a read does).
    src, _current, _gen2 = gens
    options = {"record_size": RECORD, "shard_size": SHARD, "compression": "zstd"}
    pack(str(src), str(tmp_path / "old.bundle"), PackOptions(**options))
    gen2 = _generation(
        tmp_path,
        tmp_path / "old.bundle",
        {"many/d1/f001.txt": b"x", "big/b2.bin": b"y"},
        "g",
        **options,
    )
    out = tmp_path / "new.bundle"
    script = (
        "import sys; sys.modules['zstandard'] = None\n"
        "from bundlefs import Bundle, BundleError\n"
        "from bundlefs.cli import main\n"
        "try:\n"
        f"    Bundle({str(gen2)!r}).read('big/b0.bin')\n"
        "except BundleError as e:\n"
        "    print('read refused:', e, file=sys.stderr)\n"
        "else:\n"
        "    sys.exit('a zstd record was read without zstandard')\n"
        f"sys.exit(main(['compact', {str(gen2)!r}, {str(out)!r}, '--min-live', '1', '--json']))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert b"read refused" in result.stderr
    assert json.loads(result.stdout)["records_copied"] > 0
    reader = IndexReader(str(out))
    try:  # the new shards hold zstd-compressed records, copied as they were
        written = [
            s
            for s in range(reader.config.shard_count)
            if reader.shard_info(s).header_id == fmt.OWN_BUNDLE_ID
        ]
        assert written and all(reader.shard_info(s).codec == fmt.COMPRESSION_ZSTD for s in written)
        assert any(r.flags == 0 for s in written for r in reader.iter_records(s))
    finally:
        reader.close()
    report = verify(out)
    assert report.ok, report.problems
    assert _facts(out) == _facts(gen2)


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
def test_an_older_version_bundle_compacts_into_this_version(tmp_path, version) -> None:
    old, out = DATA / f"v{version}-twelve-shards.bundle", tmp_path / "new.bundle"
    summary = compact(old, str(out))
    assert summary.rewritten > 1 and summary.config.format_version == fmt.FORMAT_VERSION
    assert _facts(out) == _facts(old)
    assert verify(out).ok


@pytest.mark.parametrize(
    "where",
    ["bundlefs.storage.shard_writer:ShardWriter.write_stored", "bundlefs.storage.publish:seal"],
)
def test_a_killed_compact_leaves_nothing_that_opens(gens, tmp_path, where) -> None:
    out = tmp_path / "new.bundle"
    with paused(tmp_path, where, 1, "compact", gens[2], out, "--min-live", "1") as (process, _r):
        process.kill()
        process.wait()
    assert not out.exists()
    with pytest.raises(NotABundleError):
        Bundle(out)
    result = run_cli("compact", gens[2], out, "--min-live", "1")  # the next one clears up
    assert result.returncode == 0, result.stderr
    assert [p.name for p in tmp_path.iterdir() if ".partial-" in p.name] == []


def test_a_signal_during_compact_removes_the_partial_bundle_and_says_so(gens, tmp_path) -> None:
    status, err = interrupted(
        tmp_path, "bundlefs.storage.shard_writer:ShardWriter.write_stored", 2, signal.SIGTERM,
        "compact", gens[2], tmp_path / "new.bundle", "--min-live", "1",
    )  # fmt: skip
    assert status == 143
    assert len(err) == 1 and err[0].startswith("bundlefs: error: interrupted by SIGTERM; removed")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_compacting_a_compacted_bundle_again_rewrites_nothing(gens, compacted, tmp_path) -> None:
    summary = compact(compacted, str(tmp_path / "again.bundle"), CompactOptions(shard_size=SHARD))
    assert summary.rewritten == 0 and summary.records_copied == 0
    assert summary.kept == summary.config.shard_count


def test_the_cli_compacts_and_prints_one_summary_line(gens, tmp_path) -> None:
    result = run_cli("compact", gens[2], tmp_path / "new.bundle", "--shard-size", "64K")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compacted ") and "new.bundle" in lines[0]


def test_the_cli_refuses_to_compact_a_bundle_into_itself(gens) -> None:
    message = assert_one_line_error(run_cli("compact", gens[2], gens[2], "--force"))
    assert "new path" in message


def test_the_cli_refuses_an_existing_new_bundle_without_force(gens, compacted) -> None:
    message = assert_one_line_error(run_cli("compact", gens[2], compacted))
    assert "--force" in message


def test_the_cli_refuses_a_min_live_that_is_not_a_fraction(gens, tmp_path) -> None:
    result = run_cli("compact", gens[2], tmp_path / "new.bundle", "--min-live", "2")
    assert result.returncode == 2 and b"fraction" in result.stderr


def test_a_damaged_record_is_refused_not_copied(gens, tmp_path) -> None:
    gen2 = tmp_path / "gen2.bundle"
    shutil.copytree(gens[2], gen2)  # copies, not links: the fixture's shards stay intact
    reader = IndexReader(str(gen2))
    try:  # a live record of a shard with dead ones: one that compact copies
        sparse = next(s for s in shard_liveness(reader) if 0 < s.live_fraction < 1)
        i = sparse.live.index(1)
        record = list(reader.iter_records(sparse.shard))[i]
    finally:
        reader.close()
    with open(gen2 / fmt.shard_filename(sparse.shard), "r+b") as f:
        f.seek(record.stored_offset)
        byte = f.read(1)
        f.seek(record.stored_offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(PackError, match="damaged"):
        compact(gen2, str(tmp_path / "new.bundle"), CompactOptions(min_live=1.0))
    assert not (tmp_path / "new.bundle").exists()


# --- the geometric rule -------------------------------------------------------------------------


def _shard(number: int, live_blocks: int, dead_blocks: int = 0) -> ShardLiveness:
    """A shard of 4 KiB records: ``live_blocks`` live, then ``dead_blocks`` dead."""
    from array import array

    count = live_blocks + dead_blocks
    return ShardLiveness(
        number,
        4096 * (count + 1),
        4096 * count,
        fmt.COMPRESSION_LZ4,
        array("Q", range(0, 4096 * count, 4096)),
        array("Q", [4096] * count),
        bytearray([1] * live_blocks + [0] * dead_blocks),
        bytearray(count),
    )


def test_the_plan_rewrites_sparse_shards_and_keeps_large_live_ones() -> None:
    shards = [_shard(0, 100), _shard(1, 10, 90), _shard(2, 100, 1)]
    assert plan(shards, min_live=0.5, small_bytes=4096 * 50) == [1]


def test_the_plan_keeps_small_shards_that_form_a_geometric_progression() -> None:
    shards = [_shard(0, 1), _shard(1, 3), _shard(2, 7), _shard(3, 15)]
    assert plan(shards, small_bytes=10**9) == []


def test_the_plan_rolls_up_small_shards_below_a_break_in_the_progression() -> None:
    # 2, 3 break it (3 < 2 x 2): both roll up, and 5 < 2 x (2 + 3) joins them; 40 stays.
    shards = [_shard(0, 40), _shard(1, 3), _shard(2, 2), _shard(3, 5)]
    assert plan(shards, small_bytes=10**9) == [1, 2, 3]


def test_the_plan_rolls_small_shards_into_what_sparse_shards_rewrite() -> None:
    shards = [_shard(0, 10, 90), _shard(1, 15), _shard(2, 100)]
    assert plan(shards, small_bytes=10**9) == [0, 1]


def test_the_plan_never_rewrites_one_small_shard_alone() -> None:
    assert plan([_shard(0, 3)], small_bytes=10**9) == []
