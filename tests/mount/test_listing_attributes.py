"""A listing's attributes are every entry's attributes: what READDIRPLUS hands the kernel (built in
C from the listing's stat tuples on the patched binding, ``readdir_reply_stats``; one
``EntryAttributes`` an entry on a stock pyfuse3 or with the owners overridden) is what a LOOKUP
of the same entry answers, field by field.

Each mount lists with READDIRPLUS only (``--readdirplus always``), so the entries' inodes are
made from the listing; a second mount answers every ``lstat`` by LOOKUP (``never``). The tree
has every kind of entry and the fields that need care: nanosecond and pre-1970 times, sizes
in blocks, hard links, a device's number.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bundlefs import PackOptions, pack
from bundlefs.mount.bindings import pyfuse3
from tests.support.mounting import mounted

pytestmark = pytest.mark.mount

FIELDS = ("st_ino", "st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks",
          "st_blksize", "st_rdev", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")  # fmt: skip


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    src = tmp_path_factory.mktemp("attrs-src")
    d = src / "d"
    d.mkdir()
    for i in range(300):  # more than one READDIRPLUS reply holds
        path = d / f"f{i:03d}"
        path.write_bytes(b"x" * (i * 97))
        os.chown(path, 1000 + i % 3, 2000 + i % 5)
        os.utime(path, ns=(0, 1_700_000_000_000_000_000 + i * 1_000_001))
    os.utime(d / "f001", ns=(0, -1_500_000_001))  # before 1970, not on a whole second
    os.link(d / "f002", d / "hard")
    (d / "sub").mkdir()
    (d / "link").symlink_to("f003")
    os.mkfifo(d / "fifo")
    os.mknod(d / "dev", 0o600 | stat.S_IFCHR, os.makedev(1, 7))
    bundle = tmp_path_factory.mktemp("attrs-bundle") / "b.bundle"
    pack(str(src), str(bundle), PackOptions())
    return src, bundle


def _listed(root: Path) -> dict[str, tuple[int, ...]]:
    """Every entry of ``root/d``, stat'ed right after the listing that made its inode."""
    out = {}
    with os.scandir(root / "d") as it:
        for e in it:
            st = os.lstat(e.path)
            out[e.name] = tuple(getattr(st, f) for f in FIELDS)
    return out


def test_the_binding_builds_listing_attributes_in_batches():
    assert hasattr(pyfuse3, "readdir_reply_stats")  # make install's patched build


@pytest.mark.parametrize("owner_args", [(), ("--uid", "4242", "--gid", "4343")],
                         ids=["stored-owners", "overridden-owners"])  # fmt: skip
def test_readdirplus_attributes_equal_what_a_lookup_answers(tree, tmp_path, owner_args):
    src, bundle = tree
    with (
        mounted(bundle, tmp_path / "plus", "--readdirplus", "always", *owner_args,
                log_path=tmp_path / "plus.log") as plus,
        mounted(bundle, tmp_path / "plain", "--readdirplus", "never", *owner_args,
                log_path=tmp_path / "plain.log") as plain,
    ):  # fmt: skip
        listed = _listed(plus.mountpoint)
        looked_up = _listed(plain.mountpoint)
    assert listed == looked_up
    assert set(listed) == set(os.listdir(src / "d"))
    f001 = dict(zip(FIELDS, listed["f001"], strict=True))
    assert f001["st_mtime_ns"] == f001["st_atime_ns"] == -1_500_000_001
    dev = dict(zip(FIELDS, listed["dev"], strict=True))
    assert dev["st_rdev"] == os.makedev(1, 7)
    hard = dict(zip(FIELDS, listed["hard"], strict=True))
    assert hard["st_nlink"] == 2 and hard["st_ino"] == listed["f002"][0]
    big = dict(zip(FIELDS, listed["f299"], strict=True))
    assert big["st_blocks"] == (299 * 97 + 511) // 512
    if owner_args:
        assert {v[FIELDS.index("st_uid")] for v in listed.values()} == {4242}
    else:
        assert listed["f004"][FIELDS.index("st_uid")] == 1000 + 4 % 3
        assert listed["f004"][FIELDS.index("st_gid")] == 2000 + 4 % 5
