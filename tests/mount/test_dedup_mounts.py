"""A bundle packed with ``--dedup``, mounted: each copy of a shared content reads as its own file
(``diff -r`` against the source tree), with its own mode, mtime and inode number."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bundlefs import pack
from tests.library.test_dedup import dup_tree
from tests.support.trees import diff_r

pytestmark = pytest.mark.mount


def test_copies_sharing_content_mount_as_files_of_their_own(mount_bundle, tmp_path: Path):
    src = dup_tree(tmp_path / "src")
    pack(str(src), str(tmp_path / "d.bundle"), dedup=True)
    m = mount_bundle(tmp_path / "d.bundle")
    assert diff_r(src, m.mountpoint).returncode == 0
    first, copy = os.stat(m.mountpoint / "a" / "f4"), os.stat(m.mountpoint / "b" / "g4")
    assert first.st_ino != copy.st_ino and copy.st_nlink == 1
    assert (copy.st_mode & 0o777, copy.st_mtime_ns) == (
        0o600,
        os.stat(src / "b" / "g4").st_mtime_ns,
    )
