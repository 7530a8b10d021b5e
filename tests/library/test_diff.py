"""``bundlefs.diff``: two real bundles packed from two trees, compared from their indexes alone.

Every kind of change, renames (and when they are not paired), hard links, symlinks, whole
directories added and removed, type changes, identical bundles, bundles whose shards are gone,
bundles of every format version, and the shard identity a merge shares.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import bundlefs
from bundlefs import PackOptions, pack
from bundlefs.errors import NotABundleError
from bundlefs.packing.merge import merge
from bundlefs.packing.user_data import UserDataFile
from bundlefs.read.diff import Change, digest_of, same_content, shared_shards
from bundlefs.storage.index import IndexReader
from tests.conftest import FIXED_MTIME_NS, HardLink, Symlink, TreeSpec, build_tree
from tests.support.legacy_trees import (
    SOURCE_DATE_EPOCH,
    V1_BUNDLE,
    V1_PACK_OPTIONS,
    V2_BUNDLE,
    V3_BUNDLE,
    V4_BUNDLE,
    V5_BUNDLE,
    build_v1_tree,
)

BASE: TreeSpec = {
    "a.txt": b"alpha\n",
    "b.txt": b"bravo\n",
    "d": {"x.bin": b"x" * 5000, "sub": {"y.txt": b"yankee\n"}},
    "link": Symlink("a.txt"),
}


def packed(tmp_path: Path, name: str, spec: TreeSpec, edit: Callable[[Path], None] | None = None):
    """``spec`` built (fixed mtimes), edited by ``edit``, packed: the bundle's path."""
    src = build_tree(tmp_path / f"{name}.src", spec, mtime_ns=FIXED_MTIME_NS)
    if edit is not None:
        edit(src)
    dest = tmp_path / f"{name}.bundle"
    pack(str(src), str(dest), PackOptions(created_ns=0))
    return dest


def lines(old: Path | str, new: Path | str, **keywords) -> list[tuple[str, ...]]:
    """The changes as name-status rows: (status, path) or ("R", old, new)."""
    rows = []
    for c in bundlefs.diff(old, new, **keywords):
        paths = (c.path,) if c.old_path is None else (c.old_path, c.path)
        rows.append((c.status, *(os.fsdecode(p) for p in paths)))
    return rows


def changes(tmp_path: Path, after: TreeSpec, edit=None, before: TreeSpec = BASE) -> list:
    return lines(packed(tmp_path, "old", before), packed(tmp_path, "new", after, edit))


def with_(spec: TreeSpec, **top: object) -> TreeSpec:
    return {**spec, **top}


def test_identical_bundles_have_no_changes(tmp_path: Path) -> None:
    assert changes(tmp_path, BASE) == []


def test_a_bundle_diffed_with_itself_has_no_changes(sample_bundle_path: Path) -> None:
    assert lines(sample_bundle_path, sample_bundle_path) == []


def test_an_added_file_is_a(tmp_path: Path) -> None:
    assert changes(tmp_path, with_(BASE, **{"c.txt": b"charlie\n"})) == [("A", "c.txt")]


def test_a_removed_file_is_d(tmp_path: Path) -> None:
    after = {k: v for k, v in BASE.items() if k != "b.txt"}
    assert changes(tmp_path, after) == [("D", "b.txt")]


def test_content_changed_at_the_same_size_is_m(tmp_path: Path) -> None:
    found = list(
        bundlefs.diff(
            packed(tmp_path, "old", BASE),
            packed(tmp_path, "new", with_(BASE, **{"a.txt": b"ALPHA\n"})),
        )
    )
    assert found == [Change("M", b"a.txt", "file", ("content",))]


def test_content_changed_in_size_is_m(tmp_path: Path) -> None:
    assert changes(tmp_path, with_(BASE, **{"b.txt": b"bravo bravo\n"})) == [("M", "b.txt")]


def test_mode_change_alone_is_metadata_only(tmp_path: Path) -> None:
    new = packed(tmp_path, "new", BASE, lambda src: os.chmod(src / "b.txt", 0o600))
    found = list(bundlefs.diff(packed(tmp_path, "old", BASE), new))
    assert found == [Change("m", b"b.txt", "file", ("mode",))]


