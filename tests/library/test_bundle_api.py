"""The path-level ``Bundle`` API against the sample bundle (see conftest.SAMPLE_SPEC): what each
call returns, how it fails, and that it stays correct under threads and across fork()."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import random
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bundlefs import Bundle, EntryNotFound, IsADirectory, NotADirectory, ReadOptions
from bundlefs.errors import NotASymlink
from bundlefs.read import tree as tree_module
from tests.conftest import (
    FIXED_MTIME_NS,
    SAMPLE_FILES,
    SAMPLE_RECORD_SIZE,
    HardLink,
    Symlink,
    expected_files,
    source_paths,
)

# --- stat -----------------------------------------------------------------------------------------


def test_root_is_inode_1_and_a_directory(sample_bundle: Bundle) -> None:
    for path in ("", "/", "."):
        st = sample_bundle.stat(path)
        assert st.st_ino == 1
        assert stat.S_ISDIR(st.st_mode)


@pytest.mark.parametrize("path", ["hello.txt", "dir", "dir/sub/deep.txt", "link", "dangling"])
def test_lstat_matches_os_lstat_of_the_source(
    sample_bundle: Bundle, sample_tree: Path, path: str
) -> None:
    got, want = sample_bundle.lstat(path), os.lstat(sample_tree / path)
    assert got.st_mode == want.st_mode
    if not stat.S_ISDIR(want.st_mode):  # a directory's size is its child count (format §3.3)
        assert got.st_size == want.st_size
    assert got.st_mtime_ns == want.st_mtime_ns == FIXED_MTIME_NS
    assert (got.st_uid, got.st_gid) == (want.st_uid, want.st_gid)


def test_stat_follows_symlinks_and_lstat_does_not(sample_bundle: Bundle) -> None:
    assert sample_bundle.stat("link") == sample_bundle.stat("hello.txt")
    assert stat.S_ISLNK(sample_bundle.lstat("link").st_mode)
    assert stat.S_ISDIR(sample_bundle.stat("dirlink").st_mode)


def test_stat_mtime_is_seconds_as_float(sample_bundle: Bundle) -> None:
    assert sample_bundle.stat("hello.txt").st_mtime == pytest.approx(FIXED_MTIME_NS / 1e9)


def test_stat_blocks_are_512_byte_units(sample_bundle: Bundle) -> None:
    st = sample_bundle.stat("big.bin")
    assert st.st_blocks == (st.st_size + 511) // 512


def test_directory_nlink_is_two_plus_subdirectories(sample_bundle: Bundle) -> None:
    assert sample_bundle.stat("").st_nlink == 2 + 2  # dir, emptydir
    assert sample_bundle.stat("dir").st_nlink == 2 + 1  # sub
    assert sample_bundle.stat("emptydir").st_nlink == 2


def test_directory_size_is_its_child_count(sample_bundle: Bundle) -> None:
    assert sample_bundle.stat("dir").st_size == len(sample_bundle.listdir("dir"))


def test_stat_of_a_missing_path_raises_file_not_found(sample_bundle: Bundle) -> None:
    with pytest.raises(EntryNotFound):
        sample_bundle.stat("nope")
    with pytest.raises(FileNotFoundError):
        sample_bundle.stat("dir/nope/deeper")


def test_stat_through_a_file_raises_not_a_directory(sample_bundle: Bundle) -> None:
    with pytest.raises(NotADirectory):
        sample_bundle.stat("hello.txt/x")


def test_stat_of_a_dangling_symlink_raises_but_lstat_works(sample_bundle: Bundle) -> None:
    with pytest.raises(EntryNotFound):
        sample_bundle.stat("dangling")
    assert sample_bundle.lstat("dangling").st_size == len("does/not/exist")


def test_dotdot_goes_up_and_stops_at_the_root(sample_bundle: Bundle) -> None:
    assert sample_bundle.read("dir/sub/../a.txt") == SAMPLE_FILES["dir/a.txt"]
    assert sample_bundle.read("../../hello.txt") == SAMPLE_FILES["hello.txt"]


def test_symlink_to_a_directory_is_followed_inside_a_path(sample_bundle: Bundle) -> None:
    assert sample_bundle.read("dirlink/sub/deep.txt") == SAMPLE_FILES["dir/sub/deep.txt"]


# --- listdir, scandir, walk -----------------------------------------------------------------------


def test_listdir_matches_the_source_in_bytewise_order(
    sample_bundle: Bundle, sample_tree: Path
) -> None:
    for path in ("", "dir", "dir/sub", "emptydir"):
        want = sorted(os.listdir(os.fsencode(sample_tree / path)))
        assert sample_bundle.listdir(os.fsencode(path)) == want


def test_listdir_returns_str_for_str_and_bytes_for_bytes(sample_bundle: Bundle) -> None:
    assert "uni-ünï código.txt" in sample_bundle.listdir("")
    assert "uni-ünï código.txt".encode() in sample_bundle.listdir(b"")


def test_listdir_of_an_empty_directory_is_empty(sample_bundle: Bundle) -> None:
    assert sample_bundle.listdir("emptydir") == []


def test_listdir_follows_a_symlink_to_a_directory(sample_bundle: Bundle) -> None:
    assert sample_bundle.listdir("dirlink") == sample_bundle.listdir("dir")


def test_listdir_of_a_file_raises_not_a_directory(sample_bundle: Bundle) -> None:
    with pytest.raises(NotADirectory):
        sample_bundle.listdir("hello.txt")


def _kinds(d) -> tuple[bool, bool, bool, bool]:
    try:
        followed = (d.is_dir(), d.is_file())
    except NotADirectoryError:  # os.DirEntry raises for ENOTDIR; Bundle (and os.walk) say "no"
        followed = (False, False)
    return (*followed, d.is_symlink(), d.is_dir(follow_symlinks=False))


def test_scandir_reports_kinds_like_os_scandir(sample_bundle: Bundle, sample_tree: Path) -> None:
    want = {d.name: _kinds(d) for d in os.scandir(sample_tree)}
    got = {d.name: _kinds(d) for d in sample_bundle.scandir("")}
    assert got == want


def test_scandir_paths_join_the_directory_and_the_name(sample_bundle: Bundle) -> None:
    assert [d.path for d in sample_bundle.scandir("dir/sub")] == [
        "dir/sub/deep.txt",
        "dir/sub/deeper",
    ]


def test_scandir_stat_and_inode_agree_with_stat(sample_bundle: Bundle) -> None:
    for d in sample_bundle.scandir("dir"):
        assert d.stat() == sample_bundle.stat(d.path)
        assert d.stat(follow_symlinks=False) == sample_bundle.lstat(d.path)


def test_walk_matches_os_walk(sample_bundle: Bundle, sample_tree: Path) -> None:
    want = [
        (os.path.relpath(top, sample_tree).removeprefix("."), sorted(dirs), sorted(files))
        for top, dirs, files in os.walk(sample_tree)
    ]
    got = [(top, sorted(dirs), sorted(files)) for top, dirs, files in sample_bundle.walk("")]
    assert sorted(got) == sorted(want)


def test_walk_from_a_subdirectory(sample_bundle: Bundle) -> None:
    assert list(sample_bundle.walk("dir/sub")) == [
        ("dir/sub", ["deeper"], ["deep.txt"]),
        ("dir/sub/deeper", [], ["deepest.txt"]),
    ]


# --- exists, readlink -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, expected",
    [
        ("hello.txt", True),
        ("dir", True),
        ("dir/sub/deeper/deepest.txt", True),
        ("link", True),
        ("dangling", False),  # like os.path.exists: follows the link
        ("missing", False),
        ("hello.txt/x", False),
    ],
)
def test_exists_is_like_os_path_exists(sample_bundle: Bundle, path: str, expected: bool) -> None:
    assert sample_bundle.exists(path) is expected


def test_scandir_of_a_symlink_through_a_file_is_not_a_directory(sample_bundle: Bundle) -> None:
    (d,) = [d for d in sample_bundle.scandir("") if d.name == "through-a-file"]
    assert d.is_symlink() and not d.is_dir() and not d.is_file()


def test_isfile_isdir_islink(sample_bundle: Bundle) -> None:
    assert sample_bundle.isfile("link") and not sample_bundle.isdir("link")
    assert sample_bundle.isdir("dirlink") and sample_bundle.islink("dirlink")
    assert sample_bundle.islink("dangling") and not sample_bundle.isfile("dangling")
    assert not sample_bundle.islink("hello.txt") and not sample_bundle.islink("missing")


def test_readlink_returns_the_stored_target(sample_bundle: Bundle) -> None:
    assert sample_bundle.readlink("link") == "hello.txt"
    assert sample_bundle.readlink(b"dangling") == b"does/not/exist"


def test_readlink_of_a_non_symlink_raises(sample_bundle: Bundle) -> None:
    with pytest.raises(NotASymlink):
        sample_bundle.readlink("hello.txt")


# --- read -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(SAMPLE_FILES))
def test_read_returns_the_file_content(sample_bundle: Bundle, path: str) -> None:
    assert sample_bundle.read(path) == SAMPLE_FILES[path]


def test_read_accepts_str_bytes_and_pathlike(sample_bundle: Bundle) -> None:
    want = SAMPLE_FILES["dir/a.txt"]
    assert sample_bundle.read("dir/a.txt") == sample_bundle.read(b"dir/a.txt") == want
    assert sample_bundle.read(Path("dir") / "a.txt") == want
    assert sample_bundle.read("/dir/a.txt") == want


def test_read_of_a_directory_raises_is_a_directory(sample_bundle: Bundle) -> None:
    with pytest.raises(IsADirectory):
        sample_bundle.read("dir")


def test_read_follows_symlinks(sample_bundle: Bundle) -> None:
    assert sample_bundle.read("link") == SAMPLE_FILES["hello.txt"]


# --- open -----------------------------------------------------------------------------------------

BIG = SAMPLE_FILES["big.bin"]


def test_open_read_all_and_in_pieces(sample_bundle: Bundle) -> None:
    with sample_bundle.open("big.bin") as f:
        assert f.read(10) == BIG[:10]
        assert f.read(SAMPLE_RECORD_SIZE) == BIG[10 : 10 + SAMPLE_RECORD_SIZE]
        assert f.read() == BIG[10 + SAMPLE_RECORD_SIZE :]
        assert f.read() == b""


def test_open_seek_and_tell(sample_bundle: Bundle) -> None:
    with sample_bundle.open("big.bin") as f:
        assert f.seekable() and f.readable() and not f.writable()
        assert f.seek(SAMPLE_RECORD_SIZE - 3) == SAMPLE_RECORD_SIZE - 3
        assert f.read(6) == BIG[SAMPLE_RECORD_SIZE - 3 : SAMPLE_RECORD_SIZE + 3]
        assert f.tell() == SAMPLE_RECORD_SIZE + 3
        assert f.seek(-4, io.SEEK_CUR) == SAMPLE_RECORD_SIZE - 1
        assert f.read(1) == BIG[SAMPLE_RECORD_SIZE - 1 : SAMPLE_RECORD_SIZE]


def test_open_seek_end(sample_bundle: Bundle) -> None:
    with sample_bundle.open("big.bin") as f:
        assert f.seek(-5, io.SEEK_END) == len(BIG) - 5
        assert f.read() == BIG[-5:]
        assert f.seek(0, io.SEEK_END) == len(BIG)


def test_open_reading_past_the_end_returns_nothing(sample_bundle: Bundle) -> None:
    with sample_bundle.open("hello.txt") as f:
        f.seek(1000)
        assert f.read(10) == b""
        assert f.tell() == 1000


def test_open_negative_seek_raises(sample_bundle: Bundle) -> None:
    with sample_bundle.open("hello.txt") as f, pytest.raises(OSError):
        f.seek(-1)


def test_open_readinto(sample_bundle: Bundle) -> None:
    buf = bytearray(100)
    with sample_bundle.open("big.bin") as f:
        f.seek(SAMPLE_RECORD_SIZE - 50)
        assert f.readinto(buf) == 100
    assert bytes(buf) == BIG[SAMPLE_RECORD_SIZE - 50 : SAMPLE_RECORD_SIZE + 50]


def test_open_readinto_at_the_end_fills_what_is_left(sample_bundle: Bundle) -> None:
    buf = bytearray(b"\xee" * 20)
    with sample_bundle.open("hello.txt") as f:
        f.seek(-4, io.SEEK_END)
        assert f.readinto(memoryview(buf)) == 4
    assert bytes(buf[:4]) == SAMPLE_FILES["hello.txt"][-4:]
    assert buf[4:] == b"\xee" * 16


def test_open_works_with_json_load(sample_bundle: Bundle) -> None:
    with sample_bundle.open("data.json") as f:
        assert json.load(f)["nested"] == {"ok": True}


def test_open_works_with_a_buffered_reader(sample_bundle: Bundle) -> None:
    with io.BufferedReader(sample_bundle.open("lines.txt"), buffer_size=1000) as f:
        lines = f.readlines()
    assert lines == SAMPLE_FILES["lines.txt"].splitlines(keepends=True)


def test_open_works_with_a_text_wrapper(sample_bundle: Bundle) -> None:
    raw = sample_bundle.open("uni-ünï código.txt")
    with io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8") as f:
        assert f.read() == "unicode ✓\n"


def test_open_file_has_a_name_and_a_size(sample_bundle: Bundle) -> None:
    with sample_bundle.open("dir/a.txt") as f:
        assert f.name == "dir/a.txt"
        assert f.size == 100


def test_open_read_after_close_raises(sample_bundle: Bundle) -> None:
    f = sample_bundle.open("hello.txt")
    f.close()
    with pytest.raises(ValueError):
        f.read()


def test_open_r_returns_text_as_the_builtin_open_does(
    sample_bundle: Bundle, sample_tree: Path
) -> None:
    for mode in ("r", "rt"):
        with sample_bundle.open("uni-ünï código.txt", mode, encoding="utf-8") as f:
            assert isinstance(f, io.TextIOWrapper)
            assert f.read() == "unicode ✓\n"
    with (
        sample_bundle.open("lines.txt", "r", encoding="ascii") as f,
        open(sample_tree / "lines.txt", encoding="ascii") as want,
    ):
        assert f.readlines() == want.readlines()
        f.seek(0)
        assert f.readline() == SAMPLE_FILES["lines.txt"].decode().splitlines(True)[0]


def test_open_text_takes_errors_and_newline_like_the_builtin(pack_tree, tmp_path: Path) -> None:
    data = b"one\r\ntwo\rthree\n\xff\n"
    with Bundle(pack_tree({"t.txt": data})) as b:
        (tmp_path / "t.txt").write_bytes(data)
        for kwargs in (
            {"errors": "replace"},
            {"errors": "surrogateescape", "newline": ""},
            {"errors": "ignore", "newline": "\r"},
        ):
            with (
                b.open("t.txt", "r", encoding="utf-8", **kwargs) as f,
                open(tmp_path / "t.txt", encoding="utf-8", **kwargs) as want,
            ):
                assert f.readlines() == want.readlines()
        with b.open("t.txt", "r", encoding="utf-8") as f, pytest.raises(UnicodeDecodeError):
            f.read()


def test_open_rb_is_binary_and_takes_no_encoding(sample_bundle: Bundle) -> None:
    with sample_bundle.open("hello.txt", "rb") as f:
        assert f.read() == SAMPLE_FILES["hello.txt"]
    with pytest.raises(ValueError):
        sample_bundle.open("hello.txt", "rb", encoding="utf-8")


def test_open_for_writing_is_refused(sample_bundle: Bundle) -> None:
    for mode in ("w", "wb", "r+b", "ab", "rbt", "rr", "x", "rU"):
        with pytest.raises(ValueError):
            sample_bundle.open("hello.txt", mode)


def test_open_of_a_directory_raises_is_a_directory(sample_bundle: Bundle) -> None:
    with pytest.raises(IsADirectory):
        sample_bundle.open("dir")


def test_open_of_a_missing_file_raises_file_not_found(sample_bundle: Bundle) -> None:
    with pytest.raises(FileNotFoundError):
        sample_bundle.open("missing")


# --- iteration and glob ---------------------------------------------------------------------------


def test_iteration_yields_every_path_once(sample_bundle: Bundle, sample_tree: Path) -> None:
    paths = list(sample_bundle.paths())
    assert all(isinstance(p, str) for p in paths)
    assert len(paths) == len(set(paths))
    assert sorted(os.fsencode(p) for p in paths) == source_paths(sample_tree)


def test_iteration_is_breadth_first_in_name_order(sample_bundle: Bundle) -> None:
    paths = list(sample_bundle.paths())
    depths = [p.count("/") for p in paths]
    assert depths == sorted(depths)
    top = [p for p in paths if "/" not in p]
    assert top == sorted(top, key=os.fsencode)
    # Inode order: the order the index holds the entries in (a hard link's own entry included).
    names = [sample_bundle.tree.stored_entry(ino).name for ino in range(2, len(paths) + 2)]
    assert names == [os.fsencode(p.rsplit("/", 1)[-1]) for p in paths]


def test_len_is_the_number_of_paths(sample_bundle: Bundle) -> None:
    paths = list(sample_bundle.paths())
    assert len(paths) == sample_bundle.config.entry_count - 1


def test_tree_iteration_yields_unfollowed_entries(sample_bundle: Bundle) -> None:
    entries = dict(sample_bundle.tree)
    assert entries["link"].is_symlink
    assert entries["dirlink"].is_symlink
    assert entries["dir"].is_dir
    assert entries["dir/hard2"].is_file


def test_iteration_does_not_count_the_root(sample_bundle: Bundle) -> None:
    assert "" not in list(sample_bundle.paths())
    assert "" not in sample_bundle
    assert "/" not in sample_bundle


def test_in_is_true_for_every_iterated_path_and_follows_no_last_symlink(
    sample_bundle: Bundle,
) -> None:
    # ``in`` is the mapping's (files only, tests/library/test_mapping.py); lexists is every path.
    assert all(sample_bundle.lexists(p) for p in sample_bundle.paths())
    assert sample_bundle.lexists("dangling")  # as os.path.lexists
    assert sample_bundle.lexists(b"dir/sub/deep.txt")
    assert sample_bundle.lexists(Path("dir/a.txt"))
    assert sample_bundle.lexists("/dir/a.txt")
    assert sample_bundle.lexists("dirlink/a.txt")  # through a symlinked directory
    for missing in ("nope", "hello.txt/x", "dir/nope", "dangling/x"):
        assert not sample_bundle.lexists(missing)
    assert 42 not in sample_bundle  # not a path: not in it, no TypeError


@pytest.mark.parametrize(
    "pattern, expected",
    [
        ("*.txt", ["hello.txt", "lines.txt", "uni-ünï código.txt"]),
        ("dir/*.txt", ["dir/a.txt", "dir/b.txt"]),
        ("**/deep*.txt", ["dir/sub/deep.txt", "dir/sub/deeper/deepest.txt"]),
        (
            "dir/**",
            [
                "dir",
                "dir/a.txt",
                "dir/b.txt",
                "dir/hard2",
                "dir/sub",
                "dir/sub/deep.txt",
                "dir/sub/deeper",
                "dir/sub/deeper/deepest.txt",
            ],
        ),
        ("*/sub", ["dir/sub"]),
        ("nothing*", []),
    ],
)
def test_glob(sample_bundle: Bundle, pattern: str, expected: list[str]) -> None:
    assert sample_bundle.glob(pattern) == expected


def test_glob_star_does_not_cross_slashes(sample_bundle: Bundle) -> None:
    assert "dir/a.txt" not in sample_bundle.glob("*a.txt")


# --- concurrency ----------------------------------------------------------------------------------


def _random_reads(b: Bundle, seed: int, count: int) -> list[str]:
    """Read random ranges of random files; return a description of every mismatch."""
    rng = random.Random(seed)
    names = ["big.bin", "noise.bin", "zeros.bin", "lines.txt", "dir/hard2"]
    bad = []
    for _ in range(count):
        name = rng.choice(names)
        want = SAMPLE_FILES[name]
        start = rng.randrange(len(want))
        size = rng.choice([1, 100, SAMPLE_RECORD_SIZE, 3 * SAMPLE_RECORD_SIZE])
        if rng.random() < 0.2:
            got, ok = b.read(name), want
        else:
            with b.open(name) as f:
                f.seek(start)
                got, ok = f.read(size), want[start : start + size]
        if got != ok:
            bad.append(f"{name}@{start}+{size}")
    return bad


def test_eight_threads_reading_random_ranges_get_the_right_bytes(sample_bundle_path: Path) -> None:
    # A cache smaller than the data forces evictions and concurrent loads of the same record.
    with Bundle(sample_bundle_path, cache_size=3 * SAMPLE_RECORD_SIZE) as b:
        results: dict[int, list[str]] = {}
        barrier = threading.Barrier(8)

        def worker(i: int) -> None:
            barrier.wait()
            try:
                results[i] = _random_reads(b, seed=i, count=150)
            except Exception as e:  # report, don't lose, an exception in a thread
                results[i] = [repr(e)]

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert {i: r for i, r in results.items() if r} == {}
        assert len(results) == 8
        stats = b.cache_stats()
        assert stats.size <= stats.capacity
        assert stats.evictions > 0


def _in_forked_child(work: Callable[[], str], timeout: float = 30.0) -> str:
    """``work()``'s answer from a forked child (which never returns into pytest), or its error.

    A child still running after ``timeout`` (hung, perhaps in an at-fork hook before ``work``
    could arm an alarm) is killed and reported, so a hang fails the test instead of the run.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.write(write_end, work().encode())
            status = 0
        except BaseException as e:
            os.write(write_end, f"error {e!r}".encode())
        finally:
            os._exit(status)
    os.close(write_end)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_end)
            return f"hung for {timeout} s"
        time.sleep(0.05)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode()
    return message if os.waitstatus_to_exitcode(status) == 0 else f"exit {status}: {message}"


