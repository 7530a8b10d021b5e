"""``bundlefs du``, ``Bundle.du``, fsspec's ``du`` and the ``user.bundlefs.tree`` xattr: a
directory's files, directories, bytes and entries in all its depth, each hard-linked file once,
from the stored totals (format version 5) or, for an older bundle, a walk with the same answer."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from bundlefs import Bundle
from tests.conftest import build_tree
from tests.support.trees import assert_one_line_error, run_cli

SPEC = {
    "a": {"one": b"1" * 10, "two": b"2" * 20, "deep": {"x": b"x" * 300, "empty": {}}},
    "b": {"three": b"3" * 4000},
    "top": b"t" * 5,
}


def _walked(root: Path) -> dict[str, int]:
    """What a walk of the source tree finds below ``root``: the expected totals."""
    files = dirs = size = entries = 0
    seen: set[tuple[int, int]] = set()
    for path, subdirs, names in os.walk(root):
        dirs += len(subdirs)
        entries += len(subdirs) + len(names)
        for name in names:
            st = os.lstat(os.path.join(path, name))
            if (st.st_dev, st.st_ino) in seen or not stat.S_ISREG(st.st_mode):
                continue
            seen.add((st.st_dev, st.st_ino))
            files += 1
            size += st.st_size
    return {"files": files, "dirs": dirs, "bytes": size, "entries": entries}


@pytest.fixture
def tree_and_bundle(tmp_path: Path) -> tuple[Path, Path]:
    src = build_tree(tmp_path / "src", SPEC)
    os.link(src / "a" / "one", src / "b" / "one-again")  # counted once, at its first name
    os.symlink("one", src / "a" / "link")
    result = run_cli("pack", "-q", src, tmp_path / "t.bundle")
    assert result.returncode == 0, result.stderr
    return src, tmp_path / "t.bundle"


def test_bundle_du_of_the_root_equals_a_walk_of_the_source(tree_and_bundle) -> None:
    src, bundle = tree_and_bundle
    with Bundle(bundle) as b:
        totals = b.du("/")
    assert (totals.files, totals.dirs, totals.bytes, totals.entries) == tuple(_walked(src).values())


def test_bundle_du_of_a_subdirectory_counts_only_below_it(tree_and_bundle) -> None:
    src, bundle = tree_and_bundle
    with Bundle(bundle) as b:
        totals = b.du("a")
    expected = _walked(src / "a")
    assert (totals.files, totals.dirs, totals.bytes) == (
        expected["files"],
        expected["dirs"],
        expected["bytes"],
    )


def test_du_json_prints_one_object_per_path(tree_and_bundle) -> None:
    src, bundle = tree_and_bundle
    result = run_cli("du", "--json", bundle, "/", "a/deep")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["path"] for row in rows] == ["/", "a/deep"]
    assert rows[1] == {"path": "a/deep", "files": 1, "dirs": 1, "bytes": 300, "entries": 2}
    assert rows[0]["bytes"] == _walked(src)["bytes"]


def test_du_prints_size_files_dirs_and_path(tree_and_bundle) -> None:
    _src, bundle = tree_and_bundle
    result = run_cli("du", "-b", bundle, "a/deep")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"300\t1 file\t1 dir\ta/deep\n"


def test_du_of_a_missing_path_is_one_line_error(tree_and_bundle) -> None:
    _src, bundle = tree_and_bundle
    assert "nope" in assert_one_line_error(run_cli("du", bundle, "nope"))


def test_fsspec_du_of_a_tree_without_links_is_the_stored_total(tmp_path) -> None:
    pytest.importorskip("fsspec")
    from fsspec.spec import AbstractFileSystem

    from bundlefs.integrations.fsspec import BundleFileSystem

    src = build_tree(tmp_path / "src", SPEC)
    assert run_cli("pack", "-q", src, tmp_path / "t.bundle").returncode == 0
    fs = BundleFileSystem(str(tmp_path / "t.bundle"), skip_instance_cache=True)
    try:
        for path in ("a", "/"):
            assert fs.du(path) == _walked(src / path.strip("/"))["bytes"]
            assert fs.du(path) == AbstractFileSystem.du(fs, path)  # fsspec's own walk agrees
        with pytest.raises(FileNotFoundError):
            fs.du("nope")
    finally:
        fs.close()


def test_fsspec_du_with_links_adds_up_every_path_as_fsspec_does(tree_and_bundle) -> None:
    pytest.importorskip("fsspec")
    from fsspec.spec import AbstractFileSystem

    from bundlefs.integrations.fsspec import BundleFileSystem

    _src, bundle = tree_and_bundle
    fs = BundleFileSystem(str(bundle), skip_instance_cache=True)
    try:
        assert fs.du("/") == AbstractFileSystem.du(fs, "/")
    finally:
        fs.close()
