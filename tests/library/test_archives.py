"""Archives in and out (issue 11 §4): pack from tar (every compression), zip, stdin and tar shards;
export a bundle as the tar GNU tar would write; hostile archives; determinism.

Trees are compared after ``bundlefs extract`` with ``diff -r`` and every entry's ``lstat`` (mode,
mtime, size, content or target, hard-link structure; owners where the test sets them).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from bundlefs import Bundle, PackError, PackOptions, pack
from bundlefs.packing.sources.archive import ArchiveSource
from bundlefs.packing.sources.base import SourceErrors, StoredContent
from bundlefs.packing.sources.synthetic import File, SyntheticStat, SyntheticTree, name_problem
from bundlefs.read.export import export_tar
from tests.conftest import bundle_file_bytes
from tests.support.trees import assert_one_line_error, build_rich_tree, diff_r, run_cli, snapshot

zstandard = pytest.importorskip("zstandard")

GNU_TAR = ["tar", "--sort=name", "--format=gnu", "--numeric-owner"]
AS_ROOT = os.geteuid() == 0


def _gnu_tar(tree: Path, out: Path) -> Path:
    subprocess.run([*GNU_TAR, "-C", tree, "-cf", out, "."], check=True)
    return out


def _seconds(snap: dict[bytes, tuple]) -> dict[bytes, tuple]:
    """A snapshot with mtimes cut to whole seconds (what a GNU-format tar keeps)."""
    return {k: (m, t // 10**9, *rest) for k, (m, t, *rest) in snap.items()}


def _owners(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(top, name))
            out[os.path.relpath(os.path.join(top, name), root)] = (st.st_uid, st.st_gid)
    return out


def _extract(bundle: Path, dest: Path) -> Path:
    result = run_cli("extract", "-q", bundle, dest)
    assert result.returncode == 0, result.stderr
    return dest


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rich tree (hard links, symlinks, odd names, odd modes, pre-1970 and ns mtimes), with
    a long path, and (as root) owners that need base-256 in a tar header."""
    base = tmp_path_factory.mktemp("archives")
    root = build_rich_tree(base / "tree")
    long_dir = root / ("d" * 120)
    long_dir.mkdir()
    (long_dir / ("f" * 90)).write_bytes(b"long path\n")
    os.symlink("t" * 150, root / "long-target")
    os.utime(long_dir, ns=(1_600_000_000 * 10**9,) * 2)
    if AS_ROOT:
        os.chown(root / "hello.txt", 3_000_000, 5, follow_symlinks=False)
        os.chown(root / "a", 1000, 1000)
    os.utime(root, ns=(1_600_000_000 * 10**9,) * 2)
    return root


