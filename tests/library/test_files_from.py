"""``PackOptions(files_from=…)`` (``pack --files-from``): exactly the listed paths of a directory,
their content stored in the listed order, the directories above them with their real attributes;
a path that is missing, leads out of SRC or through a symlink is an error (or skipped)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bundlefs import Bundle, PackError, PackOptions, pack
from tests.conftest import HardLink, Symlink, build_tree, pseudo_random_bytes

SPEC = {
    "a": {"x.bin": pseudo_random_bytes(5000, seed=1), "y.bin": pseudo_random_bytes(5000, seed=2)},
    "b": {"deep": {"z.bin": pseudo_random_bytes(5000, seed=3)}, "w.bin": b"w"},
    "top.txt": b"top\n",
    "link": Symlink("a/x.bin"),
    "hard": HardLink("a/y.bin"),
    "dirlink": Symlink("b"),
}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    tree = build_tree(tmp_path / "src", SPEC)
    os.chmod(tree / "b" / "deep", 0o700)
    os.utime(tree / "b" / "deep", ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    return tree


def _pack(src: Path, listed, tmp_path: Path, **options) -> Path:
    dest = tmp_path / "out.bundle"
    pack(str(src), str(dest), PackOptions(files_from=listed, **options))
    return dest


def _stored_order(bundle: Path) -> list[str]:
    with Bundle(bundle) as b:
        return [path for path, _data in b.iter_files()]


def test_exactly_the_listed_paths_in_the_listed_order(src, tmp_path) -> None:
    listed = ["b/deep/z.bin", "top.txt", "a/x.bin", "link"]
    bundle = _pack(src, listed, tmp_path)
    with Bundle(bundle) as b:
        assert sorted(b.paths()) == sorted(
            ["a", "a/x.bin", "b", "b/deep", "b/deep/z.bin", "top.txt", "link"]
        )
        assert b.read("b/deep/z.bin") == SPEC["b"]["deep"]["z.bin"]
        assert b.readlink("link") == "a/x.bin"
        deep, real = b.stat("b/deep"), os.stat(src / "b" / "deep")
        assert (deep.st_mode, deep.st_mtime_ns) == (real.st_mode, real.st_mtime_ns)
        assert b.stat("").st_mode == os.stat(src).st_mode
    assert _stored_order(bundle) == ["b/deep/z.bin", "top.txt", "a/x.bin"]
    assert _stored_order(_pack(src, list(reversed(listed)), tmp_path, force=True)) == [
        "a/x.bin",
        "top.txt",
        "b/deep/z.bin",
    ]


def test_paths_are_normalised_and_packed_once(src, tmp_path) -> None:
    listed = [b"./top.txt", "a//x.bin", str(src / "a" / "y.bin"), "top.txt", "b/../hard", "b/"]
    bundle = _pack(src, listed, tmp_path)
    with Bundle(bundle) as b:
        assert sorted(b.paths()) == ["a", "a/x.bin", "a/y.bin", "b", "hard", "top.txt"]
        assert b.listdir("b") == []  # a listed directory is packed itself, not its contents
        assert b.stat("hard").st_ino == b.stat("a/y.bin").st_ino  # both names listed: one content
        assert b.stat("hard").st_nlink == 2
    # one content's names come together, in the tree's order
    assert _stored_order(bundle) == ["top.txt", "a/x.bin", "hard", "a/y.bin"]


@pytest.mark.parametrize(
    "path, words",
    [
        ("missing.txt", "cannot read missing.txt"),
        ("../outside", "outside SRC"),
        ("/etc/passwd", "outside SRC"),
        ("dirlink/w.bin", "through the symbolic link dirlink"),
        ("top.txt/x", "through the file top.txt"),
    ],
)
def test_a_bad_path_is_a_clear_error_or_skipped(src, tmp_path, path, words) -> None:
    with pytest.raises(PackError, match=words):
        _pack(src, ["top.txt", path], tmp_path)
    assert not (tmp_path / "out.bundle").exists()
    if "outside" in words:
        return  # leading out of SRC is never skipped: the list is wrong
    summary = pack(
        str(src),
        str(tmp_path / "skip.bundle"),
        PackOptions(files_from=["top.txt", path], skip_errors=True),
    )
    assert summary.skipped == [path]
    with Bundle(tmp_path / "skip.bundle") as b:
        assert list(b.paths()) == ["top.txt"]


def test_files_from_needs_a_directory_source(src, tmp_path) -> None:
    with pytest.raises(PackError, match="one directory SRC"):
        _pack(src / "top.txt", ["top.txt"], tmp_path)


def test_an_empty_list_packs_an_empty_root(src, tmp_path) -> None:
    with Bundle(_pack(src, [], tmp_path)) as b:
        assert list(b.paths()) == []