def test_a_forked_child_reads_from_a_bundle_opened_in_the_parent(sample_bundle_path: Path) -> None:
    with Bundle(sample_bundle_path) as b:
        assert b.read("big.bin") == BIG  # the parent has a live LMDB transaction and cached records

        def in_child() -> str:
            bad = _random_reads(b, seed=99, count=50)
            ok = b.read("dir/sub/deep.txt") == SAMPLE_FILES["dir/sub/deep.txt"]
            return "ok" if ok and not bad else f"bad {bad}"

        assert _in_forked_child(in_child) == "ok"
        # The parent's bundle still works after the child used (and exited with) its copy.
        assert b.read("hello.txt") == SAMPLE_FILES["hello.txt"]


def test_a_forked_child_reads_a_record_another_parent_thread_was_loading(
    sample_bundle_path: Path,
) -> None:
    # A data loader forks workers while its main process may be mid-read: the child must not
    # wait for a load that, in the child, nobody is doing.
    with Bundle(sample_bundle_path, cache_size=0) as b:
        entry = b.resolve("big.bin")
        loading, release = threading.Event(), threading.Event()
        real_load = b._parts.shards.load
        parent_loader: list[threading.Thread] = []

        def stalled_load(record, **options):
            if parent_loader and threading.current_thread() is parent_loader[0]:
                loading.set()
                release.wait(30)
            return real_load(record, **options)

        b._parts.shards.load = stalled_load
        parent_loader.append(threading.Thread(target=b.content.read_at, args=(entry, 1, 100)))
        parent_loader[0].start()
        assert loading.wait(10)

        def in_child() -> str:
            signal.alarm(10)  # without the fork handler this read waits forever
            return "ok" if b.content.read_at(entry, 1, 100) == BIG[1:101] else "wrong bytes"

        try:
            assert _in_forked_child(in_child) == "ok"
        finally:
            release.set()
            parent_loader[0].join(10)


