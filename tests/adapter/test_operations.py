"""``BundleOperations`` in process: its handlers called directly, without a kernel or a mount.

Every test builds the adapter over a real packed bundle (the session's sample bundle, or a damaged
copy of it) and closes it afterwards. Where a handler needs the FUSE session (``readdir_reply``
takes a token only a live session can make), the session call is replaced by a recorder; the
real-mount tests (test_mount.py, test_open_modes.py, test_tree_contract.py) cover the rest.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import select
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyfuse3
import pytest
import trio

from bundlefs import Bundle
from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.errors import (
    BundleClosedError,
    BundleError,
    CorruptDataError,
    EntryNotFound,
    FormatError,
    IsADirectory,
    NotADirectory,
    NotASymlink,
    WouldBlock,
)
from bundlefs.mount import kernel, operations
from bundlefs.mount.kernel import no_open_unavailable
from bundlefs.mount.operations import (
    CACHE_TIMEOUT,
    BundleOperations,
    MountSettings,
    _errno_for,
)
from tests.conftest import FIXED_MTIME_NS, SAMPLE_FILES, SAMPLE_RECORD_SIZE, flip_byte

ROOT = fmt.ROOT_INO
BIG = SAMPLE_FILES["big.bin"]  # 5 records and 123 bytes
LOGGER = operations.__name__

# =================================================================================================
# Fixtures and helpers
# =================================================================================================


@pytest.fixture
def make_ops(sample_bundle_path: Path) -> Iterator[Callable[..., BundleOperations]]:
    """``make_ops(bundle_path=None, cache_size=None, on_ready=None, **MountSettings fields)``.

    Every adapter made is closed after the test (load threads stopped, bundle closed).
    """
    made: list[BundleOperations] = []

    def _make(
        bundle_path: Path | None = None,
        *,
        cache_size: int | None = None,
        on_ready: Callable[[], None] | None = None,
        **settings,
    ) -> BundleOperations:
        extra = {} if cache_size is None else {"cache_size": cache_size}
        bundle = Bundle(bundle_path or sample_bundle_path, **extra)
        try:
            ops = BundleOperations(bundle, MountSettings(**settings), on_ready)
        except BaseException:
            bundle.close()
            raise
        made.append(ops)
        return ops

    try:
        yield _make
    finally:
        for ops in made:
            ops.close()


@pytest.fixture
def ops(make_ops: Callable[..., BundleOperations]) -> BundleOperations:
    """The adapter over the sample bundle with default settings (4 load threads, prefetch)."""
    return make_ops()


async def ino_of(ops: BundleOperations, path: str | bytes) -> int:
    """The inode of ``path`` found with the adapter's own lookups, one component at a time."""
    ino = ROOT
    for part in os.fsencode(path).split(b"/"):
        if part:
            attr = await ops.lookup(ino, part, None)
            assert attr.st_ino, f"{path!r}: {part!r} not found"
            ino = attr.st_ino
    return ino


async def fuse_errno(call) -> int:
    """The errno of the FUSEError an awaited handler call raises (fails if it raises none)."""
    with pytest.raises(pyfuse3.FUSEError) as caught:
        await call
    return caught.value.errno


@dataclass(frozen=True)
class Reply:
    name: bytes
    ino: int
    mode: int
    next_id: int


class ReaddirRecorder:
    """Stands in for ``pyfuse3.readdir_reply`` (any listing on a stock binding),
    ``readdir_reply_stats`` (a READDIRPLUS on the patched one) and ``readdir_reply_batch`` (a
    plain READDIR on the patched one): takes ``room`` entries a request, then says full."""

    def __init__(self) -> None:
        self.token = object()
        self.room: int | None = None
        self.accepted: list[Reply] = []
        self.plus = True

    def __call__(self, token, name, attr, next_id) -> bool:
        assert token is self.token, "the handler must pass on the token it was given"
        assert self.plus, "a plain READDIR is answered in batches"
        if self.room is not None and len(self.accepted) >= self.room:
            return False  # the kernel's buffer is full: this entry was not taken
        self.accepted.append(Reply(name, attr.st_ino, attr.st_mode, next_id))
        return True

    def is_plus(self, token) -> bool:
        assert token is self.token
        return self.plus

    def plain_batch(self, token, names, inodes, modes, next_id) -> int:
        # ``readdir_reply_batch``: a plain READDIR on the patched binding
        assert not self.plus
        return self.batch(token, names, inodes, modes, next_id)

    def stats(self, token, names, stats, template, next_id) -> int:
        # ``readdir_reply_stats``: a READDIRPLUS on the patched binding, attributes in batches
        assert token is self.token and self.plus
        assert len(names) == len(stats) > 0 and template.entry_timeout > 0
        return self.batch(token, names, [s[0] for s in stats], [s[1] for s in stats], next_id)

    def batch(self, token, names, inodes, modes, next_id) -> int:
        assert token is self.token
        assert len(names) == len(inodes) == len(modes) > 0
        for i, entry in enumerate(zip(names, inodes, modes, strict=True)):
            if self.room is not None and len(self.accepted) >= self.room:
                return i
            self.accepted.append(Reply(*entry, next_id + i))
        return len(names)


