"""Big directories through the mount (issue 27): every way of listing gives the source's entries.

A listing reaches the daemon as READDIRPLUS (entries with attributes) or, on the patched binding
with ``--readdirplus auto`` (the default) or ``never``, as plain READDIR answered in batches
(mount/listing.py). Each mount variant here lists one wide directory of mixed entries (files of
two layouts, subdirectories, symlinks, hard links, a FIFO, names up to 255 bytes) with
``os.scandir``, ``find`` and ``ls -f``, in pieces resumed by ``seekdir``, and from two processes
at once; a stock pyfuse3 (READDIRPLUS only) must list the same.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bundlefs import PackOptions, pack
from tests.support.mounting import mounted

pytestmark = pytest.mark.mount

WIDE = 9_000  # files in the wide directory: ~14 plain READDIRs of 32 KiB, ~50 READDIRPLUS


def _name(i: int) -> str:
    # Lengths from 1 to 255 bytes, in the same order as i (a zero-padded prefix).
    return f"{i:05d}" + "x" * (i * 37 % 251)


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(source tree, bundle): ``wide/`` with WIDE files and some of every other kind."""
    src = tmp_path_factory.mktemp("wide-src")
    wide = src / "wide"
    wide.mkdir()
    for i in range(WIDE):
        path = wide / _name(i)
        if i % 997 == 5:
            path.mkdir()
            (path / "inside").write_bytes(b"in")
        elif i % 1009 == 7:
            path.symlink_to(f"../target-{i}")
        elif i % 1013 == 9:
            os.link(wide / _name(0), path)
        elif i % 4001 == 11:
            os.mkfifo(path)
        else:
            # Two layouts: empty files, and files with bytes and an owner's nanosecond mtime.
            path.write_bytes(b"x" * (i % 3))
            if i % 2:
                os.utime(path, ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
    (src / "small").mkdir()
    (src / "small" / "a").write_bytes(b"a")
    bundle = tmp_path_factory.mktemp("wide-bundle") / "b.bundle"
    pack(str(src), str(bundle), PackOptions())
    return src, bundle


def _entries(root: Path) -> list[tuple[str, str, bool]]:
    """(name, kind from d_type, whether d_ino is the inode lstat gives) for ``root/wide``."""
    out = []
    with os.scandir(root / "wide") as it:
        for e in it:
            kind = "d" if e.is_dir(follow_symlinks=False) else "l" if e.is_symlink() else "f"
            if kind == "f" and stat.S_ISFIFO(os.lstat(e.path).st_mode):
                kind = "p"
            out.append((e.name, kind, e.inode() == os.lstat(e.path).st_ino))
    return out


def _source_entries(src: Path) -> list[tuple[str, str, bool]]:
    out = []
    for name in sorted(os.listdir(src / "wide"), key=os.fsencode):
        mode = os.lstat(src / "wide" / name).st_mode
        kind = "d" if stat.S_ISDIR(mode) else "l" if stat.S_ISLNK(mode) else "f"
        out.append((name, "p" if stat.S_ISFIFO(mode) else kind, True))
    return out


def _find(root: Path) -> list[str]:
    out = subprocess.run(["find", "."], cwd=root, capture_output=True, text=True, check=True)
    return sorted(out.stdout.splitlines())


def _ls_f(directory: Path) -> list[str]:
    out = subprocess.run(["ls", "-f", str(directory)], capture_output=True, check=True)
    return sorted(os.fsdecode(n) for n in out.stdout.split(b"\n") if n not in (b"", b".", b".."))


class _Dirent(ctypes.Structure):
    _fields_ = [
        ("d_ino", ctypes.c_uint64),
        ("d_off", ctypes.c_int64),
        ("d_reclen", ctypes.c_ushort),
        ("d_type", ctypes.c_ubyte),
        ("d_name", ctypes.c_char * 256),
    ]


def _seekdir_listing(directory: Path, step: int) -> list[str]:
    """The directory read ``step`` entries at a time, each piece read twice: once, then again
    after ``seekdir`` back to where it began (glibc's own buffer dropped each time)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.opendir.restype = ctypes.c_void_p
    libc.readdir.restype = ctypes.POINTER(_Dirent)
    libc.readdir.argtypes = libc.telldir.argtypes = libc.closedir.argtypes = [ctypes.c_void_p]
    libc.telldir.restype = ctypes.c_long
    libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
    handle = libc.opendir(os.fsencode(directory))
    assert handle, os.strerror(ctypes.get_errno())
    names: list[str] = []
    try:
        while True:
            where = libc.telldir(handle)
            piece = []
            for _ in range(step):
                entry = libc.readdir(handle)
                if not entry:
                    break
                piece.append(os.fsdecode(entry.contents.d_name))
            libc.seekdir(handle, where)
            again = []
            for _ in range(len(piece)):
                entry = libc.readdir(handle)
                again.append(os.fsdecode(entry.contents.d_name))
            assert again == piece
            names += piece
            if len(piece) < step:
                return sorted(n for n in names if n not in (".", ".."))
    finally:
        libc.closedir(handle)


VARIANTS = [
    ("auto", "1"),
    ("auto", "4"),
    ("never", "1"),
    ("always", "4"),
]


@pytest.mark.parametrize(("readdirplus", "workers"), VARIANTS)
def test_every_listing_of_a_wide_directory_equals_the_source(wide, tmp_path, readdirplus, workers):
    src, bundle = wide
    args = ("--readdirplus", readdirplus, "--workers", workers)
    with mounted(bundle, tmp_path / "mnt", *args, log_path=tmp_path / "log") as m:
        expected = _source_entries(src)
        assert _entries(m.mountpoint) == expected  # fresh: the daemon answers
        assert _entries(m.mountpoint) == expected  # again: the kernel's cached listing
        names = sorted(name for name, _kind, _ino in expected)
        assert _ls_f(m.mountpoint / "wide") == names
        assert _find(m.mountpoint) == _find(src)
        assert _seekdir_listing(m.mountpoint / "wide", 1_000) == names
        assert _seekdir_listing(m.mountpoint / "wide", 7) == names
        with ThreadPoolExecutor(2) as pool:  # two processes list it at once
            both = list(pool.map(_ls_f, [m.mountpoint / "wide"] * 2))
        assert both == [names, names]


def test_a_fresh_mount_lists_in_pieces_from_two_processes(wide, tmp_path):
    # Nothing cached yet: both listings resume through the daemon, interleaved.
    src, bundle = wide
    with mounted(bundle, tmp_path / "mnt", log_path=tmp_path / "log") as m:
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(_ls_f, [m.mountpoint / "wide"] * 2))
        assert both == [sorted(os.listdir(src / "wide"))] * 2


def test_plain_readdir_needs_fewer_requests_than_readdirplus(wide, tmp_path):
    _src, bundle = wide
    counts = {}
    for mode in ("always", "never"):
        with mounted(bundle, tmp_path / mode, "--readdirplus", mode, "--workers", "1",
                     log_path=tmp_path / f"{mode}.log") as m:  # fmt: skip
            assert len(os.listdir(m.mountpoint / "wide")) == WIDE
            stats = json.loads(os.getxattr(m.mountpoint, "user.bundlefs.stats"))
            counts[mode] = stats["requests"]["readdir"]
    # A plain entry leaves out 128 bytes of attributes: with these names (~130 bytes on average)
    # the same 32 KiB getdents buffers hold ~1.8× more entries (~3.7× with 21-byte names).
    assert counts["never"] * 3 < counts["always"] * 2


def test_a_stock_pyfuse3_lists_the_same(wide, tmp_path):
    path = os.environ.get("BUNDLEFS_STOCK_PYFUSE3")
    if not path:
        pytest.skip("set BUNDLEFS_STOCK_PYFUSE3 to a stock pyfuse3 build (make test does)")
    src, bundle = wide
    with mounted(bundle, tmp_path / "mnt", log_path=tmp_path / "log", python_path=(path,)) as m:
        expected = _source_entries(src)
        assert _entries(m.mountpoint) == expected
        assert _find(m.mountpoint) == _find(src)
        assert _seekdir_listing(m.mountpoint / "wide", 500) == sorted(n for n, _k, _i in expected)


def test_an_unknown_readdirplus_value_is_refused(wide, tmp_path):
    _src, bundle = wide
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "bundlefs", "mount", "-o", "readdirplus=sometimes",
         str(bundle), str(mnt)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "readdirplus= takes 'auto', 'always', 'never'" in result.stderr
    assert not os.path.ismount(mnt)