def test_children_forked_while_a_parent_thread_is_inside_lmdb_read_and_exit(
    sample_bundle_path: Path,
) -> None:
    # py-lmdb 3 counts threads inside LMDB, and its close waits for none: a parent thread inside
    # at the fork stays counted in the child. Closing the inherited environment to reopen it hung
    # 3 children in 10; now they read on it and never close it.
    names = sorted(p for p in SAMPLE_FILES if not p.endswith(".bin"))
    with Bundle(sample_bundle_path) as b:
        stop = threading.Event()

        def busy() -> None:
            while not stop.is_set():
                for name in names:
                    b.stat(name)

        thread = threading.Thread(target=busy)
        thread.start()
        try:
            for _ in range(10):

                def in_child() -> str:
                    signal.alarm(10)  # a hang in the at-fork hook ends the child here
                    ok = all(b.read(n) == SAMPLE_FILES[n] for n in names)
                    b.close()  # closing in the child must not wait either
                    return "ok" if ok else "wrong bytes"

                assert _in_forked_child(in_child) == "ok"
        finally:
            stop.set()
            thread.join(10)
        assert b.read("hello.txt") == SAMPLE_FILES["hello.txt"]


_POOL_BUNDLE: Bundle | None = None


def _pool_read(seed: int) -> list[str]:
    assert _POOL_BUNDLE is not None
    return _random_reads(_POOL_BUNDLE, seed=seed, count=30)