def test_mtime_change_alone_is_metadata_only(tmp_path: Path) -> None:
    def touch(src: Path) -> None:
        os.utime(src / "d" / "x.bin", ns=(FIXED_MTIME_NS + 1, FIXED_MTIME_NS + 1))

    found = list(bundlefs.diff(packed(tmp_path, "old", BASE), packed(tmp_path, "new", BASE, touch)))
    assert found == [Change("m", b"d/x.bin", "file", ("mtime",))]


def test_user_data_change_is_metadata_only(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", BASE, mtime_ns=FIXED_MTIME_NS)
    bundles = []
    for label in (1, 2):
        jsonl = tmp_path / f"meta{label}.jsonl"
        jsonl.write_text(f'{{"file_name": "a.txt", "label": {label}}}\n')
        bundles.append(tmp_path / f"{label}.bundle")
        pack(str(src), str(bundles[-1]), PackOptions(user_data=UserDataFile(str(jsonl))))
    found = list(bundlefs.diff(*bundles))
    assert found == [Change("m", b"a.txt", "file", ("user_data",))]


def test_a_symlink_target_change_is_m(tmp_path: Path) -> None:
    found = list(
        bundlefs.diff(
            packed(tmp_path, "old", BASE),
            packed(tmp_path, "new", with_(BASE, link=Symlink("b.txt"))),
        )
    )
    assert found == [Change("M", b"link", "symlink", ("target",))]


def test_a_file_becoming_a_directory_is_t_then_its_contents_added(tmp_path: Path) -> None:
    after = with_(BASE, **{"b.txt": {"inner": b"in\n"}})
    assert changes(tmp_path, after) == [("T", "b.txt"), ("A", "b.txt/inner")]


def test_a_directory_becoming_a_file_is_t_then_its_contents_removed(tmp_path: Path) -> None:
    after = with_(BASE, d=b"now a file\n")
    assert changes(tmp_path, after) == [
        ("T", "d"),
        ("D", "d/sub"),
        ("D", "d/sub/y.txt"),
        ("D", "d/x.bin"),
    ]


def test_an_added_directory_lists_itself_and_every_path_below(tmp_path: Path) -> None:
    after = with_(BASE, e={"one": b"1\n", "deeper": {"two": b"2\n"}, "empty": {}})
    assert changes(tmp_path, after) == [
        ("A", "e"),
        ("A", "e/deeper"),
        ("A", "e/deeper/two"),
        ("A", "e/empty"),
        ("A", "e/one"),
    ]


def test_a_removed_directory_lists_itself_and_every_path_below(tmp_path: Path) -> None:
    after = {k: v for k, v in BASE.items() if k != "d"}
    assert changes(tmp_path, after) == [
        ("D", "d"),
        ("D", "d/sub"),
        ("D", "d/sub/y.txt"),
        ("D", "d/x.bin"),
    ]


def test_content_and_metadata_changed_together_is_m_listing_both(tmp_path: Path) -> None:
    def edit(src: Path) -> None:
        (src / "a.txt").write_bytes(b"ALPHA!\n")
        os.chmod(src / "a.txt", 0o640)

    found = list(bundlefs.diff(packed(tmp_path, "old", BASE), packed(tmp_path, "new", BASE, edit)))
    assert found == [Change("M", b"a.txt", "file", ("content", "mode", "mtime"))]


def test_changes_come_in_tree_order_depth_first(tmp_path: Path) -> None:
    after = with_(BASE, **{"a.txt": b"A\n", "z": b"z\n"})
    after["d"] = {"x.bin": b"y" * 5000, "sub": {"y.txt": b"yankee\n", "w": b"w\n"}}
    assert changes(tmp_path, after) == [
        ("M", "a.txt"),
        ("A", "d/sub/w"),
        ("M", "d/x.bin"),
        ("A", "z"),
    ]


def test_a_moved_file_is_one_rename(tmp_path: Path) -> None:
    after = {k: v for k, v in BASE.items() if k != "d"}
    after["d"] = {"sub": {"y.txt": b"yankee\n"}, "moved.bin": b"x" * 5000}
    found = list(bundlefs.diff(packed(tmp_path, "old", BASE), packed(tmp_path, "new", after)))
    assert found == [Change("R", b"d/moved.bin", "file", (), b"d/x.bin")]


def test_a_rename_says_what_metadata_changed_with_it(tmp_path: Path) -> None:
    after = {k: v for k, v in BASE.items() if k != "b.txt"}
    after["c.txt"] = b"bravo\n"
    new = packed(tmp_path, "new", after, lambda src: os.chmod(src / "c.txt", 0o600))
    found = list(bundlefs.diff(packed(tmp_path, "old", BASE), new))
    assert found == [Change("R", b"c.txt", "file", ("mode",), b"b.txt")]


def test_without_renames_a_move_is_d_and_a(tmp_path: Path) -> None:
    after = {k: v for k, v in BASE.items() if k != "b.txt"}
    after["c.txt"] = b"bravo\n"
    old, new = packed(tmp_path, "old", BASE), packed(tmp_path, "new", after)
    assert lines(old, new, renames=False) == [("D", "b.txt"), ("A", "c.txt")]


def test_two_removed_files_of_one_content_pair_with_nothing(tmp_path: Path) -> None:
    before = with_(BASE, **{"twin1": b"same\n", "twin2": b"same\n"})
    after = with_(BASE, **{"other": b"same\n"})
    assert changes(tmp_path, after, before=before) == [
        ("A", "other"),
        ("D", "twin1"),
        ("D", "twin2"),
    ]


def test_an_empty_file_moved_is_not_a_rename(tmp_path: Path) -> None:
    before = with_(BASE, **{"empty1": b""})
    after = with_(BASE, **{"empty2": b""})
    assert changes(tmp_path, after, before=before) == [("D", "empty1"), ("A", "empty2")]


def test_a_renamed_directory_pairs_each_file_inside(tmp_path: Path) -> None:
    after = {k: v for k, v in BASE.items() if k != "d"}
    after["e"] = BASE["d"]
    assert changes(tmp_path, after) == [
        ("D", "d"),
        ("D", "d/sub"),
        ("A", "e"),
        ("A", "e/sub"),
        ("R", "d/sub/y.txt", "e/sub/y.txt"),
        ("R", "d/x.bin", "e/x.bin"),
    ]


def test_a_hard_linked_file_changed_shows_under_each_name(tmp_path: Path) -> None:
    before = with_(BASE, **{"h1": b"linked\n", "h2": HardLink("h1")})
    after = with_(BASE, **{"h1": b"LINKED\n", "h2": HardLink("h1")})
    assert changes(tmp_path, after, before=before) == [("M", "h1"), ("M", "h2")]


def test_a_hard_link_removed_is_only_that_name(tmp_path: Path) -> None:
    before = with_(BASE, **{"h1": b"linked\n", "h2": HardLink("h1"), "h3": HardLink("h1")})
    after = with_(BASE, **{"h1": b"linked\n", "h2": HardLink("h1")})
    assert changes(tmp_path, after, before=before) == [("D", "h3")]


def test_a_hard_link_becoming_a_copy_is_no_change(tmp_path: Path) -> None:
    before = with_(BASE, **{"h1": b"linked\n", "h2": HardLink("h1")})
    after = with_(BASE, **{"h1": b"linked\n", "h2": b"linked\n"})
    assert changes(tmp_path, after, before=before) == []


def test_a_root_metadata_change_is_the_path_dot(tmp_path: Path) -> None:
    new = packed(tmp_path, "new", BASE, lambda src: os.chmod(src, 0o700))
    assert lines(packed(tmp_path, "old", BASE), new) == [("m", ".")]


def test_a_fifo_added_is_a_of_kind_fifo(tmp_path: Path) -> None:
    def add_fifo(src: Path) -> None:
        os.mkfifo(src / "pipe")
        os.utime(src, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS))  # the root's mtime as it was

    new = packed(tmp_path, "new", BASE, add_fifo)
    found = list(bundlefs.diff(packed(tmp_path, "old", BASE), new))
    assert found == [Change("A", b"pipe", "fifo")]


