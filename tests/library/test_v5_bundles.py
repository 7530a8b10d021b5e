"""Format version 5 on real bundles: directory totals (docs/format.md §3.8) and file digests
(§3.3 ``DIGEST``) as pack, merge and a distributed pack write them, as ``Bundle`` reads them
(``du``, ``stat().digest``, ``ls --json``, ``info``), and as ``verify`` checks them; bundles of
older versions answer ``du`` by walking."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from bundlefs import Bundle, PackOptions, pack
from bundlefs.core import format as fmt
from bundlefs.errors import FormatError
from bundlefs.packing.distributed.driver import DistributedPack
from bundlefs.packing.distributed.task import pack_partition
from bundlefs.packing.merge import MergeOptions, merge
from bundlefs.read.verify import verify
from tests.support.hostile import find_entry, forge, read_values
from tests.support.legacy_trees import V1_PACK_OPTIONS, build_v1_tree
from tests.support.trees import build_rich_tree, run_cli

DATA = Path(__file__).resolve().parent.parent / "data"
LEGACY = [DATA / f"v{v}-twelve-shards.bundle" for v in (1, 2, 3, 4, 5)]


def _sha128(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()[:16]


def _source_totals(root: Path) -> dict[bytes, fmt.TreeTotals]:
    """Every directory's totals by walking the source as the packer numbers it (breadth first,
    names in byte order): a file's inode counts once, at its first name."""
    order: list[tuple[bytes, os.stat_result]] = []
    queue = [b""]
    while queue:
        rel = queue.pop(0)
        for name in sorted(os.listdir(os.path.join(os.fsencode(root), rel) if rel else root)):
            name = os.fsencode(name)
            path = rel + b"/" + name if rel else name
            st = os.lstat(os.path.join(os.fsencode(root), path))
            order.append((path, st))
            if stat.S_ISDIR(st.st_mode):
                queue.append(path)
    firsts: set[tuple[int, int]] = set()
    totals = {b"": fmt.TreeTotals()} | {
        p: fmt.TreeTotals() for p, st in order if stat.S_ISDIR(st.st_mode)
    }
    for path, st in order:
        mine = fmt.TreeTotals(entries=1, dirs=int(stat.S_ISDIR(st.st_mode)))
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in firsts:
            firsts.add((st.st_dev, st.st_ino))
            mine += fmt.TreeTotals(files=1, bytes=st.st_size)
        parts = path.split(b"/")
        for depth in range(len(parts)):
            above = b"/".join(parts[:depth])
            totals[above] += mine
    return totals


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    src = build_rich_tree(tmp_path_factory.mktemp("rich") / "src")
    os.makedirs(src / "a" / "more" / "empty-too")
    (src / "a" / "more" / "f").write_bytes(b"x" * 12345)
    dest = src.parent / "rich.bundle"
    pack(str(src), str(dest))
    return src, dest


def test_a_packed_trees_totals_are_a_walk_of_the_source(rich) -> None:
    src, bundle = rich
    with Bundle(bundle) as b:
        assert b.config.format_version == fmt.FORMAT_VERSION  # version 5's totals, kept in 6
        for rel, expected in _source_totals(src).items():
            assert b.du(rel) == expected, rel
            assert b.tree.totals(b.resolve(rel)) == expected


def test_the_roots_totals_are_the_configs_counts(rich) -> None:
    _src, bundle = rich
    with Bundle(bundle) as b:
        c = b.config
        assert b.du("/") == fmt.TreeTotals(
            c.file_count, c.dir_count - 1, c.data_bytes, c.entry_count - 1
        )


def test_du_of_a_file_is_one_file_of_its_size_and_of_a_symlink_nothing(rich) -> None:
    _src, bundle = rich
    with Bundle(bundle) as b:
        assert b.du("a/multi.bin") == fmt.TreeTotals(files=1, bytes=256_000)
        assert b.du("link") == fmt.TreeTotals()
        assert b.du("dirlink", follow_symlinks=True) == b.du("a/b")


@pytest.mark.parametrize("legacy", LEGACY[:4], ids=["v1", "v2", "v3", "v4"])
def test_an_older_bundle_walks_to_the_totals_version_5_stores(legacy: Path, tmp_path) -> None:
    src = build_v1_tree(tmp_path / "src")
    today = tmp_path / "today.bundle"
    pack(str(src), str(today), PackOptions(**V1_PACK_OPTIONS))
    with Bundle(legacy) as old, Bundle(today) as new:
        assert old.tree.stored_totals(fmt.ROOT_INO) is None
        for path, _entry in new.tree:
            assert old.du(path) == new.du(path), path
        assert old.du("") == new.du("") == _source_totals(src)[b""]