@pytest.fixture(params=["readdirplus", "plain", "stock"])
def readdir(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Callable:
    """``await readdir(ops, fh, start_id=0, room=None) -> [Reply]``: one request, as a
    READDIRPLUS, a plain READDIR (answered in batches) or on a stock binding (no batches)."""
    recorder = ReaddirRecorder()
    recorder.plus = request.param != "plain"
    monkeypatch.setattr(pyfuse3, "readdir_reply", recorder)
    monkeypatch.setattr(pyfuse3, "readdir_plus", recorder.is_plus, raising=False)

    async def _readdir(ops, fh, start_id=0, room=None) -> list[Reply]:
        recorder.accepted = []
        recorder.room = room
        ops._reply_batch = None if request.param == "stock" else recorder.plain_batch
        template = ops._stat_attributes((0, 0, 1, 0, 0, 0, 0, 0))
        ops._reply_stats = None if request.param == "stock" else (recorder.stats, template)
        await ops.readdir(fh, start_id, recorder.token)
        return recorder.accepted

    return _readdir


def source_names(tree: Path, directory: str = "") -> list[bytes]:
    """A source directory's names in the bundle's order (raw bytes, ascending)."""
    return sorted(os.listdir(os.fsencode(tree / directory)))


class ReadAtSpy:
    """Wraps ``read_at``: records (nowait, thread) per call; ``would_block`` forces
    every ``nowait`` call to raise WouldBlock as a read that must wait for the disk would."""

    def __init__(self, read_at: Callable, *, would_block: bool) -> None:
        self._real = read_at
        self.would_block = would_block
        self.calls: list[tuple[bool, int]] = []

    def __call__(self, entry, offset, size, **kwargs):
        nowait = kwargs.get("nowait", False)
        self.calls.append((nowait, threading.get_ident()))
        if nowait and self.would_block:
            raise WouldBlock
        return self._real(entry, offset, size, **kwargs)


# The seams: the adapter reads entries through ``bundle.tree`` and bytes through
# ``bundle.content`` (the Bundle's inode-level API); the tests below replace single methods there.


def inode_api(ops: BundleOperations):
    return ops.bundle.tree


def content_api(ops: BundleOperations):
    return ops.bundle.content


def spy_on_reads(ops: BundleOperations, monkeypatch, *, would_block: bool) -> ReadAtSpy:
    spy = ReadAtSpy(content_api(ops).read_at, would_block=would_block)
    monkeypatch.setattr(content_api(ops), "read_at", spy)
    return spy


# =================================================================================================
# The errno table
# =================================================================================================

# Every exception the library raises on purpose, and what the mount must answer for it.
LIBRARY_ERRORS = [
    (EntryNotFound("x"), errno.ENOENT),
    (NotADirectory("x"), errno.ENOTDIR),
    (IsADirectory("x"), errno.EISDIR),
    (NotASymlink("x"), errno.EINVAL),
    (FormatError("x"), errno.EIO),
    (CorruptDataError("x", shard=0, record=0), errno.EIO),
    (BundleClosedError("x"), errno.EIO),
    (BundleError("x"), errno.EIO),
]
ERROR_IDS = [type(e).__name__ for e, _ in LIBRARY_ERRORS]


@pytest.mark.parametrize(("error", "expected"), LIBRARY_ERRORS, ids=ERROR_IDS)
def test_errno_table_maps_each_library_error(error: BaseException, expected: int) -> None:
    assert _errno_for(error) == expected


def test_errno_table_passes_a_fuse_errors_own_errno_through() -> None:
    assert _errno_for(pyfuse3.FUSEError(errno.EROFS)) == errno.EROFS
    assert _errno_for(pyfuse3.FUSEError(pyfuse3.ENOATTR)) == errno.ENODATA


def test_errno_table_answers_eio_for_anything_unexpected() -> None:
    assert _errno_for(ValueError("bug")) == errno.EIO
    assert _errno_for(KeyError("bug")) == errno.EIO


@pytest.mark.trio
@pytest.mark.parametrize(("error", "expected"), LIBRARY_ERRORS, ids=ERROR_IDS)
async def test_handlers_answer_the_errno_table_for_each_library_error(
    ops, monkeypatch, error, expected
):
    # The handler wrapper has its own except clauses: it must agree with the one table.
    def broken_entry(_ino):
        raise error

    monkeypatch.setattr(inode_api(ops), "entry", broken_entry)
    assert await fuse_errno(ops.getattr(ROOT, None)) == expected == _errno_for(error)


@pytest.mark.trio
async def test_an_unexpected_exception_in_a_handler_is_eio_logged_and_counted(
    ops, monkeypatch, caplog
):
    def broken_entry(_ino):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(inode_api(ops), "entry", broken_entry)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert await fuse_errno(ops.getattr(ROOT, None)) == errno.EIO
    assert ops.eio_count == 1
    [record] = caplog.records
    assert record.getMessage() == "unexpected error in getattr"
    assert record.exc_info is not None and record.exc_info[0] is ZeroDivisionError


@pytest.mark.trio
async def test_a_library_error_in_a_handler_is_eio_logged_once_and_counted(
    ops, monkeypatch, caplog
):
    def broken_entry(_ino):
        raise FormatError("entry 1 is garbage")

    monkeypatch.setattr(inode_api(ops), "entry", broken_entry)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert await fuse_errno(ops.listxattr(ROOT, None)) == errno.EIO
    assert ops.eio_count == 1
    assert [r.getMessage() for r in caplog.records] == ["listxattr: entry 1 is garbage"]


@pytest.mark.trio
async def test_expected_errors_such_as_enoent_are_neither_logged_nor_counted_as_eio(ops, caplog):
    hello = await ino_of(ops, "hello.txt")
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert await fuse_errno(ops.lookup(hello, b"x", None)) == errno.ENOTDIR
        assert await fuse_errno(ops.readdir(hello, 0, object())) == errno.ENOTDIR
        assert await fuse_errno(ops.read(ROOT, 0, 10)) == errno.EISDIR
    assert ops.eio_count == 0
    assert caplog.records == []


# =================================================================================================
# lookup and getattr
# =================================================================================================


@pytest.mark.trio
async def test_lookup_of_a_missing_name_returns_a_negative_entry_the_kernel_caches(ops):
    # Not ENOENT: an entry with inode 0 is a negative dentry the kernel keeps for entry_timeout.
    for parent, name in ((ROOT, b"no-such-name"), (await ino_of(ops, "dir/sub"), b"zzz")):
        attr = await ops.lookup(parent, name, None)
        assert attr.st_ino == 0
        assert attr.entry_timeout == CACHE_TIMEOUT
    assert ops.requests["lookup"] == 4  # "dir", "sub" and the two misses


@pytest.mark.trio
async def test_lookup_of_a_file_gives_its_source_attributes_cached_forever(ops, sample_tree):
    attr = await ops.lookup(ROOT, b"big.bin", None)
    st = os.lstat(sample_tree / "big.bin")
    assert attr.st_ino > ROOT
    assert attr.st_mode == st.st_mode
    assert attr.st_size == len(BIG) == st.st_size
    assert attr.st_nlink == 1
    assert (attr.st_uid, attr.st_gid) == (st.st_uid, st.st_gid)
    assert attr.st_mtime_ns == attr.st_atime_ns == attr.st_ctime_ns == FIXED_MTIME_NS
    assert attr.st_blocks == (len(BIG) + 511) // 512
    assert attr.st_blksize == fmt.DEFAULT_BLOCK_SIZE
    assert attr.entry_timeout == attr.attr_timeout == CACHE_TIMEOUT


@pytest.mark.trio
async def test_lookup_of_dot_and_dotdot_gives_the_directory_and_its_parent(ops):
    dir_ino = await ino_of(ops, "dir")
    sub_ino = await ino_of(ops, "dir/sub")
    assert (await ops.lookup(sub_ino, b".", None)).st_ino == sub_ino
    assert (await ops.lookup(sub_ino, b"..", None)).st_ino == dir_ino
    assert (await ops.lookup(dir_ino, b"..", None)).st_ino == ROOT
    assert (await ops.lookup(ROOT, b"..", None)).st_ino == ROOT  # the root is its own parent


@pytest.mark.trio
async def test_lookup_in_a_file_is_enotdir(ops):
    hello = await ino_of(ops, "hello.txt")
    assert await fuse_errno(ops.lookup(hello, b"x", None)) == errno.ENOTDIR


@pytest.mark.trio
async def test_lookup_of_a_symlink_does_not_follow_it(ops):
    attr = await ops.lookup(ROOT, b"dirlink", None)
    assert stat.S_ISLNK(attr.st_mode)
    assert attr.st_size == len(b"dir")
    assert attr.st_ino != await ino_of(ops, "dir")


@pytest.mark.trio
async def test_both_names_of_a_hard_link_give_one_inode_with_nlink_two(ops):
    first = await ops.lookup(ROOT, b"hard1", None)
    second = await ops.lookup(await ino_of(ops, "dir"), b"hard2", None)
    assert first.st_ino == second.st_ino
    assert first.st_nlink == second.st_nlink == 2
    assert first.st_size == second.st_size == len(SAMPLE_FILES["hard1"])


@pytest.mark.trio
async def test_lookup_prefetches_what_it_finds_unless_prefetch_is_off(make_ops, monkeypatch):
    for prefetch, expected in ((True, True), (False, False)):
        ops = make_ops(prefetch=prefetch)
        advised = []
        monkeypatch.setattr(
            content_api(ops), "prefetch", lambda entry, a=advised: a.append(entry.ino)
        )
        attr = await ops.lookup(ROOT, b"hello.txt", None)
        await ops.lookup(ROOT, b".", None)  # dots name what the kernel has already
        await ops.lookup(ROOT, b"missing", None)
        assert advised == ([attr.st_ino] if expected else [])


@pytest.mark.trio
async def test_getattr_agrees_with_lookup(ops):
    for path in ("hello.txt", "dir", "dir/sub/deeper", "link", "empty", "dir/hard2"):
        ino = await ino_of(ops, path)
        *parent, name = os.fsencode(path).split(b"/")
        looked_up = await ops.lookup(await ino_of(ops, b"/".join(parent)), name, None)
        got = await ops.getattr(ino, None)
        fields = ("st_ino", "st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks")
        fields += ("st_mtime_ns", "st_blksize", "entry_timeout", "attr_timeout")
        assert {f: getattr(got, f) for f in fields} == {f: getattr(looked_up, f) for f in fields}


@pytest.mark.trio
async def test_getattr_of_the_root_is_a_directory_with_the_source_mode_and_nlink(ops, sample_tree):
    attr = await ops.getattr(ROOT, None)
    st = os.lstat(sample_tree)
    subdirs = sum(1 for e in os.scandir(sample_tree) if e.is_dir(follow_symlinks=False))
    assert attr.st_ino == ROOT
    assert attr.st_mode == st.st_mode
    assert stat.S_ISDIR(attr.st_mode)
    assert attr.st_nlink == 2 + subdirs == 4  # "dir" and "emptydir"
    assert attr.st_mtime_ns == FIXED_MTIME_NS
    assert attr.st_blocks == 0


@pytest.mark.trio
async def test_getattr_shows_the_owner_the_settings_impose(make_ops, sample_tree):
    st = os.lstat(sample_tree / "hello.txt")
    stored = make_ops()
    imposed = make_ops(uid=12345, gid=54321)
    hello = await ino_of(stored, "hello.txt")
    attr = await stored.getattr(hello, None)
    assert (attr.st_uid, attr.st_gid) == (st.st_uid, st.st_gid)
    attr = await imposed.getattr(hello, None)
    assert (attr.st_uid, attr.st_gid) == (12345, 54321)


@pytest.mark.trio
async def test_getattr_of_an_unknown_inode_is_enoent_and_not_counted_as_damage(ops, caplog):
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        for unknown in (0, ops.bundle.config.entry_count + 1, 2**63):
            assert await fuse_errno(ops.getattr(unknown, None)) == errno.ENOENT
    assert ops.eio_count == 0
    assert not caplog.records
    assert ops.requests["getattr"] == 3


# =================================================================================================
# readlink
# =================================================================================================


@pytest.mark.trio
async def test_readlink_returns_the_stored_target_bytes(ops):
    for name, target in ((b"link", b"hello.txt"), (b"dangling", b"does/not/exist")):
        assert await ops.readlink(await ino_of(ops, name), None) == target
    assert await ops.readlink(await ino_of(ops, "through-a-file"), None) == b"hello.txt/x"


@pytest.mark.trio
async def test_readlink_of_a_file_or_directory_is_einval(ops):
    for path in ("hello.txt", "dir", "empty"):
        assert await fuse_errno(ops.readlink(await ino_of(ops, path), None)) == errno.EINVAL
    assert ops.eio_count == 0


# =================================================================================================
# Directories
# =================================================================================================


@pytest.mark.trio
async def test_readdir_lists_every_name_in_order_with_attributes(ops, readdir, sample_tree):
    replies = await readdir(ops, ROOT)
    assert [r.name for r in replies] == source_names(sample_tree)
    assert [r.next_id for r in replies] == list(range(1, len(replies) + 1))
    for r in replies:
        looked_up = await ops.lookup(ROOT, r.name, None)
        assert (r.ino, r.mode) == (looked_up.st_ino, looked_up.st_mode)
        assert r.mode == os.lstat(os.path.join(os.fsencode(sample_tree), r.name)).st_mode


@pytest.mark.trio
async def test_readdir_resumes_from_the_offset_the_kernel_returns(ops, readdir, sample_tree):
    listed: list[Reply] = []
    start, requests = 0, 0
    while True:
        replies = await readdir(ops, ROOT, start, room=3)
        requests += 1
        if not replies:
            break
        listed += replies
        start = replies[-1].next_id  # the last entry the kernel took
    names = [r.name for r in listed]
    assert names == source_names(sample_tree)  # each exactly once, in order
    assert len(set(names)) == len(names)
    assert requests == -(-len(names) // 3) + 1  # full pages, then the empty end


@pytest.mark.trio
async def test_readdir_with_no_room_takes_nothing_and_resumes_at_the_same_entry(ops, readdir):
    assert await readdir(ops, ROOT, 4, room=0) == []
    full = await readdir(ops, ROOT)
    resumed = await readdir(ops, ROOT, 4)
    assert resumed == full[4:]


@pytest.mark.trio
async def test_readdir_of_a_subdirectory_lists_its_children_and_resolves_hard_links(
    ops, readdir, sample_tree
):
    dir_ino = await ino_of(ops, "dir")
    replies = await readdir(ops, dir_ino)
    assert (
        [r.name for r in replies]
        == source_names(sample_tree, "dir")
        == [
            b"a.txt",
            b"b.txt",
            b"hard2",
            b"sub",
        ]
    )
    hard2 = next(r for r in replies if r.name == b"hard2")
    assert hard2.ino == await ino_of(ops, "hard1")


@pytest.mark.trio
async def test_readdir_at_or_past_the_end_and_of_an_empty_directory_lists_nothing(
    ops, readdir, sample_tree
):
    count = len(source_names(sample_tree))
    assert await readdir(ops, ROOT, count) == []
    assert await readdir(ops, await ino_of(ops, "emptydir")) == []


@pytest.mark.trio
async def test_readdir_of_a_file_is_enotdir(ops, readdir):
    hello = await ino_of(ops, "hello.txt")
    assert await fuse_errno(readdir(ops, hello)) == errno.ENOTDIR


@pytest.mark.trio
async def test_opendir_on_the_open_path_hands_back_the_inode_as_handle(make_ops):
    ops = make_ops(open_mode="open")
    ops.init()
    dir_ino = await ino_of(ops, "dir")
    assert await ops.opendir(dir_ino, None) == dir_ino
    assert await ops.opendir(ROOT, None) == ROOT
    assert await fuse_errno(ops.opendir(await ino_of(ops, "hello.txt"), None)) == errno.ENOTDIR
    assert await ops.releasedir(dir_ino) is None


# =================================================================================================
# Opening files
# =================================================================================================


@pytest.mark.trio
async def test_open_for_reading_hands_back_the_inode_with_keep_cache(make_ops):
    ops = make_ops(open_mode="open")
    ops.init()
    hello = await ino_of(ops, "hello.txt")
    info = await ops.open(hello, os.O_RDONLY, None)
    assert info.fh == hello
    assert info.keep_cache is True
    assert info.direct_io is False
    assert await ops.release(hello) is None


WRITE_FLAGS = {
    "O_WRONLY": os.O_WRONLY,
    "O_RDWR": os.O_RDWR,
    "O_TRUNC": os.O_RDONLY | os.O_TRUNC,
    "O_APPEND": os.O_RDONLY | os.O_APPEND,
    "O_WRONLY|O_CREAT": os.O_WRONLY | os.O_CREAT,
}


@pytest.mark.trio
@pytest.mark.parametrize("open_mode", ["open", "auto"])
@pytest.mark.parametrize("flags", WRITE_FLAGS.values(), ids=WRITE_FLAGS.keys())
async def test_open_for_writing_is_erofs_on_either_open_path(make_ops, open_mode, flags):
    ops = make_ops(open_mode=open_mode)
    ops.init()
    hello = await ino_of(ops, "hello.txt")
    assert await fuse_errno(ops.open(hello, flags, None)) == errno.EROFS


@pytest.mark.trio
@pytest.mark.skipif(no_open_unavailable() is not None, reason="pyfuse3 lacks the no-open patch")
async def test_no_open_path_answers_enosys_to_open_and_opendir(make_ops):
    ready = []
    ops = make_ops(open_mode="auto", on_ready=lambda: ready.append(True))
    assert ops.open_mode == "open"  # until the handshake says otherwise
    ops.init()
    assert ready == [True]
    assert (ops.open_mode, ops.open_mode_reason) == ("no-open", "")
    hello = await ino_of(ops, "hello.txt")
    assert await fuse_errno(ops.open(hello, os.O_RDONLY, None)) == errno.ENOSYS
    assert await fuse_errno(ops.opendir(ROOT, None)) == errno.ENOSYS
    # ...and read/readdir then take the inode where a handle would be.
    assert bytes(await ops.read(hello, 0, 100)) == SAMPLE_FILES["hello.txt"]


@pytest.mark.trio
async def test_open_mode_open_is_kept_and_explained(make_ops):
    ready = []
    ops = make_ops(open_mode="open", on_ready=lambda: ready.append(True))
    ops.init()
    assert ready == [True]
    assert (ops.open_mode, ops.open_mode_reason) == ("open", "chosen with --open-mode open")
    assert ops.stats()["open_mode"] == "open"


# =================================================================================================
# Reading
# =================================================================================================

BIG_READS = {
    "whole": (0, len(BIG)),
    "first byte": (0, 1),
    "odd offset in record 0": (1, 4097),
    "across a record boundary": (SAMPLE_RECORD_SIZE - 3, 7),
    "three records": (SAMPLE_RECORD_SIZE - 1, 2 * SAMPLE_RECORD_SIZE + 2),
    "last record only": (5 * SAMPLE_RECORD_SIZE + 1, 122),
    "runs over the end": (len(BIG) - 5, 4096),
}


@pytest.mark.trio
@pytest.mark.parametrize(("offset", "size"), BIG_READS.values(), ids=BIG_READS.keys())
async def test_read_returns_the_source_bytes_of_any_range(ops, offset, size):
    big = await ino_of(ops, "big.bin")
    assert bytes(await ops.read(big, offset, size)) == BIG[offset : offset + size]


@pytest.mark.trio
@pytest.mark.parametrize("name", ["noise.bin", "zeros.bin", "lines.txt", "uni-ünï código.txt"])
async def test_read_of_other_file_kinds_returns_their_bytes(ops, name):
    # Incompressible (raw records), all-zero records, text: whole and at an odd offset.
    ino = await ino_of(ops, name)
    content = SAMPLE_FILES[name]
    assert bytes(await ops.read(ino, 0, len(content))) == content
    assert bytes(await ops.read(ino, 3, SAMPLE_RECORD_SIZE)) == content[3 : 3 + SAMPLE_RECORD_SIZE]


@pytest.mark.trio
async def test_reads_past_end_of_file_return_empty(ops):
    big = await ino_of(ops, "big.bin")
    empty = await ino_of(ops, "empty")
    assert bytes(await ops.read(big, len(BIG), 4096)) == b""
    assert bytes(await ops.read(big, len(BIG) + 10_000, 1)) == b""
    assert bytes(await ops.read(empty, 0, 4096)) == b""
    assert bytes(await ops.read(big, 0, 0)) == b""
    assert ops.eio_count == 0


@pytest.mark.trio
async def test_read_of_a_directory_is_eisdir(ops):
    assert await fuse_errno(ops.read(await ino_of(ops, "dir"), 0, 10)) == errno.EISDIR


@pytest.mark.trio
async def test_read_of_a_hard_links_second_name_gives_the_shared_bytes(ops):
    hard2 = await ino_of(ops, "dir/hard2")
    assert bytes(await ops.read(hard2, 0, 4096)) == SAMPLE_FILES["hard1"]


@pytest.mark.trio
async def test_read_serves_cached_bytes_inline_without_a_thread(ops, monkeypatch):
    big = await ino_of(ops, "big.bin")
    spy = spy_on_reads(ops, monkeypatch, would_block=False)
    loop = threading.get_ident()
    assert bytes(await ops.read(big, 7, 100)) == BIG[7:107]
    assert spy.calls == [(True, loop)]  # asked not to wait, and it did not have to


@pytest.mark.trio
async def test_read_falls_back_to_a_worker_thread_when_the_inline_read_would_block(
    ops, monkeypatch
):
    big = await ino_of(ops, "big.bin")
    spy = spy_on_reads(ops, monkeypatch, would_block=True)
    loop = threading.get_ident()
    offset, size = SAMPLE_RECORD_SIZE - 11, 2 * SAMPLE_RECORD_SIZE
    data = await ops.read(big, offset, size)
    assert bytes(data) == BIG[offset : offset + size]
    [(first_nowait, first_thread), (second_nowait, second_thread)] = spy.calls
    assert (first_nowait, first_thread) == (True, loop)
    assert second_nowait is False
    assert second_thread != loop  # the blocking read ran in a load thread
    assert ops.stats()["requests"]["read"] == 1
    assert ops.eio_count == 0


@pytest.mark.trio
async def test_read_falls_back_to_the_same_bytes_for_every_range(ops, monkeypatch):
    big = await ino_of(ops, "big.bin")
    inline = {k: bytes(await ops.read(big, o, s)) for k, (o, s) in BIG_READS.items()}
    spy = spy_on_reads(ops, monkeypatch, would_block=True)
    threaded = {k: bytes(await ops.read(big, o, s)) for k, (o, s) in BIG_READS.items()}
    assert threaded == inline
    assert [nowait for nowait, _ in spy.calls] == [True, False] * len(BIG_READS)


@pytest.mark.trio
async def test_read_with_no_load_threads_reads_inline_and_blocking(make_ops, monkeypatch):
    ops = make_ops(load_threads=0)
    big = await ino_of(ops, "big.bin")
    spy = spy_on_reads(ops, monkeypatch, would_block=True)
    assert bytes(await ops.read(big, 5, 40_000)) == BIG[5:40_005]
    assert spy.calls == [(False, threading.get_ident())]  # never asked not to wait


@pytest.fixture
def fake_fuse_queue(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[bool], None]]:
    """Stands in for the /dev/fuse poll ``init()`` sets up: ``busy(True)`` puts a request in the
    queue, ``busy(False)`` empties it. (The one private seam: the session has no public one.)"""
    read_end, write_end = os.pipe()
    poll = select.poll()
    poll.register(read_end, select.POLLIN)
    monkeypatch.setattr(kernel, "poll_fuse_device", lambda: poll)
    queued = []

    def busy(yes: bool) -> None:
        if yes and not queued:
            os.write(write_end, b"r")
            queued.append(True)
        elif not yes and queued:
            os.read(read_end, 1)
            queued.clear()

    try:
        yield busy
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.trio
async def test_read_waits_inline_when_no_other_request_is_queued(ops, monkeypatch, fake_fuse_queue):
    ops.init()
    big = await ino_of(ops, "big.bin")
    spy = spy_on_reads(ops, monkeypatch, would_block=True)
    loop = threading.get_ident()
    fake_fuse_queue(False)
    assert bytes(await ops.read(big, 100, 5000)) == BIG[100:5100]
    assert spy.calls == [(True, loop), (False, loop)]  # nothing to serve meanwhile: no hop
    spy.calls.clear()
    fake_fuse_queue(True)
    assert bytes(await ops.read(big, 100, 5000)) == BIG[100:5100]
    assert spy.calls[0] == (True, loop)
    assert spy.calls[1][0] is False and spy.calls[1][1] != loop  # requests wait: hop


@pytest.mark.trio
async def test_read_never_waits_inline_on_a_store_whose_reads_may_stall(
    ops, monkeypatch, fake_fuse_queue
):
    # An object store's miss is a GET with retries: waited for inline, a frozen store stalled
    # every request of the mount for 80 s. Even with nothing queued, such a read hops.
    ops.init()
    big = await ino_of(ops, "big.bin")
    monkeypatch.setattr(content_api(ops), "reads_may_stall", True)
    spy = spy_on_reads(ops, monkeypatch, would_block=True)
    loop = threading.get_ident()
    fake_fuse_queue(False)
    assert bytes(await ops.read(big, 100, 5000)) == BIG[100:5100]
    assert spy.calls[0] == (True, loop)
    assert spy.calls[1][0] is False and spy.calls[1][1] != loop


@pytest.mark.trio
async def test_read_hops_to_a_thread_while_another_load_is_in_flight_even_with_an_empty_queue(
    ops, monkeypatch, fake_fuse_queue
):
    # Waiting inline would stall the loop behind a load that is already running elsewhere.
    ops.init()
    big = await ino_of(ops, "big.bin")
    real = content_api(ops).read_at
    entered, release = threading.Event(), threading.Event()
    blocking_threads: dict[int, int] = {}

    def read_at(entry, offset, size, **kwargs):
        if kwargs.get("nowait"):
            raise WouldBlock
        blocking_threads[offset] = threading.get_ident()
        if offset == 0:  # the first read holds its load thread until released
            entered.set()
            assert release.wait(10)
        return real(entry, offset, size, **kwargs)

    monkeypatch.setattr(content_api(ops), "read_at", read_at)
    results: dict[int, bytes] = {}

    async def read(offset: int) -> None:
        results[offset] = bytes(await ops.read(big, offset, 1000))

    async with trio.open_nursery() as nursery:
        fake_fuse_queue(True)  # the first read finds requests waiting: it hops
        nursery.start_soon(read, 0)
        await trio.to_thread.run_sync(entered.wait, 10)
        try:
            fake_fuse_queue(False)  # the queue is empty now, but a load is in flight
            await read(7)
        finally:
            release.set()
    loop = threading.get_ident()
    assert results == {0: BIG[:1000], 7: BIG[7:1007]}
    assert loop not in blocking_threads.values()
    assert blocking_threads[0] != blocking_threads[7]


# =================================================================================================
# Damage
# =================================================================================================


@dataclass(frozen=True)
class Damage:
    bundle: Path
    start: int  # the damaged record's first and last+1 byte, as offsets in the file
    end: int
    record: int  # its offset in the shard's stream, as damage reports name it


@pytest.fixture
def damage(sample_bundle_path: Path, copy_bundle) -> Callable[[str], Damage]:
    """``damage(name)``: a copy of the sample bundle with one byte flipped in the record that
    holds byte ``SAMPLE_RECORD_SIZE`` of file ``name`` (big.bin: lz4; noise.bin: raw)."""

    def _damage(name: str) -> Damage:
        bundle = copy_bundle(sample_bundle_path)
        with Bundle(bundle) as b:
            entry = b.resolve(name)
            record = b.content.record_at(entry.shard, entry.offset + SAMPLE_RECORD_SIZE)
        flip_byte(bundle / fmt.shard_filename(record.shard), record.stored_offset + 10)
        start = record.offset - entry.offset
        assert start > 0 and record.end - entry.offset < entry.size  # inside, not at the edges
        return Damage(bundle, start, record.end - entry.offset, record.offset)

    return _damage


def damage_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "damaged data" in r.getMessage()]