def test_bundles_without_their_shards_still_diff(tmp_path: Path) -> None:
    after = with_(BASE, **{"a.txt": b"ALPHA\n", "c.txt": b"c\n"})
    old, new = packed(tmp_path, "old", BASE), packed(tmp_path, "new", after)
    for shard in [*old.glob("shard-*"), *new.glob("shard-*")]:
        shard.unlink()
    assert lines(old, new) == [("M", "a.txt"), ("A", "c.txt")]


def test_damaged_shards_change_nothing_in_a_diff(tmp_path: Path) -> None:
    after = with_(BASE, **{"b.txt": b"BRAVO\n"})
    old, new = packed(tmp_path, "old", BASE), packed(tmp_path, "new", after)
    for shard in [*old.glob("shard-*"), *new.glob("shard-*")]:
        shard.write_bytes(b"\0" * 100)
    assert lines(old, new) == [("M", "b.txt")]


def test_a_missing_bundle_raises_before_any_change(tmp_path: Path) -> None:
    with pytest.raises(NotABundleError):
        list(bundlefs.diff(tmp_path / "nothing", packed(tmp_path, "new", BASE)))


def test_every_legacy_version_of_one_tree_has_no_changes() -> None:
    assert lines(V1_BUNDLE, V2_BUNDLE) == []
    assert lines(V2_BUNDLE, V3_BUNDLE) == []