def test_every_packed_file_has_the_digest_of_its_content(rich) -> None:
    src, bundle = rich
    with Bundle(bundle) as b:
        for path, entry in b.tree:
            if entry.is_file:
                assert b.stat(path).digest == _sha128((src / path).read_bytes()), path
        assert b.stat("a/b/shared-too").digest == b.stat("shared").digest  # a LINK: its target's
        assert b.stat("a").digest is None and b.lstat("link").digest is None
        assert b.info().to_dict()["digests"] == "sha256-128"


def test_a_tar_packs_with_digests_too(tmp_path) -> None:
    with tarfile.open(tmp_path / "t.tar", "w") as tar:
        for name, data in (("a.txt", b"alpha\n"), ("d/b.bin", bytes(5000))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, __import__("io").BytesIO(data))
    pack(str(tmp_path / "t.tar"), str(tmp_path / "t.bundle"))
    with Bundle(tmp_path / "t.bundle") as b:
        assert b.stat("a.txt").digest == _sha128(b"alpha\n")
        assert b.stat("d/b.bin").digest == _sha128(bytes(5000))
        assert b.du("d") == fmt.TreeTotals(files=1, bytes=5000, entries=1)


def test_ls_json_and_info_show_the_digest(rich) -> None:
    _src, bundle = rich
    out = run_cli("ls", "--json", bundle, "hello.txt")
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.decode().splitlines()[0])
    assert row["digest"] == _sha128(b"hello\n").hex()
    info = run_cli("info", bundle)
    assert "sha256-128" in info.stdout.decode()


def _trees(tmp_path: Path) -> tuple[Path, Path]:
    first = build_rich_tree(tmp_path / "first")
    second = tmp_path / "second"
    (second / "x" / "y").mkdir(parents=True)
    (second / "x" / "y" / "z.bin").write_bytes(b"z" * 999)
    (second / "top").write_bytes(b"t")
    return first, second


def test_a_merged_bundle_has_the_totals_of_its_tree_and_keeps_the_digests(tmp_path) -> None:
    first, second = _trees(tmp_path)
    inputs = [tmp_path / "first.bundle", tmp_path / "second.bundle", LEGACY[2]]
    options = PackOptions(block_size=V1_PACK_OPTIONS["block_size"])  # the committed bundle's
    pack(str(first), str(inputs[0]), options)
    pack(str(second), str(inputs[1]), options)
    dest = tmp_path / "merged.bundle"
    merge(inputs, str(dest), MergeOptions(at=("p", "q/r", "old")))
    assert verify(dest).ok
    with Bundle(dest) as m, Bundle(inputs[0]) as one, Bundle(LEGACY[2]) as v3:
        assert m.du("p") == one.du("") and m.du("old") == v3.du("")
        assert m.du("q") == fmt.TreeTotals(files=2, dirs=3, bytes=1000, entries=5)
        root = m.du("")
        assert root.files == m.config.file_count and root.entries == m.config.entry_count - 1
        for path, _entry in one.tree:
            assert m.lstat(f"p/{path}").digest == one.lstat(path).digest, path
        assert all(m.lstat(f"old/{path}").digest is None for path, _entry in v3.tree)


def test_a_distributed_pack_has_the_totals_and_digests_of_a_single_pack(tmp_path) -> None:
    src = build_v1_tree(tmp_path / "src")
    single, dest = tmp_path / "single.bundle", tmp_path / "dist.bundle"
    pack(str(src), str(single))
    job = DistributedPack.prepare(str(src), str(dest), PackOptions())
    with job.staging() as area:
        plan = job.plan(3)
        results = [pack_partition(task, job.part_options) for task in job.tasks(plan, area)]
        job.merge(plan, results, area)
    assert verify(dest).ok
    with Bundle(single) as one, Bundle(dest) as many:
        for path, entry in one.tree:
            assert many.du(path) == one.du(path), path
            if entry.is_file:
                assert many.stat(path).digest == one.stat(path).digest, path


