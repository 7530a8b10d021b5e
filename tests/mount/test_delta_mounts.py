"""Bundles packed on a base, mounted: OLD and NEW side by side each read exactly as its own
source tree (``diff -r``), NEW's unchanged files served from the shards it shares with OLD."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bundlefs import pack
from tests.support.trees import build_rich_tree, diff_r

pytestmark = pytest.mark.mount


def test_old_and_new_mounted_side_by_side_each_read_as_their_tree(mount_bundle, tmp_path: Path):
    src = build_rich_tree(tmp_path / "src")
    pack(str(src), str(tmp_path / "old.bundle"))
    subprocess.run(["cp", "-a", str(src), str(tmp_path / "old-src")], check=True)
    (src / "a" / "multi.bin").write_bytes(b"rewritten")
    (src / "a" / "new.txt").write_bytes(b"added\n")
    os.unlink(src / "a" / "zeros.bin")
    pack(str(src), str(tmp_path / "new.bundle"), base=tmp_path / "old.bundle")
    old = mount_bundle(tmp_path / "old.bundle")
    new = mount_bundle(tmp_path / "new.bundle")
    assert diff_r(tmp_path / "old-src", old.mountpoint).returncode == 0
    assert diff_r(src, new.mountpoint).returncode == 0


def test_the_fifth_generation_of_a_chain_mounts_as_its_tree(mount_bundle, tmp_path: Path):
    src = build_rich_tree(tmp_path / "src")
    previous = None
    for generation in range(5):
        (src / f"gen{generation}.txt").write_bytes(b"g" * (generation + 1))
        (src / "hello.txt").write_bytes(f"hello {generation}\n".encode())
        bundle = tmp_path / f"g{generation}.bundle"
        pack(str(src), str(bundle), base=previous)
        previous = bundle
    m = mount_bundle(previous)
    assert diff_r(src, m.mountpoint).returncode == 0