@pytest.mark.trio
async def test_a_damaged_record_fails_the_read_with_eio_and_logs_the_file_once(
    make_ops, damage, caplog
):
    damaged = damage("big.bin")
    ops = make_ops(damaged.bundle)
    big = await ino_of(ops, "big.bin")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        for _ in range(3):
            assert await fuse_errno(ops.read(big, damaged.start + 5, 100)) == errno.EIO
    [line] = damage_lines(caplog)
    assert line.startswith("damaged data, read failed with EIO: record fails its checksum")
    assert "file '/big.bin'" in line
    assert "shard 0" in line
    assert f"record at offset {damaged.record}" in line
    assert str(damaged.bundle) in line
    assert ops.eio_count == 3  # every failed read counts; only the first is logged
    assert ops.stats()["eio_count"] == 3


@pytest.mark.trio
async def test_a_damaged_record_leaves_the_files_other_records_and_other_files_readable(
    make_ops, damage, caplog
):
    damaged = damage("big.bin")
    ops = make_ops(damaged.bundle)
    big = await ino_of(ops, "big.bin")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert await fuse_errno(ops.read(big, damaged.start, 1)) == errno.EIO
        assert bytes(await ops.read(big, 0, damaged.start)) == BIG[: damaged.start]
        assert (
            bytes(await ops.read(big, damaged.end, 1000)) == BIG[damaged.end : damaged.end + 1000]
        )
        hello = await ino_of(ops, "hello.txt")
        assert bytes(await ops.read(hello, 0, 100)) == SAMPLE_FILES["hello.txt"]
    assert ops.eio_count == 1
    assert len(damage_lines(caplog)) == 1