def test_the_version_5_bundle_and_todays_pack_of_its_tree_have_no_changes(tmp_path: Path) -> None:
    # Version 6 changed no entry byte: the values compare equal outside their locations, digests
    # included (the source records version 6 adds are not the tree's, and diff never reads them).
    src = build_v1_tree(tmp_path / "src")
    new = tmp_path / "new.bundle"
    pack(str(src), str(new), PackOptions(**V1_PACK_OPTIONS, created_ns=SOURCE_DATE_EPOCH * 10**9))
    assert lines(V5_BUNDLE, new) == []


def test_a_legacy_bundle_against_todays_pack_finds_the_changed_file(tmp_path: Path) -> None:
    src = build_v1_tree(tmp_path / "src")
    target = src / "d1" / "f02.bin"
    data = bytearray(target.read_bytes())
    data[10] ^= 0xFF  # the same size: only the CRC (no digest in a version-3 bundle) tells
    st = target.stat()
    target.write_bytes(bytes(data))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    new = tmp_path / "new.bundle"
    pack(str(src), str(new), PackOptions(**V1_PACK_OPTIONS, created_ns=SOURCE_DATE_EPOCH * 10**9))
    assert lines(V3_BUNDLE, new) == [("M", "d1/f02.bin")]
    assert lines(V1_BUNDLE, new) == [("M", "d1/f02.bin")]


def test_a_merge_shares_every_shard_and_diffs_as_the_same_tree(tmp_path: Path) -> None:
    old = packed(tmp_path, "old", BASE)
    new = tmp_path / "merged.bundle"
    merge([str(old)], str(new))
    a, b = IndexReader(str(old)), IndexReader(str(new))
    try:
        assert shared_shards(a, b) == {s: s for s in range(a.config.shard_count)}
    finally:
        a.close()
        b.close()
    assert lines(old, new) == []


def test_same_content_trusts_a_shared_shard_location(tmp_path: Path) -> None:
    old = packed(tmp_path, "old", BASE)
    new = tmp_path / "merged.bundle"
    merge([str(old)], str(new))
    with bundlefs.Bundle(old) as a, bundlefs.Bundle(new) as b:
        ea, eb = a.resolve("d/x.bin"), b.resolve("d/x.bin")
        other = b.resolve("a.txt")
    assert same_content(ea, eb, {0: 0}) and same_content(ea, eb)
    assert not same_content(ea, other, {0: 0})


def test_a_copy_is_compared_to_its_original_as_the_same(tmp_path: Path) -> None:
    old = packed(tmp_path, "old", BASE)
    shutil.copytree(old, tmp_path / "copy.bundle")
    assert lines(old, tmp_path / "copy.bundle") == []


# CRC32C is linear: four chosen bytes give any CRC (Stigge et al., "Reversing CRC").
_POLY = 0x82F63B78  # CRC32C, reflected
_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)
_BY_TOP = {t >> 24: i for i, t in enumerate(_TABLE)}


def forged(prefix: bytes, crc: int) -> bytes:
    """``prefix`` and four bytes after it that make its CRC32C ``crc``."""
    import crc32c

    wanted, indexes = crc ^ 0xFFFFFFFF, []
    for _ in range(4):
        i = _BY_TOP[wanted >> 24]
        indexes.append(i)
        wanted = ((wanted ^ _TABLE[i]) << 8) & 0xFFFFFFFF
    state, tail = crc32c.crc32c(prefix) ^ 0xFFFFFFFF, bytearray()
    for i in reversed(indexes):
        tail.append((state ^ i) & 0xFF)
        state = (state >> 8) ^ _TABLE[(state ^ tail[-1]) & 0xFF]
    return prefix + bytes(tail)


