"""Helpers shared by the CLI, verify and extract tests: source trees with every awkward case,
a snapshot of a tree's metadata for exact comparison, a CLI runner and byte-level damage.

(The packed sample fixtures live in conftest.py; these are plain functions, importable by name.)
"""

from __future__ import annotations

import os
import random
import stat
import subprocess
import sys
import time
from pathlib import Path

# Timestamps: one ordinary, one before 1970 (negative), one with odd nanoseconds.
MTIME_NS = 1_600_000_000_123_456_789
PRE_1970_NS = -1_234_567_890_987_654_321
ODD_NS = 1_000_000_000_000_000_001

ODD_NAME = b"\xff\xfe"  # not UTF-8: must round-trip as bytes
UNICODE_NAME = "ünïcødé ✓.txt"


def _write(path: bytes, data: bytes, mode: int = 0o644) -> None:
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def build_rich_tree(root: str | os.PathLike) -> Path:
    """A tree with every kind of entry extract must restore exactly.

    Regular files (empty, small, multi-record, all zeros), nested and empty directories, a
    relative symlink, a dangling symlink, a hard link across directories, unusual modes,
    nanosecond and pre-1970 mtimes, unicode and non-UTF-8 names.
    """
    r = os.fsencode(os.fspath(root))
    os.makedirs(r)
    os.makedirs(os.path.join(r, b"a", b"b", b"c"))
    os.makedirs(os.path.join(r, b"empty"))
    os.makedirs(os.path.join(r, b"locked"))
    _write(os.path.join(r, b"empty-file"), b"")
    _write(os.path.join(r, b"hello.txt"), b"hello\n")
    _write(os.path.join(r, b"a", b"multi.bin"), bytes(range(256)) * 1000)
    _write(os.path.join(r, b"a", b"zeros.bin"), bytes(70_000))
    _write(os.path.join(r, b"a", b"b", b"c", b"deep.txt"), b"deep\n")
    _write(os.path.join(r, b"a", b"script.sh"), b"#!/bin/sh\necho hi\n", 0o755)
    _write(os.path.join(r, b"a", b"private"), b"secret\n", 0o600)
    _write(os.path.join(r, b"a", b"setgid"), b"s\n", 0o2750)
    _write(os.path.join(r, os.fsencode(UNICODE_NAME)), "ünïcødé\n".encode())
    _write(os.path.join(r, ODD_NAME), b"odd bytes name\n")
    _write(os.path.join(r, b"locked", b"inside.txt"), b"in a read-only directory\n")
    _write(os.path.join(r, b"shared"), b"one inode, two names\n")
    os.link(os.path.join(r, b"shared"), os.path.join(r, b"a", b"b", b"shared-too"))
    os.symlink(b"hello.txt", os.path.join(r, b"link"))
    os.symlink(b"a/b", os.path.join(r, b"dirlink"))
    os.symlink(b"no/such/target", os.path.join(r, b"dangling"))
    os.symlink(ODD_NAME, os.path.join(r, b"odd-link"))
    set_mtimes(r)
    os.utime(os.path.join(r, b"hello.txt"), ns=(PRE_1970_NS, PRE_1970_NS))
    os.utime(os.path.join(r, b"dangling"), ns=(PRE_1970_NS, PRE_1970_NS), follow_symlinks=False)
    os.utime(os.path.join(r, b"a", b"private"), ns=(ODD_NS, ODD_NS))
    os.chmod(os.path.join(r, b"locked"), 0o555)
    os.utime(os.path.join(r, b"locked"), ns=(PRE_1970_NS, PRE_1970_NS))
    os.utime(r, ns=(MTIME_NS, MTIME_NS))
    return Path(os.fsdecode(r))


def set_mtimes(root: bytes | str, mtime_ns: int = MTIME_NS) -> None:
    """Give every entry under ``root`` one mtime (children before their directories)."""
    root = os.fsencode(root)
    for top, dirs, files in os.walk(root, topdown=False):
        for name in files + dirs:
            os.utime(os.path.join(top, name), ns=(mtime_ns, mtime_ns), follow_symlinks=False)
    os.utime(root, ns=(mtime_ns, mtime_ns))


def snapshot(root: str | os.PathLike) -> dict[bytes, tuple]:
    """relative path → (type and mode, mtime_ns, size, content or link target, hard-link group).

    The hard-link group is the relative path of the first name of the same inode, so two trees
    with the same link structure compare equal although their inode numbers differ.
    """
    r = os.fsencode(os.fspath(root))
    out: dict[bytes, tuple] = {}
    first_name: dict[int, bytes] = {}
    for top, dirs, files in os.walk(r):
        dirs.sort()
        for name in sorted(dirs + files) + ([b""] if top == r else []):
            path = os.path.join(top, name) if name else top
            rel = os.path.relpath(path, r)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                data = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    data = f.read()
            else:
                data = b""
            group = first_name.setdefault(st.st_ino, rel) if stat.S_ISREG(st.st_mode) else rel
            size = st.st_size if not stat.S_ISDIR(st.st_mode) else 0
            out[rel] = (st.st_mode, st.st_mtime_ns, size, data, group)
    return out


def run_cli(*args: str | bytes | os.PathLike, cwd=None) -> subprocess.CompletedProcess:
    """Run ``python -m bundlefs ARGS`` as a user would; stdout/stderr captured as bytes."""
    return subprocess.run(
        [sys.executable, "-m", "bundlefs", *map(os.fsencode, args)],
        capture_output=True,
        cwd=cwd,
        timeout=120,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, status: int = 1) -> str:
    """The CLI failed with ``status`` and said so in one ``bundlefs: error:`` line."""
    err = result.stderr.decode(errors="replace")
    assert result.returncode == status, (result.returncode, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("bundlefs: error: "), err
    return lines[0]


def diff_r(a: str | os.PathLike, b: str | os.PathLike) -> subprocess.CompletedProcess:
    """``diff -r`` comparing symlinks as links (dangling ones included)."""
    return subprocess.run(
        ["diff", "-r", "--no-dereference", os.fspath(a), os.fspath(b)],
        capture_output=True,
        timeout=120,
    )


def random_change(rng: random.Random, root: Path, keep_mtime: bool = False) -> None:
    """One random change of the tree at ``root`` (a pack on a base must find each): rewrite (same
    size, keeping a fresh file's mtime, or any file's with ``keep_mtime``), grow, touch, delete,
    add, rename or chmod."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    path = rng.choice(files)
    kind = rng.choice(["same-size", "grow", "touch", "delete", "add", "rename", "chmod"])
    st = path.stat()
    if kind == "same-size" and st.st_size:
        data = bytearray(path.read_bytes())
        data[rng.randrange(len(data))] ^= 0xFF
        path.write_bytes(bytes(data))
        if keep_mtime or st.st_mtime_ns > time.time_ns() - 10**9:
            # Written less than a second before the last pack: the same mtime again, which only
            # the racy window catches (an older file keeps its stat only in a --check content
            # world).
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif kind == "grow":
        with path.open("ab") as f:
            f.write(b"+")
    elif kind == "touch":
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    elif kind == "delete":
        path.unlink()
    elif kind == "add":
        (path.parent / f"n{rng.randrange(10**6)}").write_bytes(rng.randbytes(rng.randint(0, 9000)))
    elif kind == "rename":
        path.rename(path.parent / f"r{rng.randrange(10**6)}")
    else:
        path.chmod(0o600 if st.st_mode & 0o77 else 0o644)
