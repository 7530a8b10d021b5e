"""``bundlefs.Writer``: a bundle built from Python one entry at a time, through the packer's own
builder, content writer and publishing (issue 25).

What it promises: what was added reads back (bytes, modes, mtimes, owners, symlinks, user data,
content types, empty and implied directories); the same adds give byte-identical bundles; the
bundle appears at DEST only when the ``with`` block ends cleanly (nothing, not even a partial
directory, after an exception or ``abort``); a path added twice or that no bundle can hold is
refused when it is added, in one sentence, and the Writer goes on.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import random
import stat
import subprocess
from pathlib import Path

import pytest

import bundlefs
from bundlefs import Bundle, DuplicatePathError, InvalidEntryError, PackError, Writer
from bundlefs.core import format as fmt
from tests.conftest import build_tree, bundle_file_bytes, pseudo_random_bytes

CREATED = 1_700_000_000 * 10**9
BIG = pseudo_random_bytes(3 * 1024 * 1024 + 17, seed=25)  # over the large-file threshold


def _write(dest: Path, **options: object) -> None:
    """A small tree with one of everything, added out of order."""
    with Writer(dest, created_ns=CREATED, **options) as w:
        w.add("b/deep/z.bin", pseudo_random_bytes(5000, seed=3), mode=0o600, mtime=1_600_000_000)
        w.add("a.txt", b"alpha\n", user_data=b'{"label": 1}', uid=1234, gid=5678)
        w.add("b/stream.bin", io.BytesIO(BIG))
        w.add_dir("empty", mode=0o700, mtime_ns=1_500_000_000_123_456_789)
        w.add_symlink("b/link", "deep/z.bin")
        w.add_dir("b", mode=0o750)  # implied by the paths above: gets its own attributes now
        w.add(b"bytes-name-\xff", b"")


def test_what_was_added_reads_back(tmp_path: Path) -> None:
    dest = tmp_path / "w.bundle"
    _write(dest)
    with Bundle(dest) as b:
        assert sorted(b.paths()) == sorted(
            ["a.txt", "b", "b/deep", "b/deep/z.bin", "b/link", "b/stream.bin", "empty"]
            + [os.fsdecode(b"bytes-name-\xff")]
        )
        assert b["b/deep/z.bin"] == pseudo_random_bytes(5000, seed=3)
        assert b["b/stream.bin"] == BIG
        assert b[b"bytes-name-\xff"] == b""
        z = b.stat("b/deep/z.bin")
        assert (z.st_mode, z.st_mtime_ns) == (stat.S_IFREG | 0o600, 1_600_000_000 * 10**9)
        a = b.stat("a.txt")
        assert (a.st_uid, a.st_gid, a.user_data) == (1234, 5678, b'{"label": 1}')
        assert (a.st_mode, a.st_mtime_ns, a.content_type) == (
            stat.S_IFREG | 0o644,
            CREATED,
            "text/plain",
        )
        assert b.readlink("b/link") == "deep/z.bin"
        assert stat.S_ISLNK(b.stat("b/link", follow_symlinks=False).st_mode)
        empty = b.stat("empty")
        assert (empty.st_mode, empty.st_mtime_ns) == (
            stat.S_IFDIR | 0o700,
            1_500_000_000_123_456_789,
        )
        assert b.listdir("empty") == []
        assert b.stat("b").st_mode == stat.S_IFDIR | 0o750
        implied = b.stat("b/deep")  # never added: the defaults
        assert (implied.st_mode, implied.st_mtime_ns) == (stat.S_IFDIR | 0o755, CREATED)
        assert (implied.st_uid, implied.st_gid) == (os.getuid(), os.getgid())
        assert b.info().meta in (None, {})
        for path in ("b/deep/z.bin", "b/stream.bin"):  # bytes, and a stream of unknown size
            assert b.stat(path).digest == hashlib.sha256(b[path]).digest()[:16]


def test_content_is_stored_in_add_order_and_entries_in_the_trees_order(tmp_path: Path) -> None:
    dest = tmp_path / "w.bundle"
    added = ["z/1", "a/2", "m", "a/1"]
    with Writer(dest, created_ns=CREATED) as w:
        for i, path in enumerate(added):
            w.add(path, b"%d" % i)
    with Bundle(dest) as b:
        assert [path for path, _ in b.iter_files()] == added
        assert list(b.paths()) == ["a", "m", "z", "a/1", "a/2", "z/1"]  # breadth first, sorted
        assert [b[p] for p in added] == [b"0", b"1", b"2", b"3"]


def test_the_same_adds_give_byte_identical_bundles(tmp_path: Path) -> None:
    _write(tmp_path / "one.bundle")
    _write(tmp_path / "two.bundle")
    one = bundle_file_bytes(tmp_path / "one.bundle")
    assert one == bundle_file_bytes(tmp_path / "two.bundle")
    assert sorted(one) == [
        "COMPLETE",
        "index/data.mdb",
        "index/pages",
        "shard-00000000",
    ]  # no scratch table


def test_adds_in_any_order_make_the_same_tree(tmp_path: Path) -> None:
    files = {
        f"d{i % 7}/sub{i % 3}/f{i:03d}": pseudo_random_bytes(100 + i, seed=i) for i in range(60)
    }
    shuffled = sorted(files)
    random.Random(25).shuffle(shuffled)
    trees = []
    for name, order in (("sorted", sorted(files)), ("shuffled", shuffled)):
        with Writer(tmp_path / name, created_ns=CREATED) as w:
            for path in order:
                w.add(path, files[path])
        with Bundle(tmp_path / name) as b:
            trees.append([(p, b.stat(p).st_ino, b.stat(p).st_mode) for p in b.paths()])
            assert dict(b.items()) == files
    assert trees[0] == trees[1]


def test_file_objects_and_files_on_disk(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", {"f.bin": pseudo_random_bytes(70_000, seed=4)})
    os.chmod(src / "f.bin", 0o640)
    os.utime(src / "f.bin", ns=(1_234_567_890_123_456_789,) * 2)
    dest = tmp_path / "w.bundle"
    with Writer(dest) as w, open(src / "f.bin", "rb") as f:
        w.add_file("from-path", src / "f.bin")
        w.add_file("from-path-own-mode", str(src / "f.bin"), mode=0o444, mtime=7)
        w.add_file("from-object", f)
        w.add("chunked", io.BufferedReader(io.BytesIO(BIG), buffer_size=1000))  # type: ignore[arg-type]
    with Bundle(dest) as b:
        real = os.stat(src / "f.bin")
        got = b.stat("from-path")
        assert (got.st_mode, got.st_mtime_ns, got.st_uid) == (
            real.st_mode,
            real.st_mtime_ns,
            real.st_uid,
        )
        assert b.stat("from-path-own-mode").st_mode == stat.S_IFREG | 0o444
        assert b.stat("from-path-own-mode").st_mtime_ns == 7 * 10**9
        assert b["from-object"] == b["from-path"] == (src / "f.bin").read_bytes()
        assert b["chunked"] == BIG


def test_an_exception_in_the_block_publishes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "w.bundle"
    with pytest.raises(KeyError), Writer(dest) as w:
        w.add("a", b"a" * 100_000)
        raise KeyError("the caller's own failure")
    assert os.listdir(tmp_path) == []  # no bundle, no partial directory, no scratch table


def test_abort_publishes_nothing_and_the_writer_is_closed(tmp_path: Path) -> None:
    dest = tmp_path / "w.bundle"
    w = Writer(dest)
    w.add("a", b"a")
    assert len(os.listdir(tmp_path)) == 1  # the partial directory, while writing
    w.abort()
    assert os.listdir(tmp_path) == []
    with pytest.raises(PackError, match="closed"):
        w.add("b", b"b")
    w.abort()  # again: nothing to do


def test_a_stream_that_fails_leaves_the_writer_failed_and_nothing_published(tmp_path: Path) -> None:
    class Failing:
        def read(self, size: int) -> bytes:
            raise OSError(errno.EIO, "Input/output error")

    w = Writer(tmp_path / "w.bundle")
    w.add("fine", b"fine")
    with pytest.raises(PackError, match="cannot read the data for x: Input/output error"):
        w.add("x", Failing())  # type: ignore[arg-type]
    with pytest.raises(PackError, match="failed earlier"):
        w.add("y", b"y")
    with pytest.raises(PackError, match="failed earlier.*nothing is published"):
        w.close()
    assert os.listdir(tmp_path) == []


def test_a_path_added_twice_is_refused_and_the_writer_goes_on(tmp_path: Path) -> None:
    dest = tmp_path / "w.bundle"
    with Writer(dest) as w:
        w.add("d/f", b"first")
        with pytest.raises(DuplicatePathError, match="'d/f'.*added already"):
            w.add("d/f", b"second")
        with pytest.raises(DuplicatePathError, match="implied"):
            w.add("d", b"a file where a directory is implied")
        w.add_dir("d")  # an implied directory may be described, once
        with pytest.raises(DuplicatePathError):
            w.add_dir("d")
        with pytest.raises(DuplicatePathError):
            w.add_symlink("d/f", "x")
        assert isinstance(DuplicatePathError("x"), ValueError)
        w.add("d/g", b"after")
    with Bundle(dest) as b:
        assert (b["d/f"], b["d/g"]) == (b"first", b"after")
        assert [p for p, _ in b.iter_files()] == ["d/f", "d/g"]


@pytest.mark.parametrize(
    "path, words",
    [
        ("", "names the root"),
        ("/abs", "empty component"),
        ("a//b", "empty component"),
        ("a/", "empty component"),
        ("a/../b", "'..' component"),
        ("./a", "'.' component"),
        ("a\0b", "NUL"),
        ("x" * 256, "longer than 255 bytes"),
        ("f/inside", "leads through 'f', which is not a directory"),
        ("l/inside", "leads through 'l', which is not a directory"),
    ],
)
def test_a_path_no_bundle_holds_is_refused_in_one_sentence(tmp_path: Path, path, words) -> None:
    with Writer(tmp_path / "w.bundle") as w:
        w.add("f", b"a file")
        w.add_symlink("l", "f")
        with pytest.raises(InvalidEntryError, match=words) as caught:
            w.add(path, b"x")
        assert "\n" not in str(caught.value)
        w.add_dir("still-usable")


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda w: w.add("a", b"", mode=0o40755), "permission bits"),
        (lambda w: w.add("a", b"", mode=0o10000), "permission bits"),
        (lambda w: w.add("a", b"", mtime_ns=2**63), "outside what a bundle stores"),
        (lambda w: w.add("a", b"", uid=-1), "owner"),
        (lambda w: w.add("a", b"", user_data=b"u" * 4097), "over 4096 bytes"),
        (lambda w: w.add("a", b"", content_type="not a type"), "cannot add 'a'"),
        (lambda w: w.add_symlink("a", ""), "symlink target"),
    ],
)
def test_a_value_out_of_range_is_refused(tmp_path: Path, call, words) -> None:
    with Writer(tmp_path / "w.bundle") as w:
        with pytest.raises(InvalidEntryError, match=words):
            call(w)
        w.add("a", b"fine")


def test_wrong_types_and_unknown_keywords_are_type_errors(tmp_path: Path) -> None:
    with Writer(tmp_path / "w.bundle") as w:
        with pytest.raises(TypeError, match="bytes or a binary file object"):
            w.add("a", "text")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="mtme"):
            w.add("a", b"", mtme=5)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="not both"):
            w.add("a", b"", mtime=1, mtime_ns=1)
    with pytest.raises(TypeError, match="compresion"):
        Writer(tmp_path / "x.bundle", compresion="zstd")
    with pytest.raises(PackError, match="no excludes option"):
        Writer(tmp_path / "x.bundle", excludes=("*.tmp",))
    assert sorted(os.listdir(tmp_path)) == ["w.bundle"]


def test_pack_options_apply(tmp_path: Path) -> None:
    dest = tmp_path / "w.bundle"
    options = bundlefs.PackOptions(compression="zstd", record_size=64 * 1024, created_ns=CREATED)
    with Writer(
        dest,
        options,
        meta={"source": "test"},
        content_types={"*.bin": "x-app/bin"},
        user_data=lambda rel, st: b"from the callable",
    ) as w:
        w.add("a.bin", pseudo_random_bytes(200_000, seed=5, compressible=True))
        w.add("own", b"x", user_data=b"its own")
    with Bundle(dest) as b:
        info = b.info()
        assert (info.config.compression, info.config.record_size) == (
            fmt.COMPRESSION_NAMES["zstd"],
            64 * 1024,
        )
        assert info.meta == {"source": "test"}
        assert b.stat("a.bin").content_type == "x-app/bin"
        assert b.stat("a.bin").user_data == b"from the callable"
        assert b.stat("own").user_data == b"its own"
        assert b.config.created_ns == CREATED


def test_an_existing_dest_is_refused_unless_forced(tmp_path: Path) -> None:
    dest = tmp_path / "w.bundle"
    with Writer(dest) as w:
        w.add("old", b"old")
    with pytest.raises(PackError, match="already exists"):
        Writer(dest)
    with Writer(dest, force=True) as w:
        w.add("new", b"new")
    with Bundle(dest) as b:
        assert list(b) == ["new"]


def test_close_returns_the_summary_once_published(tmp_path: Path) -> None:
    w = Writer(tmp_path / "w.bundle")
    w.add("a/b", b"12345")
    summary = w.close()
    assert summary is w.close()
    facts = summary.to_dict()
    assert (facts["files"], facts["dirs"], facts["bytes"]) == (1, 2, 5)
    assert facts["dest"] == str(tmp_path / "w.bundle")
    with pytest.raises(PackError, match="closed"):
        w.add("c", b"")


@pytest.mark.mount
def test_a_written_bundle_mounts_and_real_tools_read_it(tmp_path: Path, mount_bundle) -> None:
    spec = {"a.txt": b"alpha\n", "d": {"x.bin": pseudo_random_bytes(300_000, seed=6)}, "e": {}}
    tree = build_tree(tmp_path / "tree", spec)
    dest = tmp_path / "w.bundle"
    with Writer(dest) as w:
        w.add("d/x.bin", spec["d"]["x.bin"])  # type: ignore[index]
        w.add("a.txt", io.BytesIO(b"alpha\n"))
        w.add_dir("e")
        w.add_symlink("link", "d/x.bin")
    os.symlink("d/x.bin", tree / "link")
    m = mount_bundle(dest)
    mnt = str(m.mountpoint)
    subprocess.run(["diff", "-r", "--no-dereference", str(tree), mnt], check=True)
    out = subprocess.run(
        ["find", mnt, "-printf", "%P %y %m\n"], capture_output=True, text=True, check=True
    ).stdout
    assert sorted(out.splitlines()) == [
        " d 755",
        "a.txt f 644",
        "d d 755",
        "d/x.bin f 644",
        "e d 755",
        "link l 777",
    ]
    assert (
        subprocess.run(["cat", f"{mnt}/link"], capture_output=True, check=True).stdout
        == (
            spec["d"]["x.bin"]  # type: ignore[index]
        )
    )