@pytest.mark.trio
async def test_whole_and_partial_reads_of_a_damaged_raw_record_are_logged_once_each(
    make_ops, damage, caplog
):
    # A raw record read whole is checked by the file's CRC (no record to name); read in part,
    # by the record's own CRC: two different damage reports, each logged once however often.
    damaged = damage("noise.bin")
    ops = make_ops(damaged.bundle)
    noise = await ino_of(ops, "noise.bin")
    size = len(SAMPLE_FILES["noise.bin"])
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        for _ in range(2):
            assert await fuse_errno(ops.read(noise, 0, size)) == errno.EIO
            assert await fuse_errno(ops.read(noise, damaged.start + 1, 10)) == errno.EIO
    whole, partial = damage_lines(caplog)
    assert "file content fails its checksum" in whole
    assert "record at offset" not in whole
    assert "record fails its checksum" in partial
    assert "record at offset" in partial
    assert "file '/noise.bin'" in whole and "file '/noise.bin'" in partial
    assert ops.eio_count == 4


@pytest.mark.trio
async def test_damage_found_in_a_load_thread_is_eio_and_logged_once_too(
    make_ops, damage, caplog, monkeypatch
):
    damaged = damage("big.bin")
    ops = make_ops(damaged.bundle)
    big = await ino_of(ops, "big.bin")
    spy = spy_on_reads(ops, monkeypatch, would_block=True)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        for _ in range(2):
            assert await fuse_errno(ops.read(big, damaged.start + 1, 50)) == errno.EIO
    assert [nowait for nowait, _ in spy.calls] == [True, False, True, False]
    assert spy.calls[1][1] != threading.get_ident()
    assert len(damage_lines(caplog)) == 1
    assert ops.eio_count == 2


