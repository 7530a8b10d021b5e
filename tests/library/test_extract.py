"""``extract``: a packed tree comes back exactly, and nothing is ever written outside DEST."""

from __future__ import annotations

import os

import pytest

from bundlefs import Bundle, EntryNotFound, PackOptions, pack
from bundlefs.errors import ExtractError
from bundlefs.read.extract import extract
from tests.conftest import flip_byte
from tests.support.trees import (
    ODD_NAME,
    PRE_1970_NS,
    assert_one_line_error,
    build_rich_tree,
    diff_r,
    run_cli,
    snapshot,
)


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory):
    """(source tree, bundle) of the rich tree, packed with small records. Read-only."""
    base = tmp_path_factory.mktemp("rich")
    src = build_rich_tree(base / "src")
    bundle = base / "rich.bundle"
    pack(str(src), str(bundle), PackOptions(record_size=16 * 1024))
    return src, bundle


def test_cli_pack_then_extract_gives_a_tree_identical_to_the_source(tmp_path):
    src = build_rich_tree(tmp_path / "src")
    assert run_cli("pack", "--record-size", "16K", src, tmp_path / "b").returncode == 0
    result = run_cli("extract", tmp_path / "b", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert diff_r(src, tmp_path / "out").returncode == 0
    assert snapshot(tmp_path / "out") == snapshot(src)


def test_extract_restores_modes_and_nanosecond_mtimes_including_before_1970(rich, tmp_path):
    src, bundle = rich
    with Bundle(bundle) as b:
        extract(b, tmp_path / "out")
    out = tmp_path / "out"
    assert os.lstat(out / "hello.txt").st_mtime_ns == PRE_1970_NS
    assert os.lstat(out / "dangling").st_mtime_ns == PRE_1970_NS
    assert os.lstat(out / "locked").st_mtime_ns == PRE_1970_NS
    for name in ("a/script.sh", "a/private", "a/setgid", "locked", "a"):
        assert os.lstat(out / name).st_mode == os.lstat(src / name).st_mode, name
        assert os.lstat(out / name).st_mtime_ns == os.lstat(src / name).st_mtime_ns, name


def test_extract_recreates_hard_links_as_one_inode(rich, tmp_path):
    _src, bundle = rich
    with Bundle(bundle) as b:
        summary = extract(b, tmp_path / "out")
    first = os.stat(tmp_path / "out" / "shared")
    second = os.stat(tmp_path / "out" / "a" / "b" / "shared-too")
    assert first.st_ino == second.st_ino
    assert first.st_nlink == 2
    assert summary.hardlinks == 1


def test_extract_keeps_symlinks_as_links_even_dangling_ones(rich, tmp_path):
    _src, bundle = rich
    with Bundle(bundle) as b:
        extract(b, tmp_path / "out")
    assert os.readlink(tmp_path / "out" / "dangling") == "no/such/target"
    assert os.readlink(tmp_path / "out" / "dirlink") == "a/b"
    assert os.readlink(os.fsencode(tmp_path / "out" / "odd-link")) == ODD_NAME


def test_extract_round_trips_non_utf8_names(rich, tmp_path):
    _src, bundle = rich
    with Bundle(bundle) as b:
        extract(b, tmp_path / "out")
    assert ODD_NAME in os.listdir(os.fsencode(tmp_path / "out"))


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give files away")
def test_extract_as_root_restores_owners(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "theirs").write_bytes(b"x")
    os.chown(src / "theirs", 1234, 5678)
    pack(str(src), str(tmp_path / "b"))
    with Bundle(tmp_path / "b") as b:
        extract(b, tmp_path / "out")
    st = os.lstat(tmp_path / "out" / "theirs")
    assert (st.st_uid, st.st_gid) == (1234, 5678)


def test_extract_of_paths_restores_only_those_subtrees(rich, tmp_path):
    _src, bundle = rich
    result = run_cli("extract", bundle, tmp_path / "out", "a/b", "hello.txt", ODD_NAME)
    assert result.returncode == 0, result.stderr
    out = os.fsencode(tmp_path / "out")
    assert sorted(os.listdir(out)) == sorted([b"a", b"hello.txt", ODD_NAME])
    assert sorted(os.listdir(os.path.join(out, b"a"))) == [b"b"]
    assert os.path.isfile(os.path.join(out, b"a", b"b", b"c", b"deep.txt"))


def test_extract_refuses_a_path_through_a_symlink_and_writes_nothing_outside(tmp_path):
    # A hostile tree: "escape" points outside the tree (absolute) and "up" climbs out of DEST.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"untouched")
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(outside, src / "escape")
    os.symlink("../../outside", src / "up")
    pack(str(src), str(tmp_path / "b"))
    for path in ("escape/victim", "up/victim", "escape/new-file"):
        result = run_cli("extract", "--force", tmp_path / "b", tmp_path / "out", path)
        line = assert_one_line_error(result)
        assert "symbolic link" in line
    assert sorted(os.listdir(outside)) == ["victim"]
    assert (outside / "victim").read_bytes() == b"untouched"


def test_extract_of_a_hostile_tree_creates_its_symlinks_without_following_them(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(outside, src / "escape")
    pack(str(src), str(tmp_path / "b"))
    assert run_cli("extract", tmp_path / "b", tmp_path / "out").returncode == 0
    assert os.readlink(tmp_path / "out" / "escape") == str(outside)
    assert os.listdir(outside) == []


def test_extract_with_force_never_writes_through_a_symlink_already_in_dest(tmp_path):
    # DEST holds "a" -> outside; the bundle has a directory "a" with a file in it.
    outside = tmp_path / "outside"
    outside.mkdir()
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "file").write_bytes(b"bundle content")
    pack(str(src), str(tmp_path / "b"))
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(outside, dest / "a")
    with Bundle(tmp_path / "b") as b:
        extract(b, dest, force=True)
    assert os.listdir(outside) == []
    assert not os.path.islink(dest / "a")
    assert (dest / "a" / "file").read_bytes() == b"bundle content"


def test_extract_refuses_dotdot_in_a_path(rich, tmp_path):
    _src, bundle = rich
    with Bundle(bundle) as b, pytest.raises(ExtractError):
        extract(b, tmp_path / "out", ["a/../../etc"])


def test_extract_of_a_missing_path_is_an_error(rich, tmp_path):
    _src, bundle = rich
    with Bundle(bundle) as b, pytest.raises(EntryNotFound):
        extract(b, tmp_path / "out", ["no/such/thing"])


def test_extract_into_a_non_empty_dest_needs_force(rich, tmp_path):
    _src, bundle = rich
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "hello.txt").write_bytes(b"old")
    line = assert_one_line_error(run_cli("extract", bundle, dest))
    assert "--force" in line
    assert (dest / "hello.txt").read_bytes() == b"old"