def test_forked_pool_workers_share_a_bundle_opened_in_the_parent(sample_bundle_path: Path) -> None:
    # The DataLoader pattern: open once in the parent, read in forked workers.
    global _POOL_BUNDLE
    with Bundle(sample_bundle_path) as b:
        b.read("noise.bin")
        _POOL_BUNDLE = b
        try:
            with multiprocessing.get_context("fork").Pool(3) as pool:
                results = pool.map(_pool_read, range(6))
        finally:
            _POOL_BUNDLE = None
    assert results == [[]] * 6


def test_one_bundle_can_be_opened_twice_and_closed_independently(
    sample_bundle_path: Path,
) -> None:
    with Bundle(sample_bundle_path) as a, Bundle(sample_bundle_path) as b:
        assert a.read("hello.txt") == b.read("hello.txt")
        a.close()
        assert b.read("dir/a.txt") == SAMPLE_FILES["dir/a.txt"]
    with Bundle(sample_bundle_path) as c:  # and opened again after both were closed
        assert c.listdir("dir/sub") == ["deep.txt", "deeper"]


def test_a_forked_child_can_use_two_bundles_of_one_path(sample_bundle_path: Path) -> None:
    with Bundle(sample_bundle_path) as a, Bundle(sample_bundle_path) as b:
        a.read("hello.txt")
        b.read("hello.txt")

        def in_child() -> str:
            same = a.read("dir/a.txt") == b.read("dir/a.txt") == SAMPLE_FILES["dir/a.txt"]
            return "ok" if same else "different bytes"

        assert _in_forked_child(in_child) == "ok"


