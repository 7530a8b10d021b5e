"""The compiled steps of a pack on a base (``native.base_files``, ``native.known_files``) give what
their Python loops give: the same bundle, byte for byte, from a rich tree changed every way a
pack on a base must notice; the same split of a directory's files into unchanged and the rest;
and for damaged base values, nothing the Python parse would not accept, parsed the same.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from bundlefs import PackOptions, pack
from bundlefs.core import format as fmt
from bundlefs.errors import FormatError
from bundlefs.packing.sources import directory, known_split
from bundlefs.storage import native
from tests.library.test_native import _mutated_file_values, needs_native
from tests.support.trees import MTIME_NS, build_rich_tree, random_change, set_mtimes

NATIVE = native.module
STAT_FIELDS = [
    *("st_mode", "st_ino", "st_dev", "st_nlink", "st_uid", "st_gid", "st_size", "st_rdev"),
    *("st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_mtime"),
]


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _tree(root: Path) -> Path:
    """``build_rich_tree`` and a directory of 30 files of every size width, one a JSON (a content
    type), one owned by another user (when we may chown), whole-second and nanosecond mtimes."""
    build_rich_tree(root)
    many = root / "many"
    many.mkdir()
    for i in range(30):
        size = (0, 1, 255, 256, 70_000)[i % 5]
        (many / f"f{i:02d}{'.json' if i == 7 else ''}").write_bytes(
            b"{}" * (size // 2) + b"x" * (size % 2)
        )
    set_mtimes(root / "many", MTIME_NS)
    os.utime(many / "f03", ns=(MTIME_NS, 1_600_000_000 * 10**9))  # whole seconds: a u32 mtime
    if os.geteuid() == 0:
        os.chown(many / "f04", 1234, 5678)
    return root


@needs_native
@pytest.mark.parametrize("change", ["nothing", "random", "touched"])
@pytest.mark.parametrize("check", ["stat", "strict"])
def test_a_pack_on_a_base_is_byte_identical_compiled_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str, check: str
) -> None:
    src = _tree(tmp_path / "src")
    base = tmp_path / "old"
    pack(str(src), str(base), PackOptions(created_ns=time.time_ns()))
    rng = random.Random(change)
    if change == "random":
        for _ in range(8):
            random_change(rng, src, keep_mtime=True)
    elif change == "touched":
        os.utime(src / "many" / "f12", ns=(MTIME_NS, MTIME_NS + 1))
    monkeypatch.setattr(directory, "KNOWN_WINDOW", 7)  # windows that split a directory
    options = PackOptions(created_ns=5, check=check)
    bundles = []
    for name, module in (("python", None), ("compiled", NATIVE)):
        monkeypatch.setattr(native, "module", module)
        summary = pack(str(src), str(tmp_path / name), options, base=str(base))
        assert summary.reuse is not None
        if check == "stat":  # strict trusts no file whose ctime is this recent: compared
            assert summary.reuse.reused_files > 20
        bundles.append(_files(tmp_path / name))
    assert bundles[0] == bundles[1]
    assert len(bundles[0]) > 3


def _known_dir(root: Path) -> tuple[list[tuple[bytes, bytes]], dict]:
    """A directory of every case the lstat loop tells apart, its children as (name, rel) with a
    name that is gone and one the base does not know, and what the base knows of them."""
    root.mkdir()
    for name in ("same", "bigger", "later", "linked", "dir-now", "link-now"):
        (root / name).write_bytes(b"12345")
        (root / name).chmod(0o644)
    os.link(root / "linked", root / "linked2")
    (root / "bigger").write_bytes(b"123456")
    (root / "dir-now").unlink()
    (root / "dir-now").mkdir()
    (root / "link-now").unlink()
    (root / "link-now").symlink_to("same")
    set_mtimes(root, MTIME_NS)
    os.utime(root / "later", ns=(MTIME_NS, MTIME_NS + 1))
    known = {}
    for name in ("same", "bigger", "later", "linked", "gone", "dir-now", "link-now"):
        reuse = (b"value of " + name.encode(), 0, -1, None, 0)
        known[name.encode()] = ((0o100644, 5, MTIME_NS), reuse)
    names = sorted([*os.listdir(os.fsencode(root)), b"gone", b"not-known"])
    return [(name, b"d/" + name) for name in names], known


@needs_native
def test_the_compiled_lstat_loop_splits_a_directory_as_the_python_loop_does(
    tmp_path: Path,
) -> None:
    children, known = _known_dir(tmp_path / "d")
    fd = os.open(tmp_path / "d", os.O_RDONLY | os.O_DIRECTORY)
    try:
        python = known_split.split_known(fd, children, known)
        compiled = native.known_files(fd, children, known)
        # A name with a NUL (no file's) is never lstat'ed as the name before it ("same").
        nul = (b"same\0x", b"d/same\0x")
        assert native.known_files(fd, [nul], {nul[0]: known[b"same"]}) == ([], [nul])
    finally:
        os.close(fd)
    assert compiled is not None
    assert compiled[1] == python[1]  # the rest, in order
    assert [name for _rel, name, _st, _reuse in compiled[0]] == [b"same"]
    for (rel, name, st, reuse), (prel, pname, pst, preuse) in zip(
        compiled[0], python[0], strict=True
    ):
        assert (rel, name, reuse) == (prel, pname, preuse)
        assert {f: getattr(st, f) for f in STAT_FIELDS} == {f: getattr(pst, f) for f in STAT_FIELDS}


@needs_native
def test_damaged_base_values_are_declined_or_parsed_as_python_parses_them() -> None:
    assert NATIVE is not None
    settled, shards, types, owners = 2**62, 3, ["application/json", "text/plain"], 4
    parsed = 0
    for version, value in _mutated_file_values(random.Random(26)):
        if version < fmt.FIRST_V5_VERSION:
            continue  # a pack copies values from version 5 on (delta_base.Base.copies)
        old: dict = {}
        copyable: dict = {}
        rest = NATIVE.base_files([value], 7, version, settled, shards, types, owners, old, copyable)
        python = fmt.reusable_file(value)
        if rest == [0]:  # declined: Python's parse declines it too, or it decodes to nothing
            assert (old, copyable) == ({}, {})
            assert python is None or not _decodes(value, version), (version, value)
            continue
        assert python is not None, (version, value)
        parsed += 1
        mode, size, mtime_ns, owner, shard, content_type, name = python
        assert old == {name: (7, value)}
        fits = size and mtime_ns < settled and shard < shards and content_type < len(types)
        if fits and owner < owners:
            media = None if content_type == fmt.NO_CONTENT_TYPE else types[content_type]
            assert copyable == {
                name: ((mode, size, mtime_ns), (value, owner, content_type, media, shard))
            }
        else:
            assert copyable == {}
    assert parsed > 500


def _decodes(value: bytes, version: int) -> bool:
    try:
        fmt.decode_entry(7, value, version)
    except FormatError:
        return False
    return True
