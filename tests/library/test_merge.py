"""``bundlefs merge``: bundles into one whose shards are the inputs' shard files, linked.

The merged index is built as a pack of the union tree would be, so a tree split in two, packed
half by half and merged, is the single pack of the whole tree (inode numbers included); the
shards are hard links of the inputs' files (or copies across file systems, said so); the shard
table lets one bundle hold shards of format versions 1, 2 and 3 and of lz4 and zstd bundles.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from bundlefs import Bundle, PackOptions, pack
from bundlefs.core import format as fmt
from bundlefs.errors import PackError
from bundlefs.packing.merge import MergeOptions, merge
from bundlefs.read.verify import verify
from tests.conftest import flip_byte
from tests.support.hostile import read_values
from tests.support.legacy_trees import V1_FILES, build_v1_tree
from tests.support.trees import assert_one_line_error, build_rich_tree, diff_r, run_cli

DATA = Path(__file__).resolve().parents[1] / "data"
CREATED = 1_700_000_000 * 10**9


def _restore_dir_times(copy: Path, original: Path) -> None:
    """Give every directory of ``copy`` its ``original``'s mtime (deleting files changed it)."""
    for top, dirs, _files in os.walk(copy):
        for d in [*dirs, ""]:
            path = os.path.join(top, d)
            st = os.lstat(os.path.join(original, os.path.relpath(path, copy)))
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def _split(src: Path, first: Path, second: Path) -> None:
    """Two copies of ``src`` with every directory, each with about half the other entries: the
    hard-linked pair and the symlinks in ``first``, the rest alternating."""
    for dest in (first, second):
        subprocess.run(["cp", "-a", str(src), str(dest)], check=True)
    turn = 0
    for top, dirs, files in sorted(os.walk(src)):
        links_to_dirs = [d for d in dirs if os.path.islink(os.path.join(top, d))]
        for name in sorted(files + links_to_dirs):
            rel = os.path.relpath(os.path.join(top, name), src)
            path = os.path.join(top, name)
            if os.path.islink(path) or os.lstat(path).st_nlink > 1:
                keep = first
            else:
                keep, turn = (first if turn % 2 == 0 else second), turn + 1
            drop = second if keep is first else first
            os.unlink(os.path.join(drop, rel))
    for dest in (first, second):
        _restore_dir_times(dest, src)


def _facts(bundle: str | os.PathLike) -> list[tuple]:
    """Every entry as (path, inode, mode, mtime, size, nlink, content or target)."""
    out = []
    with Bundle(bundle) as b:
        for path, entry in b.tree:
            st = b.lstat(path)
            if entry.is_dir:
                data = b""
            elif entry.is_symlink:
                data = os.fsencode(b.readlink(path))
            else:
                data = b.read(path)
            out.append((path, st.st_ino, st.st_mode, st.st_mtime_ns, st.st_size, st.st_nlink, data))
    return out