def test_info_reports_sizes_and_the_config(sample_bundle: Bundle, sample_bundle_path: Path) -> None:
    info = sample_bundle.info()
    assert info.config.record_size == SAMPLE_RECORD_SIZE
    assert info.shard_bytes == (sample_bundle_path / "shard-00000000").stat().st_size
    assert info.index_bytes == (sample_bundle_path / "index" / "data.mdb").stat().st_size
    assert len(info.bundle_id) == 16


def test_decoded_directories_held_stay_bounded_and_paths_still_resolve(
    pack_tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tree_module, "_DIRECTORY_CACHE", 3)
    spec = {f"d{i}": {"sub": {"f": f"file {i}".encode()}} for i in range(8)}
    with Bundle(pack_tree(spec)) as b:
        for _ in range(2):  # the second pass meets a cache emptied and refilled
            for i in range(8):
                assert b.read(f"d{i}/sub/f") == f"file {i}".encode()
                assert len(b.tree._directories) <= 3


def test_resolved_paths_held_stay_bounded_and_follow_symlinks_as_asked(
    pack_tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tree_module, "_RESOLVED_PATHS", 4)
    spec = {f"f{i}": f"file {i}".encode() for i in range(10)}
    spec["link"] = Symlink("f3")
    with Bundle(pack_tree(spec)) as b:
        for _ in range(2):  # the second pass meets a cache emptied and refilled
            for i in range(10):
                assert b.read(f"f{i}") == f"file {i}".encode()
                assert len(b.tree._resolved) <= 4
        # The same path, followed and not: two answers, each cached under its own key.
        assert b.stat("link").st_size == len(b"file 3")
        assert b.lstat("link").st_mode & 0o170000 == 0o120000
        assert b.stat("link").st_size == len(b"file 3")
        with pytest.raises(EntryNotFound):
            b.read("missing")  # misses are not cached, and not mistaken for hits
        with pytest.raises(EntryNotFound):
            b.read("missing")