def test_extract_with_force_replaces_files_in_the_way(rich, tmp_path):
    _src, bundle = rich
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "hello.txt").write_bytes(b"old")
    (dest / "unrelated").write_bytes(b"kept")
    assert run_cli("extract", "--force", bundle, dest).returncode == 0
    assert (dest / "hello.txt").read_bytes() == b"hello\n"
    assert (dest / "unrelated").read_bytes() == b"kept"


def test_extract_to_a_dest_whose_parent_is_missing_says_which(rich, tmp_path):
    _src, bundle = rich
    line = assert_one_line_error(run_cli("extract", bundle, tmp_path / "no" / "out"))
    assert (
        line
        == f"bundlefs: error: cannot create {tmp_path}/no/out: {tmp_path}/no is not a directory"
    )
    assert os.listdir(tmp_path) == []


def test_extract_into_an_empty_existing_directory_needs_no_force(rich, tmp_path):
    _src, bundle = rich
    (tmp_path / "dest").mkdir()
    assert run_cli("extract", bundle, tmp_path / "dest").returncode == 0
    assert (tmp_path / "dest" / "hello.txt").read_bytes() == b"hello\n"


def test_extract_skips_a_damaged_file_names_it_and_restores_the_rest(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "damaged.bin").write_bytes(os.urandom(40_000))  # incompressible: stored raw
    (src / "fine.txt").write_bytes(b"fine\n" * 1000)
    pack(str(src), str(tmp_path / "b"), PackOptions(record_size=16 * 1024))
    flip_byte(tmp_path / "b" / "shard-00000000", 4096 + 10)
    result = run_cli("extract", tmp_path / "b", tmp_path / "out")
    assert result.returncode == 1
    assert b"damaged.bin" in result.stderr
    assert b"Traceback" not in result.stderr
    assert not (tmp_path / "out" / "damaged.bin").exists()
    assert (tmp_path / "out" / "fine.txt").read_bytes() == b"fine\n" * 1000


# --- special files (format version 4) -------------------------------------------------------------


def _tar_with_specials(path) -> None:
    """A tar holding a FIFO and a character device 1:3: a bundle of them needs no root."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, kind, mode in (
            ("fifo", tarfile.FIFOTYPE, 0o640),
            ("null", tarfile.CHRTYPE, 0o666),
        ):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = kind, mode, 1_600_000_000
            info.devmajor, info.devminor = (1, 3) if kind == tarfile.CHRTYPE else (0, 0)
            tar.addfile(info, io.BytesIO(b""))


def test_extract_makes_fifos_and_as_root_devices(tmp_path):
    import stat

    _tar_with_specials(tmp_path / "s.tar")
    pack(str(tmp_path / "s.tar"), str(tmp_path / "b"))
    with Bundle(tmp_path / "b") as b:
        summary = extract(b, tmp_path / "out", owners=False)
    fifo = os.lstat(tmp_path / "out" / "fifo")
    assert fifo.st_mode == stat.S_IFIFO | 0o640 and fifo.st_mtime_ns == 1_600_000_000 * 10**9
    if os.geteuid() == 0:
        null = os.lstat(tmp_path / "out" / "null")
        assert (null.st_mode, null.st_rdev) == (stat.S_IFCHR | 0o666, os.makedev(1, 3))
        assert summary.ok and summary.specials == 2


def test_a_device_mknod_refuses_is_one_warning_and_the_rest_is_extracted(
    tmp_path, monkeypatch, caplog
):
    import errno
    import stat

    _tar_with_specials(tmp_path / "s.tar")
    pack(str(tmp_path / "s.tar"), str(tmp_path / "b"))
    real_mknod = os.mknod

    def mknod_without_privilege(path, mode=0o600, device=0, *, dir_fd=None):
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real_mknod(path, mode, device, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mknod", mknod_without_privilege)  # what a user who is not root gets
    with Bundle(tmp_path / "b") as b:
        summary = extract(b, tmp_path / "out")
    assert summary.not_created == ["null"] and not summary.ok  # the CLI exits 1
    assert caplog.text.count("null: not created: making a device node needs root") == 1
    assert sorted(os.listdir(tmp_path / "out")) == ["fifo"]