@pytest.fixture(scope="module")
def tree_tar(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _gnu_tar(tree, tmp_path_factory.mktemp("tar") / "tree.tar")


def _assert_same_tree(
    original: Path, extracted: Path, *, seconds: bool = True, links: bool = True
) -> None:
    result = diff_r(original, extracted)
    assert result.returncode == 0, result.stdout.decode(errors="replace")
    want, got = snapshot(original), snapshot(extracted)
    if seconds:
        want, got = _seconds(want), _seconds(got)
    if not links:  # the hard-link group column dropped
        want, got = ({k: v[:4] for k, v in snap.items()} for snap in (want, got))
    assert got == want
    if AS_ROOT:
        assert _owners(extracted) == _owners(original)


COMPRESSORS = {
    "plain": lambda data: data,
    "gz": lambda data: gzip.compress(data, mtime=0),
    "bz2": bz2.compress,
    "xz": lzma.compress,
    "zst": lambda data: zstandard.ZstdCompressor().compress(data),
}


# -- pack from archives ----------------------------------------------------------------------------


@pytest.mark.parametrize("compression", list(COMPRESSORS))
def test_pack_from_a_tar_keeps_the_tree(tree, tree_tar, tmp_path, compression):
    archive = tmp_path / f"tree.tar.{compression}"
    archive.write_bytes(COMPRESSORS[compression](tree_tar.read_bytes()))
    pack(str(archive), str(tmp_path / "b"))
    _assert_same_tree(tree, _extract(tmp_path / "b", tmp_path / "out"))
    with Bundle(tmp_path / "b") as bundle:
        assert bundle.info().config.hardlink_count == 1


def test_a_pax_tar_keeps_nanosecond_mtimes(tree, tmp_path):
    archive = tmp_path / "pax.tar"
    subprocess.run(
        ["tar", "--sort=name", "--format=posix", "--pax-option=delete=atime,delete=ctime"]
        + ["-C", tree, "-cf", archive, "."],
        check=True,
    )
    pack(str(archive), str(tmp_path / "b"))
    _assert_same_tree(tree, _extract(tmp_path / "b", tmp_path / "out"), seconds=False)


def test_pack_from_a_tar_on_stdin(tree, tree_tar, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bundlefs", "pack", "-q", "-", tmp_path / "b"],
        input=gzip.compress(tree_tar.read_bytes()),
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    _assert_same_tree(tree, _extract(tmp_path / "b", tmp_path / "out"))


def test_pack_from_several_tar_shards_into_one_tree(tree, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # two packs compared byte for byte
    # WebDataset style: the first shard holds the root alone, each other some top-level names.
    names = sorted(os.listdir(tree))
    shards = [tmp_path / "shard-000.tar"]
    subprocess.run([*GNU_TAR, "-C", tree, "--no-recursion", "-cf", shards[0], "."], check=True)
    for i, group in enumerate([names[0::3], names[1::3], names[2::3]], 1):
        shard = tmp_path / f"shard-{i:03d}.tar"
        subprocess.run([*GNU_TAR, "-C", tree, "-cf", shard, *(f"./{n}" for n in group)], check=True)
        shards.append(shard)
    result = run_cli("pack", "-q", *shards, tmp_path / "b")
    assert result.returncode == 0, result.stderr
    # The two names of the hard-linked file are in different shards: each shard's tar stored
    # its name as a plain file (tar links only names it archives itself).
    _assert_same_tree(tree, _extract(tmp_path / "b", tmp_path / "out"), links=False)
    # The same shards as a quoted brace pattern, expanded by the CLI.
    result = run_cli("pack", "-q", str(tmp_path / "shard-{000..003}.tar"), tmp_path / "b2")
    assert result.returncode == 0, result.stderr
    assert bundle_file_bytes(tmp_path / "b2") == bundle_file_bytes(tmp_path / "b")


@pytest.mark.skipif(shutil.which("zip") is None, reason="Info-ZIP zip is not installed")
def test_pack_from_a_zip_made_by_info_zip(tree, tmp_path):
    archive = tmp_path / "tree.zip"
    # -y: symlinks as symlinks; Info-ZIP keeps modes, mtimes (UT field) and owners (ux field).
    subprocess.run(["zip", "-q", "-r", "-y", archive, "."], cwd=tree, check=True)
    pack(str(archive), str(tmp_path / "b"))
    out = _extract(tmp_path / "b", tmp_path / "out")
    result = diff_r(tree, out)
    assert result.returncode == 0, result.stdout.decode(errors="replace")
    want, got = _seconds(snapshot(tree)), _seconds(snapshot(out))
    for rel, (mode, mtime, size, data, _group) in want.items():
        if rel == b".":
            continue  # zip has no member for the root
        # A zip has no hard links (each name is a copy); mtimes are whole seconds.
        assert got[rel][:4] == (mode, mtime, size, data), rel
    if AS_ROOT:
        assert _owners(out)["a"] == (1000, 1000)


def test_pack_from_a_zip_without_unix_attributes(tmp_path):
    archive = tmp_path / "plain.zip"

    def dos(name: str) -> zipfile.ZipInfo:  # as made on Windows: no Unix mode, no owners
        info = zipfile.ZipInfo(name, (2020, 1, 2, 3, 4, 6))
        info.create_system = 0
        return info

    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(dos("docs/"), b"")
        zf.writestr(dos("docs/readme.txt"), b"hi" * 1000)
        zf.writestr(dos("top/inner/x.bin"), b"\0" * 10)
    pack(str(archive), str(tmp_path / "b"))
    with Bundle(tmp_path / "b") as bundle:
        assert bundle.read("docs/readme.txt") == b"hi" * 1000
        assert stat.S_IMODE(bundle.stat("docs/readme.txt").st_mode) == 0o644
        assert stat.S_IMODE(bundle.stat("docs").st_mode) == 0o755
        assert stat.S_IMODE(bundle.stat("top/inner").st_mode) == 0o755  # implicit
        assert bundle.stat("top/inner/x.bin").st_uid == 0


def test_packing_one_archive_twice_is_byte_identical(tree_tar, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    archive = tmp_path / "tree.tar.gz"
    archive.write_bytes(gzip.compress(tree_tar.read_bytes(), mtime=0))
    options = PackOptions(record_size=16 * 1024, jobs=4)
    pack(str(archive), str(tmp_path / "one"), options)
    pack(str(archive), str(tmp_path / "two"), options)
    assert bundle_file_bytes(tmp_path / "one") == bundle_file_bytes(tmp_path / "two")


def test_an_archive_source_is_an_entry_source_pack_accepts(tree_tar, tmp_path):
    errors = SourceErrors(skip_errors=False)
    pack(ArchiveSource([str(tree_tar)], errors), str(tmp_path / "b"))
    with Bundle(tmp_path / "b") as bundle:
        assert bundle.read("hello.txt") == b"hello\n"


# -- how members map -------------------------------------------------------------------------------


def _tar(members: list[tuple[tarfile.TarInfo, bytes]], fmt=tarfile.GNU_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


def _member(name: str, data: bytes = b"", *, kind=tarfile.REGTYPE, mtime=1_600_000_000, **kw):
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mtime = kind, len(data), mtime
    info.mode = kw.pop("mode", 0o644)
    for key, value in kw.items():
        setattr(info, key, value)
    return info, data


def test_implicit_directories_duplicates_and_special_files(tmp_path, caplog):
    archive = tmp_path / "x.tar"
    archive.write_bytes(
        _tar(
            [
                _member("a/b/c.txt", b"first", mtime=1_500_000_000, uid=7, gid=8),
                _member("a/b/c.txt", b"second wins"),
                _member("dev", kind=tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o600),
                _member("disk", kind=tarfile.BLKTYPE, devmajor=259, devminor=70000),
                _member("fifo", kind=tarfile.FIFOTYPE),
                _member("/abs/path", b"leading slash removed"),
                _member("./dot/./x", b"dots dropped"),
                _member("a/", kind=tarfile.DIRTYPE, mode=0o700, mtime=1_400_000_000),
                _member("linked", kind=tarfile.LNKTYPE, linkname="a/b/c.txt"),
            ]
        )
    )
    summary = pack(str(archive), str(tmp_path / "b"))
    assert summary.skipped == []  # FIFOs and devices are stored (format version 4)
    with Bundle(tmp_path / "b") as bundle:
        assert bundle.read("a/b/c.txt") == b"second wins"
        assert bundle.read("abs/path") == b"leading slash removed"
        assert bundle.read("dot/x") == b"dots dropped"
        implicit = bundle.stat("a/b")
        assert stat.S_IMODE(implicit.st_mode) == 0o755
        assert implicit.st_mtime_ns == 1_500_000_000 * 10**9  # the first member below it
        assert (implicit.st_uid, implicit.st_gid) == (7, 8)
        described = bundle.stat("a")  # an explicit member later: its metadata
        assert (stat.S_IMODE(described.st_mode), described.st_mtime_ns) == (0o700, 1_400 * 10**15)
        assert bundle.stat("linked").st_nlink == 2
        assert bundle.stat("linked").st_ino == bundle.stat("a/b/c.txt").st_ino
        assert sorted(bundle.listdir("")) == ["a", "abs", "dev", "disk", "dot", "fifo", "linked"]
        dev, disk = bundle.stat("dev"), bundle.stat("disk")
        assert (dev.st_mode, dev.st_rdev) == (stat.S_IFCHR | 0o600, os.makedev(1, 3))
        assert (disk.st_mode, disk.st_rdev) == (stat.S_IFBLK | 0o644, os.makedev(259, 70000))
        assert bundle.stat("fifo").st_mode == stat.S_IFIFO | 0o644


HOSTILE = {
    "dotdot": ([_member("../x", b"escape")], "its name has a '..' component"),
    "dotdot-inside": ([_member("a/../../x", b"escape")], "its name has a '..' component"),
    "through-symlink": (
        [_member("l", kind=tarfile.SYMTYPE, linkname="/etc"), _member("l/passwd", b"root::0")],
        "it leads through the symbolic link l, which is never followed",
    ),
    "through-file": (
        [_member("f", b"file"), _member("f/x", b"under a file")],
        "it leads through the file f",
    ),
    "hard-link-to-nothing": (
        [_member("h", kind=tarfile.LNKTYPE, linkname="missing")],
        "it is a hard link to missing, which is not in the archive before it",
    ),
    "hard-link-dotdot": (
        [_member("h", kind=tarfile.LNKTYPE, linkname="../../etc/passwd")],
        "its hard link target contains '..'",
    ),
    "directory-replaced": (
        [_member("d/x", b"x"), _member("d", b"a file where a full directory is")],
        "it would replace a directory that has children",
    ),
}


@pytest.mark.parametrize(
    ("parts", "why"),
    [
        ([b"a", b""], "an empty component"),
        ([b"a", b"."], "a '.' component"),
        ([b"..", b"x"], "a '..' component"),
        ([b"n" * 256], "longer than 255 bytes"),
        ([b"a\0b"], "NUL"),
    ],
)
def test_one_set_of_name_rules_for_every_made_up_tree(parts, why):
    # Archives drop empty and "." components before asking (as GNU tar); object keys do not.
    assert name_problem([b"a", b"b" * 255]) is None
    problem = name_problem(parts)
    assert problem is not None and why in problem


def test_a_synthetic_tree_implies_places_links_and_numbers():
    refused: list[tuple[bytes, str]] = []
    tree = SyntheticTree(lambda rel, why: refused.append((rel, why)))
    st = SyntheticStat(stat.S_IFREG | 0o600, 7, 8, 5)
    stored = StoredContent(0, 0, 3, 0, st, b"abc")
    assert tree.placeable([b"a", b"f"], st)
    tree.place([b"a", b"f"], File(stored), st)
    tree.link([b"g"], b"a/f", st)
    tree.place([b"a", b"f", b"x"], File(stored), st)  # through a file: refused, never followed
    tree.finish()
    root = tree.root()
    assert (stat.S_IMODE(root.st.st_mode), root.st.st_uid, root.st.st_mtime_ns) == (0o755, 7, 5)
    assert [item.name for item in tree.children(b"")] == [b"a", b"g"]
    (f,) = tree.children(b"a")
    g = next(item for item in tree.children(b"") if item.name == b"g")
    assert f.stored is not None and g.stored == f.stored
    assert (f.st.st_nlink, f.st.st_ino, f.st.st_size) == (2, 1, 3)
    assert refused == [(b"a/f/x", "it leads through the file a/f, which is never followed")]


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_archive_is_one_error_and_leaves_nothing(tmp_path, case):
    members, why = HOSTILE[case]
    work = tmp_path / "work"
    work.mkdir()
    archive = tmp_path / "hostile.tar"
    archive.write_bytes(_tar(members))
    result = run_cli("pack", archive, work / "b")
    line = assert_one_line_error(result)
    assert "refusing the archive member" in line and why in line, line
    assert os.listdir(work) == []  # no bundle, no partial
    # With --skip-errors the member is left out, the rest packed.
    result = run_cli("pack", "-q", "--skip-errors", archive, work / "b")
    assert result.returncode == 4, result.stderr  # published, with a member left out
    assert b"warning: skipping the archive member" in result.stderr


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz", "zst", "plain"])
def test_a_truncated_archive_is_one_error_and_leaves_nothing(tree_tar, tmp_path, compression):
    data = COMPRESSORS[compression](tree_tar.read_bytes())
    archive = tmp_path / f"cut.tar.{compression}"
    archive.write_bytes(data[: len(data) // 2])
    work = tmp_path / "work"
    work.mkdir()
    line = assert_one_line_error(run_cli("pack", archive, work / "b"))
    assert line == f"bundlefs: error: cannot read the archive {archive}: it is truncated"
    assert os.listdir(work) == []


def test_a_damaged_gzip_is_one_error(tree_tar, tmp_path):
    data = bytearray(gzip.compress(tree_tar.read_bytes()))
    data[len(data) // 2] ^= 0xFF
    archive = tmp_path / "bad.tar.gz"
    archive.write_bytes(bytes(data))
    line = assert_one_line_error(run_cli("pack", archive, tmp_path / "b"))
    assert line.startswith(f"bundlefs: error: cannot read the archive {archive}: ")
    assert not (tmp_path / "b").exists()


def test_zstd_without_the_extra_names_it(tree_tar, tmp_path):
    archive = tmp_path / "t.tar.zst"
    archive.write_bytes(COMPRESSORS["zst"](tree_tar.read_bytes()))
    block = (
        "import sys\n"
        "class B:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'zstandard': raise ImportError(name)\n"
        "sys.meta_path.insert(0, B())\n"
        "from bundlefs.cli.app import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", block, "pack", archive, tmp_path / "b"], capture_output=True
    )
    line = assert_one_line_error(result)
    assert "pip install 'bundlefs[zstd]'" in line
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["-", "-"], "stdin ('-') can be given only once"),
        (["missing.tar"], "source missing.tar does not exist"),
        (["dir", "x.tar"], "dir is a directory: several sources must all be archives"),
    ],
)
def test_bad_sources_are_one_sentence(tmp_path, args, message):
    (tmp_path / "dir").mkdir()
    (tmp_path / "x.tar").write_bytes(_tar([_member("f", b"x")]))
    line = assert_one_line_error(run_cli("pack", *args, "b", cwd=tmp_path))
    assert line == f"bundlefs: error: {message}"


def test_a_zip_on_stdin_is_refused(tmp_path):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("f", b"x")
    result = subprocess.run(
        [sys.executable, "-m", "bundlefs", "pack", "-", tmp_path / "b"],
        input=out.getvalue(),
        capture_output=True,
    )
    assert "a zip cannot be read from stdin" in assert_one_line_error(result)


# -- export ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tree_bundle(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("export") / "tree.bundle"
    pack(str(tree), str(dest), PackOptions(record_size=16 * 1024))
    return dest


def test_export_is_byte_identical_to_gnu_tar_sort_name(tree, tree_tar, tree_bundle, tmp_path):
    result = run_cli("export", tree_bundle, tmp_path / "out.tar")
    assert result.returncode == 0, result.stderr
    exported = (tmp_path / "out.tar").read_bytes()
    assert len(exported) % 10240 == 0
    assert exported == tree_tar.read_bytes()


def test_export_of_fifos_and_devices_is_byte_identical_to_gnu_tar_and_leaves_sockets_out(
    tmp_path, monkeypatch
):
    src = tmp_path / "src"
    src.mkdir()
    (src / "file").write_bytes(b"data")
    os.mkfifo(src / "fifo")
    monkeypatch.chdir(src)  # a relative socket path avoids the 108-byte limit of sun_path
    import socket

    with socket.socket(socket.AF_UNIX) as server:
        server.bind("sock")
    if os.geteuid() == 0:
        os.mknod(src / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        os.mknod(src / "disk", stat.S_IFBLK | 0o640, os.makedev(259, 70000))
    pack(str(src), str(tmp_path / "b"))
    with Bundle(tmp_path / "b") as b, open(tmp_path / "out.tar", "wb") as out:
        summary = export_tar(b, out)
    assert summary.sockets_left_out == 1 and summary.specials == (3 if os.geteuid() == 0 else 1)
    gnu = subprocess.run([*GNU_TAR, "-C", src, "-cf", "-", "."], capture_output=True)
    assert b"socket ignored" in gnu.stderr  # GNU tar leaves a socket out too
    assert (tmp_path / "out.tar").read_bytes() == gnu.stdout
    result = run_cli(
        "pack", tmp_path / "out.tar", tmp_path / "again"
    )  # and back, whole but the socket
    assert result.returncode == 0, result.stderr
    with Bundle(tmp_path / "again") as again, Bundle(tmp_path / "b") as b:
        for name in b.listdir(""):
            if name != "sock":
                one, two = again.lstat(name), b.lstat(name)
                assert (one.st_mode, one.st_rdev, one.st_mtime_ns // 10**9) == (
                    two.st_mode,
                    two.st_rdev,
                    two.st_mtime_ns // 10**9,  # a tar keeps seconds
                ), name


def test_export_to_stdout_is_the_same_tar(tree_tar, tree_bundle):
    result = subprocess.run(
        [sys.executable, "-m", "bundlefs", "export", "-q", tree_bundle, "-"],
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == tree_tar.read_bytes()


def test_gnu_tar_compare_finds_no_difference(tree, tree_bundle, tmp_path):
    out = tmp_path / "out.tar"
    with Bundle(tree_bundle) as bundle, open(out, "wb") as f:
        summary = export_tar(bundle, f)
    assert summary.hardlinks == 1 and summary.tar_bytes == out.stat().st_size
    result = subprocess.run(["tar", "-d", "-f", out, "-C", tree], capture_output=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("compression", ["plain", "gz", "zst"])
def test_tar_in_tar_out_is_the_same_tar(tree_tar, tmp_path, compression):
    archive = tmp_path / f"in.tar.{compression}"
    archive.write_bytes(COMPRESSORS[compression](tree_tar.read_bytes()))
    pack(str(archive), str(tmp_path / "b"))
    with Bundle(tmp_path / "b") as bundle:
        out = io.BytesIO()
        export_tar(bundle, out)
    assert out.getvalue() == tree_tar.read_bytes()


def test_export_does_not_replace_out_without_force(tree_bundle, tmp_path):
    out = tmp_path / "out.tar"
    out.write_bytes(b"keep")
    line = assert_one_line_error(run_cli("export", tree_bundle, out))
    assert "already exists (use --force to replace it)" in line
    assert out.read_bytes() == b"keep"
    assert run_cli("export", "-q", "--force", tree_bundle, out).returncode == 0
    assert tarfile.is_tarfile(out)


def test_export_of_a_damaged_bundle_leaves_no_tar(tree_bundle, tmp_path):
    from tests.conftest import flip_byte

    damaged = tmp_path / "damaged.bundle"
    shutil.copytree(tree_bundle, damaged)
    shard = next(p for p in damaged.iterdir() if p.name.startswith("shard"))
    flip_byte(shard, shard.stat().st_size // 2)
    result = run_cli("export", damaged, tmp_path / "out.tar")
    assert_one_line_error(result)
    assert sorted(os.listdir(tmp_path)) == ["damaged.bundle"]


def test_export_of_a_non_bundle_is_one_sentence(tmp_path):
    assert_one_line_error(run_cli("export", tmp_path, tmp_path / "out.tar"))


def test_pack_refuses_an_archive_inside_dest(tree_tar, tmp_path):
    pack(str(tree_tar), str(tmp_path / "b"))
    inside = tmp_path / "b" / "x.tar"
    shutil.copy(tree_tar, inside)
    with pytest.raises(PackError, match="is inside .*which a pack would replace"):
        pack(str(inside), str(tmp_path / "b"), PackOptions(force=True))