def test_lookups_without_name_tables_find_every_name_and_hold_nothing(pack_tree) -> None:
    spec = {"empty": {}, "d": {f"f{i:03}": bytes([i]) for i in range(40)}}
    with Bundle(pack_tree(spec), name_cache=0) as b:
        directory = b.resolve("d")
        for i in range(40):
            assert b.tree.lookup(directory, f"f{i:03}".encode()).size == 1
        assert b.tree.lookup(directory, b"f040") is None
        assert b.tree.lookup(b.resolve("empty"), b"x") is None
        assert not b.tree._name_tables


def test_a_directory_gets_a_name_table_only_once_its_searches_would_have_paid_for_it(
    pack_tree,
) -> None:
    # 64 names cost what 4 binary searches do (tree._SEARCH_PER_SCAN_NAME): one lookup in each
    # of many directories reads no directory whole, as random access over a big tree does.
    spec = {f"d{d:02}": {f"f{i:03}": bytes([i]) for i in range(64)} for d in range(20)}
    spec["small"] = {f"s{i}": b"s" for i in range(8)}
    with Bundle(pack_tree(spec)) as b:
        directories = [b.resolve(f"d{d:02}") for d in range(20)]
        for d, directory in enumerate(directories):
            assert b.tree.lookup(directory, f"f{d:03}".encode()).size == 1
        root = b.root.ino  # searched 20 times: 21 names cost less than that
        assert set(b.tree._name_tables) == {root}
        for i in range(3):
            assert b.tree.lookup(directories[0], f"f{i + 10:03}".encode()).size == 1
        assert set(b.tree._name_tables) == {root, directories[0].ino}  # its fourth search
        small = b.resolve("small")
        assert b.tree.lookup(small, b"s3").size == 1
        assert small.ino in b.tree._name_tables  # a scan of 8 names costs less than a search
        assert b.tree.lookup(directories[0], b"f064") is None


