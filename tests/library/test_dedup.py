"""``pack --dedup``: identical contents stored once, each later file an entry of its own at the
first copy's bytes (docs/format.md §3.3, shared content), and every reader of such a bundle:
extract, verify, export, salvage, info, compact (liveness), diff."""

from __future__ import annotations

import io
import os
import random
import tarfile
from pathlib import Path

import pytest

from bundlefs import Bundle, CompactOptions, PackOptions, Writer, compact, pack
from bundlefs.errors import PackError
from bundlefs.packing.content import DedupTable
from bundlefs.packing.distributed.driver import DistributedPack
from bundlefs.read.diff import diff
from bundlefs.read.export import export_tar
from bundlefs.read.extract import extract
from bundlefs.read.salvage import LostRange, salvage_content
from bundlefs.read.verify import verify
from bundlefs.storage.index import IndexReader
from tests.conftest import flip_byte
from tests.support.trees import MTIME_NS, snapshot

BIG = 3 * 2**20  # streamed, not read ahead (over 1 MiB)


def dup_tree(root: Path) -> Path:
    """Six distinct contents (one of 3 MiB) and a copy of each in another directory, the
    copies with other modes and mtimes."""
    rng = random.Random(5)
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    for i in range(6):
        data = rng.randbytes(BIG if i == 0 else rng.randint(1, 50_000))
        (root / "a" / f"f{i}").write_bytes(data)
        copy = root / "b" / f"g{i}"
        copy.write_bytes(data)
        os.chmod(copy, 0o600)
        os.utime(copy, ns=(MTIME_NS + i, MTIME_NS + i))
    (root / "a" / "empty").write_bytes(b"")
    (root / "b" / "empty").write_bytes(b"")
    return root


def _pack(src: Path, dest: Path, dedup: bool = True):
    return pack(str(src), str(dest), dedup=dedup)


def test_each_copy_shares_the_first_files_bytes_with_metadata_of_its_own(tmp_path: Path):
    src = dup_tree(tmp_path / "src")
    summary = _pack(src, tmp_path / "d.bundle")
    assert (summary.dedup_files, summary.dedup_bytes) == (6, sum(
        (src / "a" / f"f{i}").stat().st_size for i in range(6)
    ))  # fmt: skip
    with Bundle(tmp_path / "d.bundle") as b:
        for i in range(6):
            first, copy = b.resolve(f"a/f{i}"), b.resolve(f"b/g{i}")
            assert (copy.shard, copy.offset, copy.crc32c, copy.digest) == (
                first.shard, first.offset, first.crc32c, first.digest,
            )  # fmt: skip
            assert copy.ino != first.ino and not copy.is_link
            assert copy.mode & 0o777 == 0o600 and copy.mtime_ns == MTIME_NS + i


def test_dedup_stores_about_half_of_a_tree_of_pairs(tmp_path: Path):
    src = dup_tree(tmp_path / "src")
    plain = _pack(src, tmp_path / "n.bundle", dedup=False)
    deduped = _pack(src, tmp_path / "d.bundle")
    assert plain.dedup_files == 0
    assert deduped.stored_bytes < 0.55 * plain.stored_bytes


def test_a_shared_content_bundle_extracts_to_its_tree_and_verifies(tmp_path: Path):
    src = dup_tree(tmp_path / "src")
    _pack(src, tmp_path / "d.bundle")
    with Bundle(tmp_path / "d.bundle") as b:
        extract(b, tmp_path / "out")
    assert snapshot(tmp_path / "out") == snapshot(src)
    assert verify(str(tmp_path / "d.bundle")).ok


def test_damage_in_shared_bytes_is_reported_for_every_file_that_uses_them(tmp_path: Path):
    src = dup_tree(tmp_path / "src")
    _pack(src, tmp_path / "d.bundle", dedup=True)
    with Bundle(tmp_path / "d.bundle") as b:
        entry = b.resolve("a/f1")
    index = IndexReader(str(tmp_path / "d.bundle"))
    record = index.record_at(entry.shard, entry.offset)
    index.close()
    flip_byte(tmp_path / "d.bundle" / "shard-00000000", record.stored_offset + 10)
    report = verify(str(tmp_path / "d.bundle"))
    bad = {p.path for p in report.problems if p.path}
    assert {"a/f1", "b/g1"} <= bad


