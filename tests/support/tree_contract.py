"""The tree contract: one set of checks that every way of reading a bundle must pass.

A packed bundle is read through the ``Bundle`` path API and through a FUSE mount with plain ``os``
calls; both must tell the same facts about the source tree it was packed from. ``TreeContract``
holds those facts as ``test_*`` methods (as zarr's store test base classes do); a subclass named
``Test…`` supplies two fixtures and collects them all:

- ``tree_view``: a ``TreeView`` of the packed bundle (see the protocol below);
- ``tree_source``: the source directory the bundle was packed from (a ``Path``), never modified.

Paths given to a view are bytes relative to the bundle root (``b""`` is the root), so names that
are not UTF-8 need no special care. A view raises the ``OSError`` subclasses ``os`` would.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest


class StatLike(Protocol):
    st_mode: int
    st_ino: int
    st_nlink: int
    st_uid: int
    st_gid: int
    st_size: int
    st_mtime_ns: int


class TreeView(Protocol):
    """What the contract needs of a way to read a tree. ``rel`` is relative bytes."""

    def listdir(self, rel: bytes) -> list[bytes]: ...

    def scandir(self, rel: bytes) -> dict[bytes, tuple[bool, bool, bool, bool]]:
        """name → ``dir_entry_kinds`` of each item its scandir yields."""
        ...

    def stat(self, rel: bytes) -> StatLike: ...

    def lstat(self, rel: bytes) -> StatLike: ...

    def readlink(self, rel: bytes) -> bytes: ...

    def read(self, rel: bytes) -> bytes:
        """The whole file, in one call."""
        ...

    def read_at(self, rel: bytes, offset: int, size: int) -> bytes:
        """Open, seek to ``offset``, read up to ``size`` bytes."""
        ...

    def walk(self) -> list[tuple[bytes, list[bytes], list[bytes]]]:
        """``os.walk`` of the whole tree, top-down, with tops relative (the root is ``b""``)."""
        ...


def dir_entry_kinds(entry) -> tuple[bool, bool, bool, bool]:
    """(is_dir(), is_dir(follow_symlinks=False), is_file(), is_symlink()) of a scandir item.

    ``os.DirEntry.is_dir()`` raises for a symlink whose target passes through a file (ENOTDIR)
    where ``os.walk`` counts it as not a directory; so do we (``BundleDirEntry`` says False).
    """

    def guarded(test) -> bool:
        try:
            return test()
        except NotADirectoryError:
            return False

    return (
        guarded(entry.is_dir),
        entry.is_dir(follow_symlinks=False),
        guarded(entry.is_file),
        entry.is_symlink(),
    )


# -- the source side -------------------------------------------------------------------------------


def _source_entries(root: Path) -> Iterator[tuple[bytes, os.stat_result]]:
    """(relative path, lstat) of every entry below ``root``, the root itself first as ``b""``."""
    top_b = os.fsencode(root)
    yield b"", os.lstat(top_b)
    for top, dirs, files in os.walk(top_b):
        rel_top = os.path.relpath(top, top_b)
        for name in sorted(dirs + files):
            rel = name if rel_top == b"." else os.path.join(rel_top, name)
            yield rel, os.lstat(os.path.join(top, name))


def _kind(root: Path, predicate) -> list[tuple[bytes, os.stat_result]]:
    return [(rel, st) for rel, st in _source_entries(root) if predicate(st.st_mode)]


def _source(root: Path, rel: bytes) -> bytes:
    return os.path.join(os.fsencode(root), rel) if rel else os.fsencode(root)


def _read_source(root: Path, rel: bytes) -> bytes:
    with open(_source(root, rel), "rb") as f:
        return f.read()


def _walk_source(root: Path) -> set[tuple[bytes, tuple[bytes, ...], tuple[bytes, ...]]]:
    top_b = os.fsencode(root)
    out = set()
    for top, dirs, files in os.walk(top_b):
        rel = os.path.relpath(top, top_b)
        out.add((b"" if rel == b"." else rel, tuple(sorted(dirs)), tuple(sorted(files))))
    return out


def _ranges(size: int, record: int) -> list[tuple[int, int]]:
    """Odd (offset, size) pairs: inside, across and at the edges of records and of the file."""
    candidates = [
        (1, 1),
        (3, 100),
        (record - 1, 2),
        (record + 7, record),
        (2 * record - 13, 3 * record + 26),
        (size // 2 + 1, 333),
        (size - 1, 1),
        (size - 5, 4096),
        (size, 10),  # at the end: nothing
        (size + 4096, 1),  # past it: nothing
    ]
    return [(o, n) for o, n in candidates if o >= 0]


# Files the partial-read check covers (paths in the contract tree of test_tree_contract.py):
# multi-record, all zeros, incompressible, tiny, and deep.
PARTIAL_READ_FILES = (
    b"a/multi.bin",
    b"a/zeros.bin",
    b"sample/big.bin",
    b"sample/noise.bin",
    b"hello.txt",
)
RECORD_SIZE = 4096  # the contract tree's record size


class TreeContract:
    """The facts every view of a packed tree must report as the source tree does."""

    # -- listings --------------------------------------------------------------------------------

    def test_every_directory_lists_the_source_names(self, tree_view, tree_source):
        directories = _kind(tree_source, stat.S_ISDIR)
        assert len(directories) > 5
        for rel, _st in directories:
            expected = sorted(os.listdir(_source(tree_source, rel)))
            assert sorted(tree_view.listdir(rel)) == expected, rel

    def test_every_directory_lists_each_name_once(self, tree_view, tree_source):
        for rel, _st in _kind(tree_source, stat.S_ISDIR):
            names = tree_view.listdir(rel)
            assert len(names) == len(set(names)), rel
            assert b"." not in names and b".." not in names

    def test_scandir_tells_the_kind_of_every_entry_as_os_scandir_does(self, tree_view, tree_source):
        for rel, _st in _kind(tree_source, stat.S_ISDIR):
            with os.scandir(_source(tree_source, rel)) as it:
                expected = {e.name: dir_entry_kinds(e) for e in it}
            assert tree_view.scandir(rel) == expected, rel

    def test_walking_the_whole_tree_equals_os_walk_of_the_source(self, tree_view, tree_source):
        walked = tree_view.walk()
        as_set = {(top, tuple(sorted(d)), tuple(sorted(f))) for top, d, f in walked}
        assert len(as_set) == len(walked)  # no directory visited twice
        assert as_set == _walk_source(tree_source)

    # -- attributes ------------------------------------------------------------------------------

    def test_sizes_of_files_and_symlinks_match(self, tree_view, tree_source):
        for rel, st in _source_entries(tree_source):
            if not stat.S_ISDIR(st.st_mode):  # a directory's size is the file system's own
                assert tree_view.lstat(rel).st_size == st.st_size, rel

    def test_modes_match(self, tree_view, tree_source):
        for rel, st in _source_entries(tree_source):
            assert tree_view.lstat(rel).st_mode == st.st_mode, (rel, oct(st.st_mode))

    def test_mtimes_match_to_the_nanosecond(self, tree_view, tree_source):
        mtimes = set()
        for rel, st in _source_entries(tree_source):
            assert tree_view.lstat(rel).st_mtime_ns == st.st_mtime_ns, rel
            mtimes.add(st.st_mtime_ns)
        assert any(t < 0 for t in mtimes)  # pre-1970 is in the tree
        assert any(t % 1000 for t in mtimes)  # and sub-microsecond digits

    def test_owners_match(self, tree_view, tree_source):
        for rel, st in _source_entries(tree_source):
            got = tree_view.lstat(rel)
            assert (got.st_uid, got.st_gid) == (st.st_uid, st.st_gid), rel

    def test_nlink_of_files_and_symlinks_matches_the_source(self, tree_view, tree_source):
        for rel, st in _source_entries(tree_source):
            if not stat.S_ISDIR(st.st_mode):
                assert tree_view.lstat(rel).st_nlink == st.st_nlink, rel

    def test_nlink_of_a_directory_is_two_plus_its_subdirectories(self, tree_view, tree_source):
        # The Unix convention, whatever the source file system's own (btrfs says 1).
        for rel, _st in _kind(tree_source, stat.S_ISDIR):
            with os.scandir(_source(tree_source, rel)) as it:
                subdirs = sum(1 for e in it if e.is_dir(follow_symlinks=False))
            assert tree_view.lstat(rel).st_nlink == 2 + subdirs, rel

    def test_hard_links_share_one_inode_number_and_nothing_else_does(self, tree_view, tree_source):
        # Source inode → view inode must be one-to-one: names of one file share a number, and
        # distinct entries never do.
        seen: dict[int, int] = {}
        for rel, st in _source_entries(tree_source):
            ino = tree_view.lstat(rel).st_ino
            assert seen.setdefault(st.st_ino, ino) == ino, rel
        assert len(set(seen.values())) == len(seen)
        assert any(st.st_nlink > 1 for _r, st in _kind(tree_source, stat.S_ISREG))

    def test_stat_follows_a_symlink_and_lstat_does_not(self, tree_view, tree_source):
        followed = 0
        for rel, _st in _kind(tree_source, stat.S_ISLNK):
            assert stat.S_ISLNK(tree_view.lstat(rel).st_mode), rel
            try:
                target = os.stat(_source(tree_source, rel))
            except OSError:
                continue  # dangling: checked with the missing paths
            got = tree_view.stat(rel)
            assert got.st_mode == target.st_mode, rel
            if not stat.S_ISDIR(target.st_mode):  # a directory's size is the file system's own
                assert got.st_size == target.st_size, rel
            # The very entry the link names (every link in the tree stays inside it).
            real = os.path.realpath(_source(tree_source, rel))
            named = os.path.relpath(real, os.path.realpath(os.fsencode(tree_source)))
            assert got.st_ino == tree_view.lstat(named).st_ino, rel
            followed += 1
        assert followed >= 2

    # -- content ---------------------------------------------------------------------------------

    def test_every_file_reads_the_source_bytes(self, tree_view, tree_source):
        files = _kind(tree_source, stat.S_ISREG)
        for rel, _st in files:
            assert tree_view.read(rel) == _read_source(tree_source, rel), rel
        assert any(st.st_size == 0 for _r, st in files)
        assert any(st.st_size > 4 * RECORD_SIZE for _r, st in files)

    def test_every_symlink_reads_its_stored_target(self, tree_view, tree_source):
        links = _kind(tree_source, stat.S_ISLNK)
        assert len(links) >= 4
        for rel, _st in links:
            assert tree_view.readlink(rel) == os.readlink(_source(tree_source, rel)), rel

    @pytest.mark.parametrize("rel", PARTIAL_READ_FILES, ids=os.fsdecode)
    def test_partial_reads_at_odd_offsets_match_the_source(self, tree_view, tree_source, rel):
        content = _read_source(tree_source, rel)
        for offset, size in _ranges(len(content), RECORD_SIZE):
            expected = content[offset : offset + size]
            assert tree_view.read_at(rel, offset, size) == expected, (rel, offset, size)

    # -- errors ----------------------------------------------------------------------------------

    MISSING = (b"no-such-file", b"a/no-such-file", b"empty/x", b"a/b/c/d/e", b"dangling")

    def test_a_missing_path_raises_file_not_found(self, tree_view, tree_source):
        for rel in self.MISSING:
            assert not os.path.exists(_source(tree_source, rel))
            for call in (tree_view.stat, tree_view.read, tree_view.listdir):
                with pytest.raises(FileNotFoundError):
                    call(rel)
            with pytest.raises(FileNotFoundError):
                tree_view.read_at(rel, 0, 1)
            if rel != b"dangling":  # its own entry exists: only what it names does not
                for call in (tree_view.lstat, tree_view.readlink):
                    with pytest.raises(FileNotFoundError):
                        call(rel)

    def test_reading_a_directory_raises_is_a_directory(self, tree_view, tree_source):
        for rel in (b"a", b"empty", b"a/b/c", b"dirlink"):
            with pytest.raises(IsADirectoryError):
                tree_view.read(rel)
            with pytest.raises(IsADirectoryError):
                tree_view.read_at(rel, 0, 10)

    def test_a_path_through_a_file_raises_not_a_directory(self, tree_view, tree_source):
        for rel in (b"hello.txt/x", b"a/multi.bin/y/z", b"sample/through-a-file"):
            for call in (tree_view.stat, tree_view.read):
                with pytest.raises(NotADirectoryError):
                    call(rel)

    def test_listing_a_file_raises_not_a_directory(self, tree_view, tree_source):
        for rel in (b"hello.txt", b"a/multi.bin", b"link"):
            with pytest.raises(NotADirectoryError):
                tree_view.listdir(rel)

    def test_readlink_of_a_non_symlink_raises_oserror_einval(self, tree_view, tree_source):
        # As os.readlink: callers catch OSError around it.
        for rel in (b"hello.txt", b"a"):
            with pytest.raises(OSError) as caught:
                tree_view.readlink(rel)
            assert caught.value.errno == 22  # EINVAL
