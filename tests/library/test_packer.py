"""The packer: what it stores for every kind of source entry, its options, determinism and
rotation. Each test packs a small tree and reads it back through ``Bundle``."""

from __future__ import annotations

import logging
import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from bundlefs import Bundle, PackError, PackOptions, pack
from bundlefs.core import format as fmt
from bundlefs.errors import EntryNotFound, NotARegularFile
from bundlefs.read.verify import verify
from bundlefs.storage import shard_writer
from bundlefs.storage.shard_writer import ShardWriter
from tests.conftest import (
    FIXED_MTIME_NS,
    HardLink,
    Symlink,
    build_tree,
    bundle_file_bytes,
    pseudo_random_bytes,
    source_paths,
)
from tests.support.hostile import read_values

MiB = 1024 * 1024
R = fmt.DEFAULT_RECORD_SIZE

# --- file sizes -----------------------------------------------------------------------------------

SIZES = [0, 1, R - 1, R, R + 1, 3 * R + 17, MiB - 1, MiB, MiB + 1, 2 * MiB + R + 3]


@pytest.fixture(scope="module")
def sized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One bundle holding a file of every size in SIZES (default layout), each after a 5-byte file,
    so that no size happens to start on a record boundary by accident."""
    spec = {}
    for i, size in enumerate(SIZES):
        spec[f"{i:02d}-a-prefix"] = b"12345"
        spec[f"{i:02d}-b-size-{size}"] = pseudo_random_bytes(size, seed=size)
    src = build_tree(tmp_path_factory.mktemp("sized") / "src", spec)
    dest = src.parent / "sized.bundle"
    pack(str(src), str(dest))
    return dest


@pytest.mark.parametrize("size", SIZES)
def test_file_of_size_reads_back(sized: Path, size: int) -> None:
    i = SIZES.index(size)
    with Bundle(sized) as b:
        path = f"{i:02d}-b-size-{size}"
        assert b.stat(path).st_size == size
        assert b.read(path) == pseudo_random_bytes(size, seed=size)


@pytest.mark.parametrize("size", [s for s in SIZES if s > fmt.DEFAULT_LARGE_FILE_THRESHOLD])
def test_file_larger_than_the_threshold_starts_a_record(sized: Path, size: int) -> None:
    with Bundle(sized) as b:
        entry = b.resolve(f"{SIZES.index(size):02d}-b-size-{size}")
        assert b.content.record_at(entry.shard, entry.offset).offset == entry.offset


def test_small_files_share_records(sized: Path) -> None:
    with Bundle(sized) as b:
        first, second = b.resolve("00-a-prefix"), b.resolve("01-a-prefix")
        assert b.content.record_at(0, first.offset) == b.content.record_at(0, second.offset)


def test_partial_reads_across_record_boundaries(sized: Path) -> None:
    size = 3 * R + 17
    want = pseudo_random_bytes(size, seed=size)
    with Bundle(sized) as b, b.open(f"{SIZES.index(size):02d}-b-size-{size}") as f:
        for start, length in [(R - 10, 20), (0, 2 * R + 1), (2 * R - 1, R + 2), (size - 1, 5)]:
            f.seek(start)
            assert f.read(length) == want[start : start + length]


def test_records_cover_each_shard_stream_without_gaps(sized: Path) -> None:
    with Bundle(sized) as b:
        for shard in range(b.config.shard_count):
            records = list(b.content.records(shard))
            offsets = [r.offset for r in records]
            ends = [r.end for r in records]
            assert offsets[0] == 0
            assert offsets[1:] == ends[:-1]
            assert ends[-1] == b.content.shard_info(shard).uncompressed_size
            assert all(r.stored_offset % b.config.block_size == 0 for r in records)


# --- zeros and sparse files -----------------------------------------------------------------------


def test_all_zero_file_is_stored_as_zeros_records(pack_tree) -> None:
    bundle = pack_tree({"zeros": bytes(4 * R)})
    with Bundle(bundle) as b:
        assert b.read("zeros") == bytes(4 * R)
        records = list(b.content.records(0))
        assert [r.flags for r in records] == [fmt.RECORD_ZEROS] * 4
        # Nothing but the header block is stored.
        assert (bundle / "shard-00000000").stat().st_size == b.config.block_size


def test_sparse_file_reads_back(tmp_path: Path, pack_tree) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "sparse", "wb") as f:
        f.seek(5 * MiB)
        f.write(b"middle")
        f.truncate(9 * MiB)
    bundle = pack_tree(src)
    with Bundle(bundle) as b:
        data = b.read("sparse")
    assert len(data) == 9 * MiB
    assert data == (src / "sparse").read_bytes()


# --- names ----------------------------------------------------------------------------------------

ODD_NAMES = [
    b"\xff",
    b"\x80\xfe latin-1 bytes",
    b"with space",
    b" leading and trailing ",
    b"new\nline",
    b"tab\there",
    b"\x01control",
    b"-dash",
    b"...",
    "ünïcödé ✓ 日本語 🎉".encode(),
    b"x" * 255,
]


def test_odd_byte_names_round_trip(pack_tree) -> None:
    spec = {name: name[:20] for name in ODD_NAMES}
    spec[b"dir \xff\n"] = {b"\xfe": b"inner"}
    bundle = pack_tree(spec)
    with Bundle(bundle) as b:
        assert b.listdir(b"") == sorted(spec)
        for name in ODD_NAMES:
            assert b.read(name) == name[:20]
        assert b.read(b"dir \xff\n/\xfe") == b"inner"


def test_str_api_round_trips_undecodable_names_with_surrogateescape(pack_tree) -> None:
    bundle = pack_tree({b"\xff": b"x"})
    with Bundle(bundle) as b:
        (name,) = b.listdir("")
        assert name == os.fsdecode(b"\xff")
        assert b.read(name) == b"x"


def test_names_are_listed_in_bytewise_order(pack_tree) -> None:
    names = [b"B", b"a", b"\xc3\xa9", b"Z", b"_", b"0", b"\x7f"]
    bundle = pack_tree({n: b"" for n in names})
    with Bundle(bundle) as b:
        assert b.listdir(b"") == sorted(names)


# --- directories ----------------------------------------------------------------------------------


def test_deep_nesting_of_60_levels(pack_tree) -> None:
    spec: dict = {"bottom.txt": b"at the bottom"}
    for level in reversed(range(60)):
        spec = {f"d{level:02d}": spec}
    bundle = pack_tree(spec)
    path = "/".join(f"d{level:02d}" for level in range(60))
    with Bundle(bundle) as b:
        assert b.read(path + "/bottom.txt") == b"at the bottom"
        assert b.stat(path).st_nlink == 2
        assert b.stat("d00").st_nlink == 3
        assert len([top for top, _d, _f in b.walk("")]) == 61


def test_empty_directories_are_kept(pack_tree) -> None:
    bundle = pack_tree({"empty": {}, "full": {"inner-empty": {}}})
    with Bundle(bundle) as b:
        assert b.listdir("empty") == []
        assert b.listdir("full/inner-empty") == []
        assert b.stat("empty").st_size == 0
        assert b.stat("empty").st_nlink == 2
        assert b.resolve("empty").first_child == 0


def test_empty_tree_packs_to_a_bundle_with_an_empty_root(tmp_path: Path, pack_tree) -> None:
    (tmp_path / "src").mkdir()
    bundle = pack_tree(tmp_path / "src")
    with Bundle(bundle) as b:
        assert b.listdir("") == []
        assert b.config.shard_count == 1
        assert b.config.entry_count == 1


def test_inodes_are_assigned_breadth_first_in_name_order(pack_tree) -> None:
    bundle = pack_tree({"b": {"y": b"", "x": b""}, "a": {"z": b""}, "c": b""})
    with Bundle(bundle) as b:
        inos = {p: b.lstat(p).st_ino for p in ("a", "b", "c", "a/z", "b/x", "b/y")}
    assert inos == {"a": 2, "b": 3, "c": 4, "a/z": 5, "b/x": 6, "b/y": 7}


# --- symlinks -------------------------------------------------------------------------------------


def test_symlinks_keep_their_targets_and_are_never_followed(pack_tree) -> None:
    bundle = pack_tree(
        {
            "file": b"content",
            "rel": Symlink("file"),
            "abs": Symlink("/etc/passwd"),
            "dangling": Symlink("no/such/thing"),
            "todir": Symlink("."),
            "loop": Symlink("loop"),
            "odd": Symlink(b"\xff target with\nnewline"),
        }
    )
    with Bundle(bundle) as b:
        assert b.readlink(b"rel") == b"file"
        assert b.readlink(b"abs") == b"/etc/passwd"
        assert b.readlink(b"dangling") == b"no/such/thing"
        assert b.readlink(b"todir") == b"."
        assert b.readlink(b"loop") == b"loop"
        assert b.readlink(b"odd") == b"\xff target with\nnewline"
        assert b.config.symlink_count == 6
        for name in ("rel", "abs", "dangling", "todir", "loop", "odd"):
            st = b.lstat(name)
            assert stat.S_ISLNK(st.st_mode)
            assert st.st_size == len(b.readlink(name.encode()))


def test_dangling_and_looping_symlinks_do_not_resolve(pack_tree) -> None:
    bundle = pack_tree({"dangling": Symlink("missing"), "loop": Symlink("loop")})
    with Bundle(bundle) as b:
        for name in ("dangling", "loop"):
            with pytest.raises(EntryNotFound):
                b.stat(name)


# --- hard links -----------------------------------------------------------------------------------


@pytest.fixture
def hardlinked(pack_tree) -> Path:
    return pack_tree(
        {
            "a": b"linked content",
            "d": {"b": HardLink("a"), "e": {"c": HardLink("a")}},
            "pair1": b"another pair",
            "pair2": HardLink("pair1"),
            "single": b"linked content",  # same bytes, not a link
        }
    )


def test_hard_links_share_one_inode(hardlinked: Path) -> None:
    with Bundle(hardlinked) as b:
        inos = {b.stat(p).st_ino for p in ("a", "d/b", "d/e/c")}
        assert len(inos) == 1
        assert b.stat("single").st_ino not in inos
        assert b.stat("pair1").st_ino == b.stat("pair2").st_ino


def test_hard_link_nlink_counts_names_in_the_bundle(hardlinked: Path) -> None:
    with Bundle(hardlinked) as b:
        assert [b.stat(p).st_nlink for p in ("a", "d/b", "d/e/c")] == [3, 3, 3]
        assert b.stat("pair2").st_nlink == 2
        assert b.stat("single").st_nlink == 1


def test_hard_linked_content_is_stored_once(hardlinked: Path) -> None:
    with Bundle(hardlinked) as b:
        assert b.read("d/e/c") == b.read("a") == b"linked content"
        assert b.config.file_count == 3
        assert b.config.hardlink_count == 3
        assert b.config.data_bytes == 2 * len(b"linked content") + len(b"another pair")


def test_hard_link_listed_in_a_directory_shows_the_target_inode(hardlinked: Path) -> None:
    with Bundle(hardlinked) as b:
        (entry,) = [d for d in b.scandir("d") if d.name == "b"]
        assert entry.inode() == b.stat("a").st_ino


def test_file_linked_from_outside_the_tree_has_nlink_one(tmp_path: Path, pack_tree) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "inside").write_bytes(b"x")
    os.link(src / "inside", tmp_path / "outside")
    with Bundle(pack_tree(src)) as b:
        assert b.stat("inside").st_nlink == 1


# --- metadata -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode", [0o644, 0o600, 0o000, 0o755, 0o4755, 0o2755, 0o6711, 0o1777, 0o7777], ids=oct
)
def test_file_modes_are_kept(tmp_path: Path, pack_tree, mode: int) -> None:
    src = build_tree(tmp_path / "src", {"f": b"x", "d": {}})
    os.chmod(src / "f", mode)
    os.chmod(src / "d", mode | 0o700)  # the packer must be able to list it
    with Bundle(pack_tree(src)) as b:
        assert b.stat("f").st_mode == stat.S_IFREG | mode
        assert b.stat("d").st_mode == stat.S_IFDIR | mode | 0o700


@pytest.mark.parametrize("mtime_ns", [-123456789012, -1, 0, 1, FIXED_MTIME_NS, 2**62], ids=str)
def test_mtimes_are_kept_to_the_nanosecond(tmp_path: Path, pack_tree, mtime_ns: int) -> None:
    src = build_tree(tmp_path / "src", {"f": b"x", "d": {}, "l": Symlink("f")})
    for name in ("f", "d", "l"):
        os.utime(src / name, ns=(mtime_ns, mtime_ns), follow_symlinks=False)
    os.utime(src, ns=(mtime_ns, mtime_ns))
    with Bundle(pack_tree(src)) as b:
        for name in ("", "f", "d", "l"):
            assert b.lstat(name).st_mtime_ns == mtime_ns, name


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_owners_are_kept(tmp_path: Path, pack_tree) -> None:
    src = build_tree(tmp_path / "src", {"a": b"", "b": b"", "c": b"", "l": Symlink("a")})
    os.chown(src / "a", 1000, 1000)
    os.chown(src / "b", 2**31, 7)
    os.chown(src / "c", 1000, 1000)
    os.chown(src / "l", 55, 66, follow_symlinks=False)
    os.chown(src, 0, 0)
    with Bundle(pack_tree(src)) as b:
        got = {n: (b.lstat(n).st_uid, b.lstat(n).st_gid) for n in ("a", "b", "c", "l")}
        assert got == {"a": (1000, 1000), "b": (2**31, 7), "c": (1000, 1000), "l": (55, 66)}
        assert b.config.owner_count == 4  # root, 1000:1000, 2^31:7, 55:66


def test_user_data_callback_is_attached_to_entries(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", {"a.txt": b"x", "b.bin": b"y"})

    def label(rel: bytes, st: os.stat_result) -> bytes | None:
        return b"text" if rel.endswith(b".txt") else None

    dest = tmp_path / "b.bundle"
    pack(str(src), str(dest), PackOptions(user_data=label))
    with Bundle(dest) as b:
        assert b.resolve("a.txt").user_data == b"text"
        assert b.resolve("b.bin").user_data == b""


# --- what is skipped ------------------------------------------------------------------------------


def test_exclude_patterns_match_names_and_paths(pack_tree) -> None:
    bundle = pack_tree(
        {
            "keep.txt": b"",
            "drop.tmp": b"",
            "cache": {"big": b"x"},
            "sub": {"drop.tmp": b"", "keep": b"", "only-here": b""},
        },
        excludes=("*.tmp", "cache", "sub/only-here"),
    )
    with Bundle(bundle) as b:
        assert b.listdir("") == ["keep.txt", "sub"]
        assert b.listdir("sub") == ["keep"]
        assert b.stat("sub").st_size == 1


def test_fifos_sockets_and_devices_are_stored_and_never_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    src = build_tree(tmp_path / "src", {"regular": b"data"})
    os.mkfifo(src / "fifo")
    monkeypatch.chdir(src)  # a relative socket path avoids the 108-byte limit of sun_path
    sock = socket.socket(socket.AF_UNIX)
    sock.bind("socket")
    special = {b"fifo": stat.S_IFIFO, b"socket": stat.S_IFSOCK}
    if os.geteuid() == 0:
        os.mknod(src / "chardev", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        os.mknod(src / "blockdev", stat.S_IFBLK | 0o640, os.makedev(7, 2**20 - 1))
        special |= {b"chardev": stat.S_IFCHR, b"blockdev": stat.S_IFBLK}
    opened: list[bytes] = []
    real_open = os.open

    def spy(path, *args, **kwargs):
        opened.append(os.fsencode(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    try:
        with caplog.at_level(logging.WARNING, logger="bundlefs"):
            summary = pack(str(src), str(tmp_path / "b.bundle"))
    finally:
        sock.close()
    monkeypatch.setattr(os, "open", real_open)
    assert summary.skipped == [] and "skipping" not in caplog.text
    assert summary.config.special_count == len(special)
    for name in special:
        assert not [p for p in opened if p.endswith(b"/" + name)]
    with Bundle(tmp_path / "b.bundle") as b:
        assert sorted(b.listdir("")) == sorted(["regular", *map(os.fsdecode, special)])
        for name, kind in special.items():
            st = b.stat(os.fsdecode(name), follow_symlinks=False)
            source = os.lstat(src / os.fsdecode(name))
            assert stat.S_IFMT(st.st_mode) == kind and st.st_mode == source.st_mode, name
            assert st.st_rdev == source.st_rdev and st.st_size == 0, name
            with pytest.raises(NotARegularFile):
                b.read(os.fsdecode(name))
            with pytest.raises(NotARegularFile):
                b.open(os.fsdecode(name), "rb")
        assert b.info().to_dict()["specials"] == len(special)
    assert verify(tmp_path / "b.bundle").ok


# --- determinism, destinations --------------------------------------------------------------------

RICH_SPEC = {
    "a": pseudo_random_bytes(3 * R, seed=5),
    "b": {"c": b"c" * 1000, "d": HardLink("a"), "e": {}},
    "l": Symlink("b/c"),
    "z": bytes(R + 1),
}


def test_two_packs_of_one_tree_are_byte_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    src = build_tree(tmp_path / "src", RICH_SPEC, mtime_ns=FIXED_MTIME_NS)
    pack(str(src), str(tmp_path / "one.bundle"))
    pack(str(src), str(tmp_path / "two.bundle"))
    one, two = (
        bundle_file_bytes(tmp_path / "one.bundle"),
        bundle_file_bytes(tmp_path / "two.bundle"),
    )
    assert (
        sorted(one)
        == sorted(two)
        == ["COMPLETE", "index/data.mdb", "index/pages", "shard-00000000"]
    )
    for name in one:
        assert one[name] == two[name], name


def test_two_builds_of_one_spec_pack_identically_without_source_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Different source directories (and inode numbers) with the same content and metadata.
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    for name in ("x", "y"):
        src = build_tree(tmp_path / f"{name}.src", RICH_SPEC, mtime_ns=FIXED_MTIME_NS)
        pack(str(src), str(tmp_path / f"{name}.bundle"), PackOptions(record_sources=False))
    assert bundle_file_bytes(tmp_path / "x.bundle") == bundle_file_bytes(tmp_path / "y.bundle")
    assert read_values(tmp_path / "x.bundle", fmt.DB_SOURCES) == {}


def test_two_builds_of_one_spec_differ_only_in_their_source_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    for name in ("x", "y"):
        src = build_tree(tmp_path / f"{name}.src", RICH_SPEC, mtime_ns=FIXED_MTIME_NS)
        pack(str(src), str(tmp_path / f"{name}.bundle"))
    x, y = tmp_path / "x.bundle", tmp_path / "y.bundle"
    assert (x / "shard-00000000").read_bytes()[32:] == (y / "shard-00000000").read_bytes()[32:]
    for db in fmt.ALL_DBS:
        assert (read_values(x, db) == read_values(y, db)) == (db != fmt.DB_SOURCES), db
    # One record per regular file holding content ("d" is "a"'s second name): its source's
    # inode number and ctime, 16 bytes.
    with Bundle(x) as b:
        files = {b.resolve(p).ino: p for p in ("a", "b/c", "z")}
    records = read_values(x, fmt.DB_SOURCES)
    assert sorted(records) == sorted(fmt.entry_key(ino) for ino in files)
    for ino, path in files.items():
        st = os.lstat(tmp_path / "x.src" / path)
        assert fmt.decode_source(ino, records[fmt.entry_key(ino)]) == (st.st_ctime_ns, st.st_ino)


def test_an_archive_source_records_no_source_stats(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", RICH_SPEC, mtime_ns=FIXED_MTIME_NS)
    subprocess.run(["tar", "-cf", str(tmp_path / "t.tar"), "-C", str(src), "."], check=True)
    pack(str(tmp_path / "t.tar"), str(tmp_path / "t.bundle"))
    assert read_values(tmp_path / "t.bundle", fmt.DB_SOURCES) == {}


def test_writeback_started_while_packing_changes_no_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = build_tree(tmp_path / "src", RICH_SPEC, mtime_ns=FIXED_MTIME_NS)
    pack(str(src), str(tmp_path / "default.bundle"), PackOptions(jobs=1, created_ns=1))
    started = []
    monkeypatch.setattr(ShardWriter, "WRITEBACK_BYTES", 1)  # after every record
    real = shard_writer.start_writeback  # still called: the kernel must accept what we ask

    def record(*args: int) -> None:
        started.append(args)
        real(*args)

    monkeypatch.setattr(shard_writer, "start_writeback", record)
    pack(str(src), str(tmp_path / "eager.bundle"), PackOptions(jobs=1, created_ns=1))
    assert len(started) >= 2
    assert bundle_file_bytes(tmp_path / "default.bundle") == bundle_file_bytes(
        tmp_path / "eager.bundle"
    )
    # The ranges handed to the kernel tile the shard from its start, in order.
    assert started[0][1] == 0
    for (_, off, length), (_, next_off, _) in zip(started, started[1:], strict=False):
        assert off + length == next_off


def test_created_ns_comes_from_the_option_then_source_date_epoch_then_the_clock(
    tmp_path: Path, pack_tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "12345")
    with Bundle(pack_tree({"f": b""}, name="with")) as b:
        assert b.config.created_ns == 12345 * 10**9
    with Bundle(pack_tree({"f": b""}, name="given", created_ns=-7)) as b:
        assert b.config.created_ns == -7
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    before = time.time_ns()
    with Bundle(pack_tree({"f": b""}, name="without")) as b:
        assert before <= b.config.created_ns <= time.time_ns()


def test_existing_destination_is_refused_and_left_alone(tmp_path: Path, pack_tree) -> None:
    bundle = pack_tree({"old": b"old"})
    before = bundle_file_bytes(bundle)
    src = build_tree(tmp_path / "new.src", {"new": b"new"})
    with pytest.raises(PackError, match="exists"):
        pack(str(src), str(bundle))
    assert bundle_file_bytes(bundle) == before


def test_existing_file_as_destination_is_refused(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", {"f": b""})
    (tmp_path / "dest").write_bytes(b"precious")
    with pytest.raises(PackError):
        pack(str(src), str(tmp_path / "dest"))
    assert (tmp_path / "dest").read_bytes() == b"precious"


def test_force_replaces_an_existing_bundle(tmp_path: Path, pack_tree) -> None:
    bundle = pack_tree({"old": b"old"})
    src = build_tree(tmp_path / "new.src", {"new": b"new"})
    pack(str(src), str(bundle), PackOptions(force=True))
    with Bundle(bundle) as b:
        assert b.listdir("") == ["new"]
    # Nothing is left beside it: no partial directory and no old copy.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bundle", "b.src", "new.src"]


def test_force_replaces_a_bundle_that_is_open(tmp_path: Path, pack_tree) -> None:
    bundle = pack_tree({"old": b"old"})
    src = build_tree(tmp_path / "new.src", {"new": b"new"})
    with Bundle(bundle) as old:
        assert old.read("old") == b"old"  # opens the shard
        pack(str(src), str(bundle), PackOptions(force=True))
        old.cache.clear()
        assert old.read("old") == b"old"  # from the (now unlinked) files it has open
        with Bundle(bundle) as new:
            assert new.read("new") == b"new"


def test_destination_inside_the_source_is_refused(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", {"f": b""})
    with pytest.raises(PackError):
        pack(str(src), str(src / "inside.bundle"))


def test_source_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(PackError):
        pack(str(tmp_path / "file"), str(tmp_path / "b.bundle"))
    with pytest.raises(PackError):
        pack(str(tmp_path / "missing"), str(tmp_path / "b.bundle"))


def test_no_partial_directory_is_left_after_a_pack(tmp_path: Path, pack_tree) -> None:
    pack_tree({"f": b"x"})
    assert not [p for p in os.listdir(tmp_path) if ".partial-" in p]


# --- layout options -------------------------------------------------------------------------------


def test_compression_none_stores_every_record_raw(tmp_path: Path, pack_tree) -> None:
    spec = {"text": b"compressible " * 50_000, "zeros": bytes(R)}
    bundle = pack_tree(spec, compression="none", record_size=64 * 1024)
    with Bundle(bundle) as b:
        assert b.config.compression_name == "none"
        flags = {r.flags for r in b.content.records(0)}
        assert flags <= {fmt.RECORD_RAW, fmt.RECORD_ZEROS}
        assert fmt.RECORD_RAW in flags
        assert b.read("text") == spec["text"]
        assert b.read("zeros") == spec["zeros"]


def test_lz4_compresses_compressible_content(pack_tree) -> None:
    spec = {"text": b"compressible " * 50_000}
    bundle = pack_tree(spec)
    with Bundle(bundle) as b:
        assert b.config.compression_name == "lz4"
        assert {r.flags for r in b.content.records(0)} == {0}
        assert b.info().shard_bytes < len(spec["text"]) // 10


def test_incompressible_records_are_stored_raw(pack_tree) -> None:
    bundle = pack_tree({"noise": pseudo_random_bytes(2 * R, seed=3, compressible=False)})
    with Bundle(bundle) as b:
        assert {r.flags for r in b.content.records(0)} == {fmt.RECORD_RAW}


@pytest.mark.parametrize(
    "record_size, block_size", [(4096, 512), (8192, 65536), (MiB, 4096), (16 * MiB, 1 << 20)]
)
def test_non_default_record_and_block_sizes(pack_tree, record_size: int, block_size: int) -> None:
    spec = {"f": pseudo_random_bytes(3 * record_size // 2 + 5, seed=9), "g": b"small"}
    bundle = pack_tree(spec, record_size=record_size, block_size=block_size)
    with Bundle(bundle) as b:
        assert (b.config.record_size, b.config.block_size) == (record_size, block_size)
        for r in b.content.records(0):
            assert r.length <= record_size
            assert r.stored_offset % block_size == 0
        assert (bundle / "shard-00000000").stat().st_size % block_size == 0
        assert b.read("f") == spec["f"]
        assert b.read("g") == b"small"


@pytest.mark.parametrize(
    "options",
    [
        dict(record_size=1000),
        dict(block_size=3000),
        dict(compression="brotli"),
        dict(compression="lz4:3"),
        dict(compression="zstd:99"),
        dict(meta=(("", "empty key"),)),
        dict(content_types=(("*.x", "not a media type"),)),
    ],
)
def test_invalid_layout_options_are_refused(tmp_path: Path, options: dict) -> None:
    src = build_tree(tmp_path / "src", {"f": b""})
    with pytest.raises(PackError):
        pack(str(src), str(tmp_path / "b.bundle"), PackOptions(**options))
    assert not (tmp_path / "b.bundle").exists()


def test_tiny_shard_size_rotates_to_several_shards_that_all_read_back(pack_tree) -> None:
    spec = {f"f{i:02d}": pseudo_random_bytes(3000 + 997 * i, seed=i) for i in range(30)}
    spec["big"] = pseudo_random_bytes(5 * 4096, seed=99, compressible=False)
    bundle = pack_tree(spec, shard_size=8192, record_size=4096, block_size=512)
    with Bundle(bundle) as b:
        count = b.config.shard_count
        assert count >= 5
        assert sorted(p.name for p in bundle.glob("shard-*")) == [
            fmt.shard_filename(i) for i in range(count)
        ]
        assert len({b.resolve(name).shard for name in spec}) > 1
        for name, content in spec.items():
            assert b.read(name) == content, name
        for i in range(count):
            info = b.content.shard_info(i)
            assert info.file_size == (bundle / fmt.shard_filename(i)).stat().st_size
            assert info.record_count == len(list(b.content.records(i)))


def test_config_counts_describe_the_tree(sample_bundle: Bundle, sample_tree: Path) -> None:
    paths = [sample_tree / os.fsdecode(p) for p in source_paths(sample_tree)]
    links = [p for p in paths if p.is_symlink()]
    dirs = [p for p in paths if p.is_dir() and not p.is_symlink()]
    names = [p for p in paths if p.is_file() and not p.is_symlink()]
    inodes = {p.stat().st_ino: p.stat().st_size for p in names}
    c = sample_bundle.config
    assert c.entry_count == 1 + len(paths)
    assert c.dir_count == 1 + len(dirs)
    assert c.symlink_count == len(links)
    assert c.file_count == len(inodes)
    assert c.hardlink_count == len(names) - len(inodes)
    assert c.data_bytes == sum(inodes.values())


def test_pack_summary_reports_the_bundle(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", {"f": b"12345"})
    summary = pack(str(src), str(tmp_path / "b.bundle"))
    assert summary.config.file_count == 1
    assert summary.config.data_bytes == 5
    assert summary.index_bytes == (tmp_path / "b.bundle" / "index" / "data.mdb").stat().st_size
    assert summary.stored_bytes == (tmp_path / "b.bundle" / "shard-00000000").stat().st_size
    assert summary.skipped == [] and summary.changed == []


def test_progress_callback_sees_the_counts(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", {"f": pseudo_random_bytes(3 * MiB, seed=1)})
    seen = []
    pack(str(src), str(tmp_path / "b.bundle"), progress=lambda p: seen.append(p.bytes_read))
    assert seen and all(0 < n <= 3 * MiB for n in seen)


def test_an_mtime_past_2262_is_one_clear_error(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", {"future": b"x"})
    os.utime(src / "future", (99999999999, 99999999999))
    with pytest.raises(PackError, match="mtime of 'future' is outside what a bundle stores"):
        pack(str(src), str(tmp_path / "b.bundle"))
    assert not (tmp_path / "b.bundle").exists()


@pytest.mark.parametrize(
    "env, created_ns, message",
    [
        ("-5", None, "SOURCE_DATE_EPOCH='-5' is not a whole number"),
        ("soon", None, "SOURCE_DATE_EPOCH='soon' is not a whole number"),
        ("99999999999", None, "creation time is outside"),
        (None, 2**63, "creation time is outside"),
    ],
)
def test_a_bad_creation_time_fails_before_packing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env, created_ns, message
) -> None:
    src = build_tree(tmp_path / "src", {"f": b"x"})
    if env is None:
        monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    else:
        monkeypatch.setenv("SOURCE_DATE_EPOCH", env)
    with pytest.raises(PackError, match=message):
        pack(str(src), str(tmp_path / "b.bundle"), PackOptions(created_ns=created_ns))
    assert not (tmp_path / "b.bundle").exists()