@pytest.fixture(scope="module")
def halves(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the whole tree packed, its first half packed, its second half packed)."""
    root = tmp_path_factory.mktemp("merge")
    src = build_rich_tree(root / "src")
    _split(src, root / "first", root / "second")
    options = PackOptions(created_ns=CREATED)
    for name in ("src", "first", "second"):
        pack(str(root / name), str(root / f"{name}.bundle"), options)
    return root / "src.bundle", root / "first.bundle", root / "second.bundle"


# --- the merged tree -----------------------------------------------------------------------------


def test_merging_the_halves_of_a_tree_gives_the_pack_of_the_whole_tree(halves, tmp_path) -> None:
    whole, first, second = halves
    out = tmp_path / "merged.bundle"
    merge([first, second], str(out), MergeOptions(created_ns=CREATED))
    assert _facts(out) == _facts(whole)


def test_a_merged_bundle_mounts_and_diffs_clean_against_the_source(
    halves, tmp_path, mount_bundle
) -> None:
    whole, first, second = halves
    out = tmp_path / "merged.bundle"
    merge([first, second], str(out))
    m = mount_bundle(out)
    assert diff_r(whole.parent / "src", m.mountpoint).returncode == 0


def test_a_merged_bundle_verifies(halves, tmp_path) -> None:
    _whole, first, second = halves
    out = tmp_path / "merged.bundle"
    merge([first, second], str(out))
    report = verify(out)
    assert report.ok, report.problems


def test_the_merged_shards_are_hard_links_of_the_inputs_shard_files(halves, tmp_path) -> None:
    _whole, first, second = halves
    out = tmp_path / "merged.bundle"
    summary = merge([first, second], str(out))
    inputs = sorted(first.glob("shard-*")) + sorted(second.glob("shard-*"))
    merged = [out / fmt.shard_filename(i) for i in range(len(inputs))]
    assert [p.stat().st_ino for p in merged] == [p.stat().st_ino for p in inputs]
    assert (summary.linked, summary.reflinked, summary.copied) == (len(inputs), 0, 0)
    assert sorted(out.glob("shard-*")) == merged


def test_merging_twice_with_a_fixed_creation_time_is_byte_identical(halves, tmp_path) -> None:
    _whole, first, second = halves
    options = MergeOptions(created_ns=CREATED, meta=(("origin", "test"),))
    merge([first, second], str(tmp_path / "one"), options)
    merge([first, second], str(tmp_path / "two"), options)
    for name in ("COMPLETE", "index/data.mdb", "index/pages"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    with Bundle(tmp_path / "one") as b:
        assert b.info().meta == {"origin": "test"} and b.config.created_ns == CREATED


def test_each_bundle_can_go_under_its_own_prefix(halves, tmp_path) -> None:
    _whole, first, second = halves
    out = tmp_path / "merged.bundle"
    merge([first, second], str(out), MergeOptions(at=("one", "two/deeper")))
    with Bundle(out) as m, Bundle(first) as a, Bundle(second) as b:
        assert sorted(m.listdir("")) == ["one", "two"]
        assert m.listdir("two") == ["deeper"]
        assert [p for p, _e in m.tree] == (
            ["one", "two"]
            + [f"one/{p}" for p, _e in a.tree]
            + ["two/deeper"]
            + [f"two/deeper/{p}" for p, _e in b.tree]
        )
        assert m.read("one/shared") == a.read("shared")
        assert m.stat("one/a/b/shared-too").st_nlink == 2
        assert m.stat("one").st_mtime_ns == a.stat("").st_mtime_ns  # the input root's


def test_a_file_in_two_bundles_is_refused_without_a_clash_rule(pack_tree, tmp_path) -> None:
    a = pack_tree({"same.txt": b"from a", "d": {"x": b"x"}}, name="a")
    b = pack_tree({"same.txt": b"from b", "d": {"y": b"y"}}, name="b")
    with pytest.raises(PackError, match="same.txt is in more than one bundle"):
        merge([a, b], str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


@pytest.mark.parametrize(("rule", "winner"), [("last", b"from b"), ("first", b"from a")])
def test_the_clash_rule_says_which_bundle_wins(pack_tree, tmp_path, rule, winner) -> None:
    a = pack_tree({"same.txt": b"from a", "d": {"x": b"x"}}, name="a")
    b = pack_tree({"same.txt": b"from b", "d": {"y": b"y"}}, name="b")
    summary = merge([a, b], str(tmp_path / "out"), MergeOptions(on_clash=rule))
    with Bundle(tmp_path / "out") as m:
        assert m.read("same.txt") == winner
        assert sorted(m.listdir("d")) == ["x", "y"]  # directories merge, whoever wins
    assert summary.overridden == ["same.txt"]


def test_a_directory_that_wins_a_clash_hides_the_file_it_replaces(pack_tree, tmp_path) -> None:
    a = pack_tree({"x": b"a file"}, name="a")
    b = pack_tree({"x": {"inside": b"in a directory"}}, name="b")
    merge([a, b], str(tmp_path / "out"), MergeOptions(on_clash="last"))
    with Bundle(tmp_path / "out") as m:
        assert m.listdir("x") == ["inside"]


def test_shards_on_another_file_system_are_copied_and_said_so(pack_tree, tmp_path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another file system than the temporary directory")
    a = pack_tree({"f": b"hello"}, name="a")
    work = Path(tempfile.mkdtemp(dir=shm))
    try:
        result = run_cli("merge", a, work / "out")
        assert result.returncode == 0, result.stderr
        assert b"copied 1 of 1 shard file:" in result.stderr
        assert b"0 linked, 0 reflinked, 1 copied" in result.stdout
        with Bundle(work / "out") as m:
            assert m.read("f") == b"hello"
    finally:
        shutil.rmtree(work)


# --- format versions and codecs ------------------------------------------------------------------


def test_a_bundle_can_hold_shards_of_versions_1_to_6_and_of_lz4_and_zstd(tmp_path) -> None:
    tree = build_v1_tree(tmp_path / "src")
    today = tmp_path / "v6.bundle"
    pack(str(tree), str(today), PackOptions(block_size=512, record_size=4096, shard_size=4000))
    out = tmp_path / "all.bundle"
    inputs = [DATA / f"v{v}-twelve-shards.bundle" for v in (1, 2, 3, 4, 5)] + [today]
    prefixes = ("v1", "v2", "v3", "v4", "v5", "v6")
    merge(inputs, str(out), MergeOptions(at=prefixes))
    with Bundle(out) as m:
        assert m.config.format_version == fmt.FORMAT_VERSION
        codecs = {m.content.shard_info(i).codec for i in range(m.config.shard_count)}
        assert codecs == {fmt.COMPRESSION_LZ4, fmt.COMPRESSION_ZSTD}
        versions = {m.content.shard_info(i).header_version for i in range(m.config.shard_count)}
        assert versions == {1, 2, 3, 4, 5, 6}
        for prefix in prefixes:
            for rel, _size, _compressible in V1_FILES:
                assert m.read(f"{prefix}/{rel}") == (tree / rel).read_bytes(), (prefix, rel)
                # A merge copies digests: only the version-5 and -6 inputs' files have one.
                digested = prefix in ("v5", "v6")
                assert (m.stat(f"{prefix}/{rel}").digest is not None) == digested
            assert m.du(prefix) == m.du("v6")
    assert verify(out).ok


def test_a_merge_records_no_source_stats(pack_tree, tmp_path) -> None:
    # docs/format.md §3.9: only a pack of a directory writes them; a merge's entries are renumbered
    # and its inputs may be of any writer, so it writes none (its own inputs have them).
    first, second = pack_tree({"a": b"one"}, "one"), pack_tree({"b": b"two"}, "two")
    merge([first, second], str(tmp_path / "m"), MergeOptions(at=("x", "y")))
    assert read_values(first, fmt.DB_SOURCES) != {}
    assert read_values(tmp_path / "m", fmt.DB_SOURCES) == {}


def test_special_files_of_the_inputs_are_merged_with_their_device_numbers(tmp_path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for src in (first, second):
        src.mkdir()
        (src / "file").write_bytes(src.name.encode())
    os.mkfifo(first / "fifo")
    os.chmod(first / "fifo", 0o640)  # mkfifo's mode is under the umask
    if os.geteuid() == 0:
        os.mknod(second / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    bundles = []
    for src in (first, second):
        pack(str(src), str(tmp_path / f"{src.name}.bundle"))
        bundles.append(tmp_path / f"{src.name}.bundle")
    out = tmp_path / "merged.bundle"
    summary = merge(bundles, str(out), MergeOptions(at=("a", "b")))
    with Bundle(out) as m:
        assert m.stat("a/fifo").st_mode == stat.S_IFIFO | 0o640
        if os.geteuid() == 0:
            null = m.stat("b/null")
            source = os.lstat(second / "null")
            assert (null.st_mode, null.st_rdev) == (source.st_mode, os.makedev(1, 3))
        assert (
            m.config.special_count
            == summary.to_dict()["specials"]
            == len([p for src in (first, second) for p in src.iterdir() if not p.is_file()])
        )
    assert verify(out).ok


def test_bundles_of_different_block_sizes_are_refused(pack_tree, tmp_path) -> None:
    a = pack_tree({"f": b"a"}, name="a", block_size=512)
    b = pack_tree({"g": b"b"}, name="b")
    with pytest.raises(PackError, match="different block sizes"):
        merge([a, b], str(tmp_path / "out"))


# --- damage and the command line -----------------------------------------------------------------


def test_damage_in_a_linked_shard_is_found_by_verify_of_the_merged_bundle(
    pack_tree, tmp_path
) -> None:
    a = pack_tree({"f.bin": os.urandom(9000)}, name="a")
    b = pack_tree({"g.txt": b"g"}, name="b")
    out = tmp_path / "out"
    merge([a, b], str(out))
    flip_byte(a / fmt.shard_filename(0), 4096 + 10)  # the same file: a hard link
    report = verify(out)
    assert not report.ok and report.damaged_files == ["f.bin"]


def test_the_cli_merges_and_prints_one_summary_line(halves, tmp_path) -> None:
    _whole, first, second = halves
    result = run_cli("merge", first, second, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    line = result.stdout.decode().strip()
    assert line.startswith("merged 2 bundles: ") and line.endswith(str(tmp_path / "out"))


def test_the_cli_refuses_a_missing_input_in_one_sentence(pack_tree, tmp_path) -> None:
    a = pack_tree({"f": b"a"}, name="a")
    result = run_cli("merge", a, tmp_path / "missing.bundle", tmp_path / "out")
    assert "missing.bundle is not a bundle" in assert_one_line_error(result)
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_to_replace_a_bundle_without_force(pack_tree, tmp_path) -> None:
    a = pack_tree({"f": b"a"}, name="a")
    b = pack_tree({"g": b"b"}, name="b")
    assert run_cli("merge", a, b, tmp_path / "out").returncode == 0
    assert "already exists" in assert_one_line_error(run_cli("merge", a, tmp_path / "out"))
    assert run_cli("merge", a, tmp_path / "out", "--force").returncode == 0
    with Bundle(tmp_path / "out") as m:
        assert list(m) == ["f"]


# --- found by the second read ----------------------------------------------------------------


@pytest.mark.parametrize(("rule", "winner"), [("first", b"from a"), ("last", b"from b")])
def test_the_clash_rule_ranks_by_input_when_prefixes_nest(pack_tree, tmp_path, rule, winner):
    a = pack_tree({"f": b"from a"}, name="a")  # placed at a/, so its f is a/f
    b = pack_tree({"a": {"f": b"from b"}}, name="b")  # at the root, with its own a/f
    merge([a, b], str(tmp_path / "out"), MergeOptions(at=("a", "."), on_clash=rule))
    with Bundle(tmp_path / "out") as m:
        assert m.read("a/f") == winner


def test_a_merged_directory_takes_the_last_inputs_attributes(pack_tree, tmp_path) -> None:
    a = pack_tree({"d": {"x": b"x"}}, name="a")
    b = pack_tree({"d": {"y": b"y"}}, name="b")
    os.chmod(a.parent / "a.src" / "d", 0o700)
    pack(str(a.parent / "a.src"), str(a), PackOptions(force=True))
    merge([a, b], str(tmp_path / "out"))
    with Bundle(tmp_path / "out") as m, Bundle(b) as last:
        assert m.stat("d").st_mode == last.stat("d").st_mode


def test_an_input_replaced_during_the_merge_fails_it(pack_tree, tmp_path, monkeypatch) -> None:
    from bundlefs.packing.reuse import ReusedShards

    a = pack_tree({"f": b"old"}, name="a")
    link = ReusedShards.link

    def replace_first(self, work, linked=None):  # a pack --force over the input, after its
        pack(str(a.parent / "a.src"), str(a), PackOptions(force=True, created_ns=1))
        return link(self, work, linked)  # index was read

    monkeypatch.setattr(ReusedShards, "link", replace_first)
    with pytest.raises(PackError, match="is not the shard its bundle's index describes"):
        merge([a], str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_an_input_whose_hard_link_names_a_directory_is_refused(pack_tree, tmp_path) -> None:
    from tests.support.hostile import entry_put, find_entry, forge

    a = pack_tree({"f": b"x"}, name="a")
    os.link(a.parent / "a.src" / "f", a.parent / "a.src" / "g")
    pack(str(a.parent / "a.src"), str(a), PackOptions(force=True))
    link = find_entry(a, lambda e: e.is_link)
    forge(a, puts=entry_put(link, target=fmt.ROOT_INO))
    with pytest.raises(PackError, match="g is a hard link to entry 1, not to a file"):
        merge([a], str(tmp_path / "out"))


def test_a_file_url_input_is_a_local_bundle(pack_tree, tmp_path) -> None:
    a = pack_tree({"f": b"x"}, name="a")
    merge([f"file://{a}"], str(tmp_path / "out"))
    with Bundle(tmp_path / "out") as m:
        assert m.read("f") == b"x"


def test_a_merge_with_a_zstd_shard_says_zstd(pack_tree, tmp_path) -> None:
    a = pack_tree({"f": b"x" * 5000}, name="a")
    b = pack_tree({"g": b"y" * 5000}, name="b", compression="zstd")
    merge([a, b], str(tmp_path / "out"))
    with Bundle(tmp_path / "out") as m:
        assert m.config.compression == fmt.COMPRESSION_ZSTD
        assert (m.read("f"), m.read("g")) == (b"x" * 5000, b"y" * 5000)


def test_sealing_never_stamps_a_shard_file_with_other_names(pack_tree, tmp_path) -> None:
    from bundlefs.storage.shard_writer import write_shard_header

    a = pack_tree({"f": b"x"}, name="a")
    os.link(a / fmt.shard_filename(0), tmp_path / "other-name")
    with pytest.raises(OSError, match="other names"):
        write_shard_header(str(tmp_path / "other-name"), 0, bytes(16))
