"""core/libc.py: the calls the standard library lacks (those a test can make without a mount)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from bundlefs.core.libc import unmap_file_pages

PAGE = mmap.PAGESIZE


def _resident(path: Path) -> int:
    """This process's resident bytes of its mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                inside = len(fields) == 6 and fields[5] == str(path.resolve())
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def test_unmapped_pages_leave_the_resident_set_and_read_back(tmp_path):
    path = tmp_path / "index"
    data = os.urandom(64 * PAGE)
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as shared:
        assert bytes(shared) == data  # every page touched
        assert _resident(path) == len(data)
        assert unmap_file_pages(str(path)) == len(data)
        assert _resident(path) == 0
        assert bytes(shared) == data


def test_a_private_mapping_is_left_alone(tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"x" * 8 * PAGE)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE) as private:
        private[:3] = b"new"  # a private copy: advice on it would discard it
        assert unmap_file_pages(str(path)) == 0
        assert private[:4] == b"newx"
