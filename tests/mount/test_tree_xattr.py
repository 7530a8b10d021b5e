"""The ``user.bundlefs.tree`` xattr of a mounted directory: its stored totals (format version 5)
as JSON, what ``os.walk`` of the mount adds up to; an older bundle's directories do not offer it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from bundlefs import pack
from tests.support.trees import build_rich_tree

pytestmark = pytest.mark.mount

TREE = b"user.bundlefs.tree"
V4_BUNDLE = Path(__file__).parents[1] / "data" / "v4-twelve-shards.bundle"


def _walked(root: Path) -> dict[str, int]:
    """The totals a walk finds below ``root`` (symlinks not followed, each inode once)."""
    files = dirs = size = entries = 0
    seen: set[int] = set()
    for path, subdirs, names in os.walk(root):
        for name in subdirs + names:
            st = os.lstat(os.path.join(path, name))
            entries += 1
            dirs += stat.S_ISDIR(st.st_mode)
            if stat.S_ISREG(st.st_mode) and st.st_ino not in seen:
                seen.add(st.st_ino)
                files += 1
                size += st.st_size
    return {"bytes": size, "dirs": dirs, "entries": entries, "files": files}


def test_a_directory_xattr_tree_is_what_a_walk_of_the_mount_adds_up_to(mount_bundle, tmp_path):
    src = build_rich_tree(tmp_path / "src")
    pack(str(src), str(tmp_path / "t.bundle"))
    m = mount_bundle(tmp_path / "t.bundle")
    # (not a/: a/b/shared-too is a second name of /shared, counted where its first name is)
    for directory in (m.mountpoint, m.mountpoint / "a" / "b" / "c"):
        assert TREE in [n.encode() for n in os.listxattr(directory)]
        assert json.loads(os.getxattr(directory, TREE)) == _walked(directory)


def test_files_and_older_bundles_have_no_tree_xattr(mount_bundle, tmp_path):
    src = build_rich_tree(tmp_path / "src")
    pack(str(src), str(tmp_path / "t.bundle"))
    m = mount_bundle(tmp_path / "t.bundle")
    with pytest.raises(OSError):
        os.getxattr(m.mountpoint / "hello.txt", TREE)
    old = mount_bundle(V4_BUNDLE)
    assert TREE.decode() not in os.listxattr(old.mountpoint)