# =================================================================================================
# statfs, access, extended attributes
# =================================================================================================


@pytest.mark.trio
async def test_statfs_reports_the_bundle_size_and_entry_count_with_nothing_free(
    ops, sample_bundle_path, sample_tree
):
    st = await ops.statfs(None)
    block = fmt.DEFAULT_BLOCK_SIZE
    on_disk = sum(p.stat().st_size for p in sample_bundle_path.glob("shard-*"))
    on_disk += (sample_bundle_path / fmt.INDEX_DIR / fmt.INDEX_FILE).stat().st_size
    entries = 1 + sum(len(dirs) + len(files) for _t, dirs, files in os.walk(sample_tree))
    assert (st.f_bsize, st.f_frsize) == (block, block)
    assert st.f_blocks == -(-on_disk // block)
    assert (st.f_bfree, st.f_bavail, st.f_ffree, st.f_favail) == (0, 0, 0, 0)
    assert st.f_files == entries
    assert st.f_namemax == 255


@pytest.mark.trio
async def test_access_for_writing_is_erofs_and_for_reading_is_granted(ops):
    hello = await ino_of(ops, "hello.txt")
    for ino in (ROOT, hello):
        assert await ops.access(ino, os.R_OK | os.X_OK, None) is True
        assert await ops.access(ino, os.F_OK, None) is True
        assert await fuse_errno(ops.access(ino, os.W_OK, None)) == errno.EROFS
        assert await fuse_errno(ops.access(ino, os.R_OK | os.W_OK, None)) == errno.EROFS


@pytest.mark.trio
async def test_a_files_crc_xattr_is_the_crc32c_of_its_content(ops):
    for name in ("hello.txt", "big.bin", "empty"):
        ino = await ino_of(ops, name)
        assert fmt.XATTR_CRC in await ops.listxattr(ino, None)
        value = await ops.getxattr(ino, fmt.XATTR_CRC, None)
        assert value == f"{crc32c(SAMPLE_FILES[name]):08x}".encode()


@pytest.mark.trio
async def test_a_files_digest_xattr_is_the_hex_of_its_content_digest(ops):
    for name in ("hello.txt", "big.bin", "empty"):
        ino = await ino_of(ops, name)
        assert fmt.XATTR_DIGEST in await ops.listxattr(ino, None)
        value = await ops.getxattr(ino, fmt.XATTR_DIGEST, None)
        assert value == hashlib.sha256(SAMPLE_FILES[name]).hexdigest()[:32].encode()


@pytest.mark.trio
async def test_a_files_content_type_is_an_xattr_where_it_has_one(ops):
    hello, empty = await ino_of(ops, "hello.txt"), await ino_of(ops, "empty")
    assert await ops.getxattr(hello, fmt.XATTR_CONTENT_TYPE, None) == b"text/plain"
    assert fmt.XATTR_CONTENT_TYPE in await ops.listxattr(hello, None)
    assert fmt.XATTR_CONTENT_TYPE not in await ops.listxattr(empty, None)


@pytest.mark.trio
async def test_directories_have_only_their_tree_xattr_and_symlinks_none(ops):
    for path, names in (("dir", [fmt.XATTR_TREE]), ("emptydir", [fmt.XATTR_TREE]), ("link", [])):
        ino = await ino_of(ops, path)
        assert await ops.listxattr(ino, None) == names
        assert await fuse_errno(ops.getxattr(ino, fmt.XATTR_CRC, None)) == pyfuse3.ENOATTR
    empty = await ino_of(ops, "emptydir")
    assert json.loads(await ops.getxattr(empty, fmt.XATTR_TREE, None)) == {
        "bytes": 0,
        "dirs": 0,
        "entries": 0,
        "files": 0,
    }


@pytest.mark.trio
async def test_an_unknown_xattr_name_is_enoattr(ops):
    hello = await ino_of(ops, "hello.txt")
    for ino in (ROOT, hello):
        assert await fuse_errno(ops.getxattr(ino, b"user.nope", None)) == errno.ENODATA
    assert await fuse_errno(ops.getxattr(hello, fmt.XATTR_STATS, None)) == errno.ENODATA


@pytest.mark.trio
async def test_user_data_attached_at_pack_time_is_an_xattr(make_ops, pack_tree):
    def user_data(rel: bytes, _st) -> bytes | None:
        return b"label:" + rel if rel.endswith(b".txt") else None

    bundle = pack_tree({"a.txt": b"a", "b.bin": b"b", "d": {}}, user_data=user_data)
    ops = make_ops(bundle)
    a_txt = await ino_of(ops, "a.txt")
    assert sorted(await ops.listxattr(a_txt, None)) == sorted(
        [fmt.XATTR_CRC, fmt.XATTR_DIGEST, fmt.XATTR_USER_DATA, fmt.XATTR_CONTENT_TYPE]
    )
    assert await ops.getxattr(a_txt, fmt.XATTR_USER_DATA, None) == b"label:a.txt"
    b_bin = await ino_of(ops, "b.bin")
    assert await ops.listxattr(b_bin, None) == [fmt.XATTR_CRC, fmt.XATTR_DIGEST]


@pytest.mark.trio
async def test_stats_xattr_on_the_root_is_json_of_the_adapters_counters(make_ops):
    ops = make_ops(cache_size=4 * 1024 * 1024, open_mode="open")
    assert await ops.listxattr(ROOT, None) == [fmt.XATTR_TREE, fmt.XATTR_STATS, fmt.XATTR_BUNDLE]
    await ops.getattr(ROOT, None)
    stats = json.loads(await ops.getxattr(ROOT, fmt.XATTR_STATS, None))
    assert set(stats) == {
        "cache_capacity", "cache_bytes", "cache_records", "cache_hits", "cache_misses",
        "cache_evictions", "bytes_decompressed", "eio_count", "damage_eio_count",
        "outage_eio_count", "open_mode", "open_mode_reason", "binding", "requests", "workers",
        "single_process_reason",
    }  # fmt: skip
    assert stats["workers"] == 1
    assert stats["binding"] == ("stock" if no_open_unavailable() else "patched")
    assert stats["cache_capacity"] == 4 * 1024 * 1024
    assert (stats["cache_bytes"], stats["cache_records"], stats["eio_count"]) == (0, 0, 0)
    assert (stats["open_mode"], stats["open_mode_reason"]) == (
        "open",
        "chosen with --open-mode open",
    )
    assert set(stats["requests"]) == {
        "lookup", "getattr", "readlink", "opendir", "readdir", "releasedir", "open", "read",
        "release", "statfs", "access", "listxattr", "getxattr",
    }  # fmt: skip
    counted = {k: v for k, v in stats["requests"].items() if v}
    assert counted == {"listxattr": 1, "getattr": 1, "getxattr": 1}  # this request included


@pytest.mark.trio
async def test_stats_xattr_counts_cache_misses_and_hits_of_partial_reads(ops):
    big = await ino_of(ops, "big.bin")

    async def stats() -> dict:
        return json.loads(await ops.getxattr(ROOT, fmt.XATTR_STATS, None))

    before = await stats()
    assert bytes(await ops.read(big, 10, 20)) == BIG[10:30]  # loads record 0 into the cache
    middle = await stats()
    assert bytes(await ops.read(big, 40, 20)) == BIG[40:60]  # record 0 again
    after = await stats()
    assert middle["cache_misses"] - before["cache_misses"] == 1
    assert (middle["cache_records"], middle["cache_bytes"]) == (1, SAMPLE_RECORD_SIZE)
    assert middle["bytes_decompressed"] - before["bytes_decompressed"] == SAMPLE_RECORD_SIZE
    assert after["cache_hits"] - middle["cache_hits"] == 1
    assert after["cache_misses"] == middle["cache_misses"]
    assert after["requests"]["read"] == 2


# =================================================================================================
# Every mutation
# =================================================================================================

MUTATIONS = {
    "setattr": lambda ino: (ino, pyfuse3.EntryAttributes(), pyfuse3.SetattrFields(), None, None),
    "setxattr": lambda ino: (ino, b"user.x", b"v", None),
    "removexattr": lambda ino: (ino, fmt.XATTR_CRC, None),
    "mknod": lambda ino: (ROOT, b"node", stat.S_IFIFO | 0o644, 0, None),
    "mkdir": lambda ino: (ROOT, b"newdir", 0o755, None),
    "unlink": lambda ino: (ROOT, b"hello.txt", None),
    "rmdir": lambda ino: (ROOT, b"emptydir", None),
    "symlink": lambda ino: (ROOT, b"newlink", b"hello.txt", None),
    "rename": lambda ino: (ROOT, b"hello.txt", ROOT, b"moved", 0, None),
    "link": lambda ino: (ino, ROOT, b"another", None),
    "create": lambda ino: (ROOT, b"new", 0o644, os.O_WRONLY | os.O_CREAT, None),
    "write": lambda ino: (ino, 0, b"overwrite"),
}


@pytest.mark.trio
@pytest.mark.parametrize("handler", MUTATIONS)
async def test_every_write_family_handler_is_erofs(ops, handler):
    hello = await ino_of(ops, "hello.txt")
    args = MUTATIONS[handler](hello)
    assert await fuse_errno(getattr(ops, handler)(*args)) == errno.EROFS
    # Nothing changed.
    assert bytes(await ops.read(hello, 0, 100)) == SAMPLE_FILES["hello.txt"]
    assert (await ops.lookup(ROOT, b"hello.txt", None)).st_ino == hello


@pytest.mark.trio
async def test_forget_keeps_no_state_to_lose(ops):
    hello = await ino_of(ops, "hello.txt")
    assert await ops.forget([(hello, 1), (ROOT, 5)]) is None
    assert (await ops.getattr(hello, None)).st_size == len(SAMPLE_FILES["hello.txt"])