@pytest.mark.parametrize("source", [*LEGACY, None], ids=["v1", "v2", "v3", "v4", "v5", "v6"])
def test_a_compacted_bundle_is_of_this_version_with_its_trees_totals(
    source, rich, tmp_path
) -> None:
    from bundlefs.packing.compact import CompactOptions, compact

    source = rich[1] if source is None else source
    dest = tmp_path / "compacted.bundle"
    compact(source, str(dest), CompactOptions(min_live=1.0))  # every shard rewritten
    assert verify(dest).ok
    with Bundle(source) as old, Bundle(dest) as new:
        assert new.config.format_version == fmt.FORMAT_VERSION
        for path, entry in old.tree:
            assert new.du(path) == old.du(path), path
            if entry.is_file:
                assert new.stat(path).digest == old.stat(path).digest, path


def test_a_delta_pack_has_its_trees_totals_and_every_files_digest(tmp_path) -> None:
    src = build_rich_tree(tmp_path / "src")
    old, new, whole = tmp_path / "old.bundle", tmp_path / "new.bundle", tmp_path / "whole.bundle"
    pack(str(src), str(old))
    (src / "a" / "added.txt").write_bytes(b"new file\n")
    (src / "hello.txt").unlink()
    pack(str(src), str(new), base=old)  # unchanged files reused from OLD: their digests copied
    pack(str(src), str(whole))
    assert verify(new).ok
    with Bundle(new) as delta, Bundle(whole) as one:
        for path, entry in one.tree:
            assert delta.du(path) == one.du(path), path
            if entry.is_file:
                assert delta.stat(path).digest == one.stat(path).digest is not None, path


# --- verify and the reader against damaged values -------------------------------------------------


@pytest.fixture
def copy(rich, tmp_path) -> Path:
    import shutil

    dest = tmp_path / "copy.bundle"
    shutil.copytree(rich[1], dest)
    return dest


def test_verify_finds_a_flipped_digest_byte(copy: Path) -> None:
    entry = find_entry(copy, lambda e: e.name == b"deep.txt")
    value = bytearray(read_values(copy, fmt.DB_ENTRIES)[fmt.entry_key(entry.ino)])
    value[-len(b"deep.txt") - 1] ^= 0x01  # the digest's last byte, right before the name
    forge(copy, {(fmt.DB_ENTRIES, fmt.entry_key(entry.ino)): bytes(value)})
    report = verify(copy)
    assert not report.ok
    assert [(p.kind, p.path) for p in report.problems] == [("file", "a/b/c/deep.txt")]
    assert "digest" in report.problems[0].message


def _dir_ino(bundle: Path, name: bytes) -> int:
    return find_entry(bundle, lambda e: e.is_dir and e.name == name).ino


def test_verify_finds_totals_that_do_not_add_up(copy: Path) -> None:
    ino = _dir_ino(copy, b"c")
    with Bundle(copy) as b:
        wrong = b.du("a/b/c") + fmt.TreeTotals(bytes=1)
    forge(copy, {(fmt.DB_TOTALS, fmt.totals_key(ino)): fmt.encode_totals(wrong)})
    report = verify(copy)
    # Named once: its parents are checked against what the entries add up to, not against it.
    assert [(p.kind, "a/b/c:" in p.message) for p in report.problems] == [("totals", True)]


def test_totals_of_the_wrong_length_are_a_totals_problem(copy: Path) -> None:
    ino = _dir_ino(copy, b"empty")
    forge(copy, {(fmt.DB_TOTALS, fmt.totals_key(ino)): bytes(31)})
    report = verify(copy)
    assert [p.kind for p in report.problems] == ["totals"]
    assert "31 bytes" in report.problems[0].message
    with Bundle(copy) as b, pytest.raises(FormatError, match="31 bytes"):
        b.du("empty")


def test_a_missing_totals_key_refuses_the_bundle_at_open(copy: Path) -> None:
    forge(copy, deletes=[(fmt.DB_TOTALS, fmt.totals_key(_dir_ino(copy, b"empty")))])
    with pytest.raises(FormatError, match="totals of .* directories, the config counts"):
        Bundle(copy)
    report = verify(copy)
    assert [p.kind for p in report.problems] == ["index"]


def test_root_totals_that_are_not_the_configs_counts_refuse_the_bundle(copy: Path) -> None:
    forge(copy, {(fmt.DB_TOTALS, fmt.totals_key(1)): fmt.encode_totals(fmt.TreeTotals(1, 1, 1, 1))})
    with pytest.raises(FormatError, match="root's totals"):
        Bundle(copy)