def test_export_writes_each_copy_as_a_file_of_its_own(tmp_path: Path):
    src = dup_tree(tmp_path / "src")
    _pack(src, tmp_path / "d.bundle")
    out = io.BytesIO()
    with Bundle(tmp_path / "d.bundle") as b:
        export_tar(b, out)
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        member = tar.getmember("./b/g2")
        assert member.isfile() and member.mode == 0o600
        assert tar.extractfile(member).read() == (src / "a" / "f2").read_bytes()


def test_salvage_of_an_undamaged_shared_file_gives_its_whole_content(tmp_path: Path):
    src = dup_tree(tmp_path / "src")
    _pack(src, tmp_path / "d.bundle")
    with Bundle(tmp_path / "d.bundle") as b:
        pieces = list(salvage_content(b.content, b.resolve("b/g0"), "b/g0"))
    assert not any(isinstance(p, LostRange) for p in pieces)
    assert b"".join(pieces) == (src / "a" / "f0").read_bytes()


def test_info_counts_the_files_that_share_an_earlier_files_content(tmp_path: Path):
    src = dup_tree(tmp_path / "src")
    summary = _pack(src, tmp_path / "d.bundle")
    with Bundle(tmp_path / "d.bundle") as b:
        facts = b.info(dead=True).to_dict()
    assert (facts["shared_files"], facts["shared_bytes"]) == (6, summary.dedup_bytes)


def test_a_copy_kept_after_its_first_file_is_deleted_stays_live_through_compact(tmp_path: Path):
    src = dup_tree(tmp_path / "src")
    _pack(src, tmp_path / "old.bundle")
    for i in range(6):
        os.unlink(src / "a" / f"f{i}")  # the first copies; b/g* point at their bytes
    pack(str(src), str(tmp_path / "new.bundle"), base=tmp_path / "old.bundle")
    compact(str(tmp_path / "new.bundle"), str(tmp_path / "c.bundle"), CompactOptions(min_live=1))
    with Bundle(tmp_path / "c.bundle") as b:
        extract(b, tmp_path / "out")
    assert snapshot(tmp_path / "out") == snapshot(src)
    assert verify(str(tmp_path / "c.bundle")).ok


def test_diff_of_two_copies_renamed_pairs_by_content(tmp_path: Path):
    src = dup_tree(tmp_path / "src")
    _pack(src, tmp_path / "old.bundle")
    os.rename(src / "b" / "g3", src / "b" / "h3")
    _pack(src, tmp_path / "new.bundle")
    old, new = tmp_path / "old.bundle", tmp_path / "new.bundle"
    files = [(c.status, c.path, c.old_path) for c in diff(old, new) if c.kind == "file"]
    assert files == [("R", b"b/h3", b"b/g3")]


def test_archive_members_with_the_same_content_are_stored_once(tmp_path: Path):
    data = random.Random(2).randbytes(40_000)
    with tarfile.open(tmp_path / "t.tar", "w") as tar:
        for name in ("x", "y", "z"):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    summary = pack(str(tmp_path / "t.tar"), str(tmp_path / "d.bundle"), PackOptions(dedup=True))
    assert summary.dedup_files == 2
    with Bundle(tmp_path / "d.bundle") as b:
        assert b.read("z") == data


def test_the_table_remembers_no_more_than_its_limit():
    table = DedupTable(limit=2)
    for n in range(3):
        table.add(bytes([n]) * 16, 0, n * 100, 100, streamed=False)
    assert table.find(bytes([1]) * 16) == (0, 100)
    assert table.find(bytes([2]) * 16) is None


def test_a_distributed_pack_refuses_dedup(tmp_path: Path):
    src = dup_tree(tmp_path / "src")
    with pytest.raises(PackError, match="dedup"):
        DistributedPack.prepare(str(src), str(tmp_path / "d.bundle"), PackOptions(dedup=True))


def test_a_writer_with_dedup_stores_an_added_content_once(tmp_path: Path):
    data = random.Random(3).randbytes(30_000)
    with Writer(tmp_path / "w.bundle", dedup=True) as w:
        w.add("x", data)
        w.add("y", data, mode=0o600)
    with Bundle(tmp_path / "w.bundle") as b:
        x, y = b.resolve("x"), b.resolve("y")
        assert (x.shard, x.offset) == (y.shard, y.offset) and b.read("y") == data
