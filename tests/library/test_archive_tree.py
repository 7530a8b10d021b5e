"""An archive's tree kept on disk (issue 27, bounded memory): members in any order, names given
twice, hard links and symlinks place exactly what ``tar -x`` would, and a member costs no memory.

What each member maps to is test_archives.py's; here the tree's bookkeeping: the last member of a
name wins, a hard link keeps the content it named when that name is given again, the names
count, content types decided from what the tree keeps of a file's first bytes.
"""

from __future__ import annotations

import io
import random
import stat
import tarfile
import tracemalloc
from pathlib import Path

from bundlefs import Bundle, PackOptions, pack
from bundlefs.core.content_types import detect, head_facts
from bundlefs.packing.sources.archive import ArchiveSource
from bundlefs.packing.sources.base import SourceErrors, StoredContent

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 40


def _tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


def _member(name: str, data: bytes = b"", *, kind=tarfile.REGTYPE, **kw):
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mtime = kind, len(data), kw.pop("mtime", 1_600_000_000)
    info.mode = kw.pop("mode", 0o644)
    for key, value in kw.items():
        setattr(info, key, value)
    return info, data


def _entries(bundle_path: Path) -> dict[str, tuple]:
    """path -> (mode, mtime, nlink, content or target, the first path of its inode)."""
    out: dict[str, tuple] = {}
    first: dict[int, str] = {}
    with Bundle(bundle_path) as bundle:
        for top, dirs, files in bundle.walk(""):
            for name in sorted(dirs + files):
                path = f"{top}/{name}" if top else name
                st = bundle.stat(path, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    data = bundle.read(path)
                elif stat.S_ISLNK(st.st_mode):
                    data = bundle.readlink(path).encode()
                else:
                    data = b""
                group = first.setdefault(st.st_ino, path)
                out[path] = (st.st_mode, st.st_mtime_ns, st.st_nlink, data, group)
    return out


def _pack(tmp_path: Path, name: str, members: list) -> Path:
    archive = tmp_path / f"{name}.tar"
    archive.write_bytes(_tar(members))
    pack(str(archive), str(tmp_path / name), PackOptions(created_ns=0))
    return tmp_path / name


def test_members_in_any_order_with_names_given_twice_pack_the_tree_tar_x_leaves(tmp_path):
    final = [
        _member("d/", kind=tarfile.DIRTYPE, mode=0o700),
        _member("d/e/f.txt", b"f"),
        _member("d/link", kind=tarfile.SYMTYPE, linkname="e/f.txt"),
        _member("top.bin", b"top"),
        _member("z/y/x", b"deep"),
    ]
    shuffled = list(final)
    random.Random(27).shuffle(shuffled)
    stale = [_member("top.bin", b"an earlier top"), _member("d/e/f.txt", b"an earlier f")]
    in_order = _pack(tmp_path, "in-order", final)
    # Earlier members of a name first: the last of each wins.
    any_order = _pack(tmp_path, "any-order", stale + shuffled)
    assert _entries(any_order) == _entries(in_order)


def test_a_hard_link_keeps_its_content_when_the_name_it_named_is_given_again(tmp_path):
    bundle = _pack(
        tmp_path,
        "b",
        [
            _member("f", b"first"),
            _member("g", kind=tarfile.LNKTYPE, linkname="f"),
            _member("h", kind=tarfile.LNKTYPE, linkname="f"),
            _member("f", b"second"),
        ],
    )
    entries = _entries(bundle)
    assert entries["f"][2:4] == (1, b"second")
    assert entries["g"][2:] == (2, b"first", "g")
    assert entries["h"][2:] == (2, b"first", "g")


def test_a_link_to_a_symlink_is_a_copy_and_a_directory_described_again_keeps_its_children(
    tmp_path,
):
    bundle = _pack(
        tmp_path,
        "b",
        [
            _member("s", kind=tarfile.SYMTYPE, linkname="target"),
            _member("t", kind=tarfile.LNKTYPE, linkname="s"),
            _member("d/x", b"x"),
            _member("d", kind=tarfile.DIRTYPE, mode=0o711, mtime=1_000),
            _member("e/", kind=tarfile.DIRTYPE),
            _member("e", b"a file where an empty directory was"),
            _member("g", b"a file, then a directory"),
            _member("g", kind=tarfile.DIRTYPE),
        ],
    )
    entries = _entries(bundle)
    assert entries["t"][0] == stat.S_IFLNK | 0o644 and entries["t"][3] == b"target"
    assert entries["d"][:2] == (stat.S_IFDIR | 0o711, 1_000 * 10**9)
    assert entries["d/x"][3] == b"x"
    assert entries["e"][3] == b"a file where an empty directory was"
    assert stat.S_ISDIR(entries["g"][0])


def test_content_types_from_the_facts_kept_match_those_from_the_bytes(tmp_path):
    files = {
        "picture": PNG,
        "weights.pth": b"\x80\x02binary pickle",
        "paths.pth": b"/usr/lib/python3/dist-packages\n",
        "plain.json": b"{}",
    }
    bundle = _pack(tmp_path, "b", [_member(name, data) for name, data in files.items()])
    with Bundle(bundle) as b:
        for name, data in files.items():
            assert b.stat(name).content_type == detect(name.encode(), data)
            assert detect(name.encode(), head_facts(data)) == detect(name.encode(), data)


class _Sink:
    """A content sink that stores nothing: the tree's own memory is what is measured."""

    def store_stream(self, rel, chunks, st, *, tick=None, again=None) -> StoredContent:
        head, size = b"", 0
        for chunk in chunks:
            head = head or chunk[:264]
            size += len(chunk)
        return StoredContent(0, 0, size, 0, st, head, digest=b"d" * 16)


def _held(archive: Path) -> tuple[int, int, int]:
    """Python's memory held once the archive is loaded, its peak while the tree is walked, and
    the files walked. (The peak while loading is the read buffers': a chunk more or less.)"""
    source = ArchiveSource([str(archive)], SourceErrors(False))
    tracemalloc.start()
    try:
        source.load(_Sink())
        loaded = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        pending, files = [b""], 0
        while pending:
            for item in source.children(pending.pop()):
                if stat.S_ISDIR(item.st.st_mode):
                    pending.append(item.rel)
                files += item.stored is not None
        return loaded, tracemalloc.get_traced_memory()[1], files
    finally:
        tracemalloc.stop()


def test_an_archive_member_costs_no_memory(tmp_path):
    held = []
    for count in (2_000, 20_000):
        archive = tmp_path / f"{count}.tar"
        members = [_member(f"d{i % 7}/f{i:06d}", b"x" * (i % 300)) for i in range(count)]
        archive.write_bytes(_tar(members))
        loaded, walked, files = _held(archive)
        assert files == count
        held.append((loaded, walked))
    # Held in memory, each member cost ~0.7 KB of Python objects (13 MB more at 20,000).
    (loaded_2k, walked_2k), (loaded_20k, walked_20k) = held
    assert loaded_20k - loaded_2k < 100_000, held
    assert walked_20k - walked_2k < 100_000, held