def test_a_change_keeping_size_and_crc_is_seen_only_with_digests(tmp_path: Path) -> None:
    import crc32c

    original = b"the original content of the file\n"
    changed = forged(b"THE ORIGINAL content of the f", crc32c.crc32c(original))
    assert len(changed) == len(original) and crc32c.crc32c(changed) == crc32c.crc32c(original)
    old = packed(tmp_path, "old", with_(BASE, f=original))
    new = packed(tmp_path, "new", with_(BASE, f=changed))
    with bundlefs.Bundle(new) as b:
        assert digest_of(b.resolve("f")) == hashlib.sha256(changed).digest()[:16]
    assert lines(old, new) == [("M", "f")]


def test_renames_of_two_files_of_one_size_and_crc_pair_by_digest(tmp_path: Path) -> None:
    import crc32c

    original = b"the original content of the file\n"
    twin = forged(b"THE ORIGINAL content of the f", crc32c.crc32c(original))
    old = packed(tmp_path, "old", with_(BASE, f1=original, f2=twin))
    new = packed(tmp_path, "new", with_(BASE, g1=original, g2=twin))
    # By size and CRC32C the two would be one identity of two files each: no rename at all.
    assert lines(old, new) == [("R", "f1", "g1"), ("R", "f2", "g2")]


def test_a_rename_from_a_v4_bundle_pairs_by_size_and_crc(tmp_path: Path) -> None:
    src = build_v1_tree(tmp_path / "src")
    st = (src / "d1").stat()
    os.rename(src / "d1" / "f02.bin", src / "d1" / "moved.bin")
    os.utime(src / "d1", ns=(st.st_atime_ns, st.st_mtime_ns))
    new = tmp_path / "new.bundle"
    pack(str(src), str(new), PackOptions(**V1_PACK_OPTIONS, created_ns=SOURCE_DATE_EPOCH * 10**9))
    assert lines(V4_BUNDLE, new) == [("R", "d1/f02.bin", "d1/moved.bin")]


def test_a_content_type_new_in_new_changes_nothing_else(tmp_path: Path) -> None:
    png = b"\x89PNG\r\n\x1a\n" + bytes(40)
    assert changes(tmp_path, with_(BASE, **{"z.png": png})) == [("A", "z.png")]


def test_an_owner_new_in_new_is_a_metadata_change(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    new = packed(tmp_path, "new", BASE, lambda src: os.chown(src / "b.txt", 1234, 5678))
    found = list(bundlefs.diff(packed(tmp_path, "old", BASE), new))
    assert found == [Change("m", b"b.txt", "file", ("owner",))]


def test_a_compacted_bundle_diffs_as_the_tree_it_holds(tmp_path: Path) -> None:
    from bundlefs import CompactOptions, compact
    from bundlefs.packing.merge import MergeOptions

    old = packed(tmp_path, "old", BASE)
    after = with_(BASE, **{"a.txt": b"ALPHA\n"})
    new = packed(tmp_path, "new", after)
    merged = tmp_path / "merged.bundle"
    merge([str(old), str(new)], str(merged), MergeOptions(on_clash="last"))  # old's a.txt dead
    compacted = tmp_path / "compacted.bundle"
    summary = compact(str(merged), str(compacted), CompactOptions(min_live=1.0))
    assert summary.rewritten >= 1  # files moved to new shards and offsets
    assert lines(merged, compacted) == []
    assert lines(old, compacted) == [("M", "a.txt")]


def test_a_pack_on_a_base_shares_its_shards_and_diffs_to_what_changed(tmp_path: Path) -> None:
    old = packed(tmp_path, "old", BASE)
    after = with_(BASE, **{"a.txt": b"ALPHA\n", "c.txt": b"charlie\n"})
    src = build_tree(tmp_path / "new.src", after, mtime_ns=FIXED_MTIME_NS)
    new = tmp_path / "new.bundle"
    pack(str(src), str(new), PackOptions(created_ns=0), base=str(old))
    a, b = IndexReader(str(old)), IndexReader(str(new))
    try:
        shared = shared_shards(a, b)
    finally:
        a.close()
        b.close()
    with bundlefs.Bundle(old) as x, bundlefs.Bundle(new) as y:
        kept_old, kept_new = x.resolve("d/x.bin"), y.resolve("d/x.bin")
    assert shared.get(kept_old.shard) == kept_new.shard  # the base's bytes, linked
    assert kept_new.offset == kept_old.offset
    assert lines(old, new) == [("M", "a.txt"), ("A", "c.txt")]
