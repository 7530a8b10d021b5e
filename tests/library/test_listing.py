"""Plain listings (read/listing.py, core/format/dirents.py): names, inodes and modes without whole
decodes, the same as ``TreeModel.children`` gives, and as strict about the index."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from bundlefs import Bundle, PackOptions, pack
from bundlefs.core import format as fmt
from bundlefs.core.format.dirents import dirents as raw_dirents
from bundlefs.errors import FormatError
from tests.support.hostile import find_entry, forge, raw_entry_put, read_values


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle whose ``d/`` holds every kind of entry and names from 1 to 255 bytes."""
    src = tmp_path_factory.mktemp("listing-src")
    d = src / "d"
    d.mkdir()
    for i in range(300):
        name = d / (f"{i:03d}" + "n" * (i % 253))
        if i % 50 == 1:
            name.mkdir()
        elif i % 50 == 2:
            name.symlink_to("elsewhere")
        elif i % 50 == 3:
            os.link(d / "000", name)
        elif i == 4:
            os.mkfifo(name)
        else:
            name.write_bytes(b"x" * i * (1 + 300 * (i % 5 == 0)))  # sizes of 1 to 3 bytes
            if i % 7 == 0:  # whole seconds: the layout with a u32 mtime
                os.utime(name, (1_700_000_000, 1_700_000_000))
    dest = tmp_path_factory.mktemp("listing-bundle") / "b"
    pack(str(src), str(dest), PackOptions())
    return dest


def _by_children(tree, directory):
    kids = list(tree.children(directory))
    return [n for n, _ in kids], [e.ino for _, e in kids], [e.mode for _, e in kids]


def test_a_plain_listing_equals_children_in_any_pieces(mixed):
    with Bundle(mixed) as b:
        d = b.tree.entry(b.resolve("d").ino)
        want = _by_children(b.tree, d)
        assert b.tree.dirents(d, 0, d.size) == want
        for step in (1, 7, 128):
            got: tuple[list, list, list] = ([], [], [])
            previous = None
            for start in range(0, d.size, step):
                names, inodes, modes = b.tree.dirents(d, start, step, previous)
                got[0].extend(names), got[1].extend(inodes), got[2].extend(modes)
                previous = names[-1]
            assert got == want
        assert b.tree.dirents(d, d.size, 10) == ([], [], [])
        names, stats = b.tree.dirent_stats(d, 0, d.size)
        kids = [e for _, e in b.tree.children(d)]
        assert names == want[0]
        assert stats == [
            (e.ino, e.mode, e.nlink, *b.tree.owner(e), e.size, e.mtime_ns, e.rdev) for e in kids
        ]
        assert b.tree.dirent_stats(d, 7, 5, want[0][6]) == (names[7:12], stats[7:12])
        assert stat.S_ISFIFO(want[2][4]) and stat.S_ISLNK(want[2][2]) and stat.S_ISDIR(want[2][1])
        assert want[1][3] == want[1][0]  # a hard link lists its file's inode


def test_only_known_file_layouts_are_read_without_a_decode():
    file = fmt.Entry(ino=5, name=b"f", mode=stat.S_IFREG | 0o644, owner=0, size=3, mtime_ns=10**9)
    directory = fmt.Entry(
        ino=6,
        name=b"d",
        mode=stat.S_IFDIR | 0o755,
        owner=0,
        size=0,
        mtime_ns=0,
        parent=1,
        first_child=7,
    )
    values = [fmt.encode_entry(file), fmt.encode_entry(directory), b"\x81", b""]
    fmt.entry_name(values[0])  # the file's layout learnt, as any lookup learns it
    names, modes, rest = raw_dirents(values)
    assert names[0] == b"f" and modes[0] == file.mode
    assert rest == [1, 2, 3]


@pytest.mark.parametrize("forgery", ["unsorted", "slash", "empty", "nul"])
def test_a_forged_name_fails_the_plain_listing_as_it_fails_children(mixed, tmp_path, forgery):
    bundle = tmp_path / "b"
    shutil.copytree(mixed, bundle)
    victim = find_entry(bundle, lambda e: e.name.startswith(b"010"))
    value = read_values(bundle, fmt.DB_ENTRIES)[fmt.entry_key(victim.ino)]
    assert value.endswith(victim.name)  # versions 3 on: the name ends the value
    name = {"unsorted": b"zzz", "slash": b"010/x", "empty": b"", "nul": b"010\0"}[forgery]
    forge(bundle, raw_entry_put(victim.ino, value[: -len(victim.name)] + name))
    with Bundle(bundle) as b:
        d = b.tree.entry(b.resolve("d").ino)
        with pytest.raises(FormatError):
            b.tree.dirents(d, 0, d.size)
        with pytest.raises(FormatError):
            b.tree.dirents(d, 5, 10, None)
        with pytest.raises(FormatError):
            b.tree.dirent_stats(d, 0, d.size)
        with pytest.raises(FormatError):
            _by_children(b.tree, d)