def test_errors_survive_a_trip_through_pickle_for_process_pools() -> None:
    import pickle

    from bundlefs.errors import IndexWriteError, NotASymlink

    not_a_link = pickle.loads(pickle.dumps(NotASymlink("'a' is not a symbolic link")))
    assert (not_a_link.errno, str(not_a_link)) == (22, "'a' is not a symbolic link")
    full = pickle.loads(pickle.dumps(IndexWriteError("disk full")))
    assert (full.reason, str(full)) == ("disk full", "cannot write the index: disk full")


# --- pickling (spawn / forkserver data-loader workers) --------------------------------------------


def test_a_bundle_survives_a_pickle_round_trip_with_its_options(sample_bundle_path: Path) -> None:
    import pickle

    with Bundle(sample_bundle_path, cache_size=1 << 20, name_cache=0, check_index=False) as b:
        with pickle.loads(pickle.dumps(b)) as copy:
            assert copy is not b
            assert copy.read("dir/sub/deep.txt") == b"deep down\n"
            assert copy.info().bundle_id == b.info().bundle_id
            assert copy.cache.capacity == 1 << 20
            assert copy.options == ReadOptions(cache_size=1 << 20, name_cache=0, check_index=False)
        assert b.read("hello.txt") == SAMPLE_FILES["hello.txt"]  # the original is untouched


def test_a_pickled_bundle_reopens_by_absolute_path_after_a_chdir(
    sample_bundle_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle

    monkeypatch.chdir(sample_bundle_path.parent)
    with Bundle(sample_bundle_path.name) as b:
        data = pickle.dumps(b)
    monkeypatch.chdir("/")
    with pickle.loads(data) as copy:
        assert copy.read("hello.txt") == SAMPLE_FILES["hello.txt"]


def test_a_closed_bundle_refuses_to_pickle(sample_bundle_path: Path) -> None:
    import pickle

    from bundlefs.errors import BundleClosedError

    b = Bundle(sample_bundle_path)
    b.close()
    assert b.closed
    with pytest.raises(BundleClosedError, match="closed"):
        pickle.dumps(b)


def test_unpickling_a_bundle_replaced_since_fails(pack_tree, tmp_path: Path) -> None:
    import pickle

    from bundlefs import PackOptions, pack
    from bundlefs.errors import FormatError

    path = pack_tree({"a": b"old"})
    with Bundle(path) as b:
        data = pickle.dumps(b)
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "a").write_bytes(b"new")
    pack(str(tmp_path / "new"), str(path), PackOptions(force=True))
    with pytest.raises(FormatError, match="replaced since it was pickled"):
        pickle.loads(data)


def _read_in_spawned_child(bundle: Bundle, path: str) -> bytes:
    return bundle.read(path)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_spawned_child_reads_through_a_pickled_bundle(
    sample_bundle_path: Path, method: str
) -> None:
    # What a DataLoader with multiprocessing_context="spawn" does: the dataset, and the Bundle in
    # it, cross to a fresh interpreter as a pickle.
    with Bundle(sample_bundle_path) as b, multiprocessing.get_context(method).Pool(1) as pool:
        got = pool.apply(_read_in_spawned_child, (b, "dir/sub/deeper/deepest.txt"))
    assert got == b"bottom\n"


# --- iter_files -----------------------------------------------------------------------------------


def test_iter_files_yields_every_regular_file_name_with_its_content(
    sample_bundle: Bundle,
) -> None:
    got = list(sample_bundle.iter_files())
    assert dict(got) == SAMPLE_FILES  # hard links once per name, no symlinks or directories
    assert len(got) == len(SAMPLE_FILES)


def test_iter_files_comes_in_stored_order(sample_bundle: Bundle) -> None:
    where = []
    for path, _data in sample_bundle.iter_files():
        entry = sample_bundle.resolve(path)
        where.append((entry.shard, entry.offset))
    assert where == sorted(where)


def test_iter_files_reads_each_record_once_in_stream_order(pack_tree) -> None:
    # "a-link" comes first in inode order but names content in the middle of the stream (as every
    # file of an archive pack may): iter_files follows the stream, so a cache of one record is
    # enough to load each record once.
    spec = {
        f"d{d}": {f"f{i:03}.txt": f"file {d}/{i} ".encode() * 40 for i in range(60)}
        for d in range(3)
    }
    spec["a-link"] = HardLink("d1/f007.txt")
    with Bundle(pack_tree(spec, record_size=4096), cache_size=4096) as b:
        got = list(b.iter_files())
        stats = b.cache_stats()
        records = sum(
            b.info().config.shard_count and len(list(b.content.records(s)))
            for s in range(b.config.shard_count)
        )
        where = [(b.resolve(p).shard, b.resolve(p).offset) for p, _ in got]
    assert dict(got) == expected_files(spec)
    assert len(got) == len(expected_files(spec))
    assert where == sorted(where)
    names = [p for p, _ in got]
    assert names.index("d1/f007.txt") == names.index("a-link") + 1  # one read, both names
    assert stats.misses == records > 10


def test_iter_files_of_an_empty_bundle_yields_nothing(pack_tree) -> None:
    with Bundle(pack_tree({"empty": {}, "link": Symlink("empty")})) as b:
        assert list(b.iter_files()) == []
        assert list(b.paths()) == ["empty", "link"]
        assert len(b) == 0 and list(b) == []
