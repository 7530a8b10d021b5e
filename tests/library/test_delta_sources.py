"""``pack(SRC, NEW, base=OLD)`` where SRC is not a directory: tar archives (plain, compressed,
pax), zip archives (with and without extended timestamps) and ``files_from`` lists.

For each, NEW must read exactly as a plain pack of the same SRC (``bundle_entries``) and store
only what changed: nothing changed, 0 data bytes; a member changed, only it; a member deleted or
renamed, no data but the renamed one's. A member is trusted by its stat only as far as its
source's mtime goes (a tar's whole seconds, a zip's DOS time not at all); the others are
compared with OLD's digests, a large tar member (a stream read once) through a spool file.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from bundlefs import PackOptions, pack
from bundlefs.packing.options import PackSummary
from bundlefs.read.verify import verify
from tests.conftest import bundle_entries
from tests.support.trees import MTIME_NS, random_change, set_mtimes

LATER_NS = MTIME_NS + 86_400 * 10**9  # a day after the tree's mtime: a changed file's
LARGE = 3 * 2**20  # over the 1 MiB a member is compared whole up to: compared as it streams


def _tree(root: Path, files: int = 24, seed: int = 1) -> Path:
    """``files`` small files in 3 directories, an empty one and one of 3 MiB, all at MTIME_NS."""
    rng = random.Random(seed)
    for i in range(files):
        path = root / f"d{i % 3}" / f"f{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(1, 30_000)))
    (root / "empty").write_bytes(b"")
    (root / "large.bin").write_bytes(rng.randbytes(LARGE))
    set_mtimes(root, MTIME_NS)
    return root


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _tar(src: Path, out: Path, *flags: str) -> str:
    subprocess.run(["tar", "cf", str(out), *flags, "-C", str(src), "."], check=True)
    return str(out)


def _info_zip(src: Path, out: Path) -> str:
    """A zip by Info-ZIP's ``zip``: each member with its extended timestamp (whole seconds)."""
    if shutil.which("zip") is None:
        pytest.skip("Info-ZIP's zip is not installed")
    out.unlink(missing_ok=True)
    subprocess.run(["zip", "-qr", str(out.resolve()), "."], cwd=src, check=True)
    return str(out)


def _dos_zip(src: Path, out: Path) -> str:
    """A zip by Python's zipfile: DOS times only (2 s, local time), no extended timestamp."""
    with zipfile.ZipFile(out, "w") as zf:
        for name in _files(src):
            zf.write(src / name, name)
    return str(out)


# A kind of source: made from the tree, as (SRC, the options that read it).
Maker = Callable[[Path, Path], tuple[str, dict]]

KINDS: dict[str, Maker] = {
    "tar": lambda src, out: (_tar(src, out / "t.tar"), {}),
    "tar.gz pax": lambda src, out: (_tar(src, out / "t.tgz", "-z", "--format=pax"), {}),
    "zip": lambda src, out: (_info_zip(src, out / "t.zip"), {}),
    "files_from": lambda src, out: (str(src), {"files_from": tuple(_files(src))}),
}


def _versions(
    tmp_path: Path, kind: str, change: Callable[[Path], None], **options
) -> tuple[PackSummary, Path]:
    """OLD packed from the tree as a ``kind`` source; then the tree changed by ``change``, and
    NEW packed from it on OLD, and a plain pack of it: NEW's summary (NEW reads as the plain
    pack, and verifies) and NEW's path."""
    src = _tree(tmp_path / "src")
    made = tmp_path / "made"
    made.mkdir()
    source, given = KINDS[kind](src, made)
    pack(source, str(tmp_path / "old"), PackOptions(**given, **options))
    change(src)
    source, given = KINDS[kind](src, made)
    summary = pack(
        source, str(tmp_path / "new"), PackOptions(**given, **options), base=tmp_path / "old"
    )
    pack(source, str(tmp_path / "plain"), PackOptions(**given, **options))
    assert bundle_entries(tmp_path / "new") == bundle_entries(tmp_path / "plain")
    assert verify(tmp_path / "new").ok
    return summary, tmp_path / "new"


def _rewrite(path: Path, data: bytes, mtime_ns: int = LATER_NS) -> None:
    path.write_bytes(data)
    os.utime(path, ns=(mtime_ns, mtime_ns))


@pytest.mark.parametrize("kind", KINDS)
def test_nothing_changed_writes_no_data_byte(tmp_path: Path, kind: str) -> None:
    summary, _new = _versions(tmp_path, kind, lambda src: None)
    assert summary.reuse is not None
    assert summary.stored_bytes == 0
    assert (summary.reuse.stored_files, summary.reuse.same_files) == (0, 0)
    assert summary.reuse.reused_files == 25  # and the empty file, which needs no bytes


@pytest.mark.parametrize("kind", KINDS)
def test_one_changed_member_is_the_only_one_stored(tmp_path: Path, kind: str) -> None:
    summary, _new = _versions(
        tmp_path, kind, lambda src: _rewrite(src / "d1" / "f004.bin", b"a new label")
    )
    assert summary.reuse is not None
    assert (summary.reuse.stored_files, summary.reuse.stored_bytes) == (1, len(b"a new label"))
    assert summary.reuse.reused_files == 24


@pytest.mark.parametrize("kind", KINDS)
def test_a_deleted_and_a_renamed_member_store_only_the_renamed_bytes(
    tmp_path: Path, kind: str
) -> None:
    def change(src: Path) -> None:
        (src / "d0" / "f000.bin").unlink()
        (src / "d2" / "f002.bin").rename(src / "d2" / "renamed.bin")

    summary, _new = _versions(tmp_path, kind, change)
    assert summary.reuse is not None
    assert summary.reuse.stored_files == 1  # the renamed one: the lookup is by path
    assert summary.reuse.reused_files == 23


@pytest.mark.parametrize("kind", ["tar", "tar.gz pax", "zip", "files_from"])
def test_a_touched_large_member_is_compared_and_stores_nothing(tmp_path: Path, kind: str) -> None:
    def touch(src: Path) -> None:
        os.utime(src / "large.bin", ns=(LATER_NS, LATER_NS))
        os.utime(src / "d0" / "f003.bin", ns=(LATER_NS, LATER_NS))

    summary, _new = _versions(tmp_path, kind, touch)
    assert summary.reuse is not None
    assert summary.stored_bytes == 0
    assert (summary.reuse.same_files, summary.reuse.digest_compared) == (2, 2)


@pytest.mark.parametrize("kind", ["tar", "tar.gz pax", "zip", "files_from"])
def test_a_changed_large_member_of_the_same_size_is_stored(tmp_path: Path, kind: str) -> None:
    def change(src: Path) -> None:
        data = bytearray((src / "large.bin").read_bytes())
        data[LARGE - 10] ^= 1  # past the first chunks: found late, after some were compared
        _rewrite(src / "large.bin", bytes(data))

    summary, new = _versions(tmp_path, kind, change)
    assert summary.reuse is not None
    assert (summary.reuse.stored_files, summary.reuse.stored_bytes) == (1, LARGE)


def test_a_zip_with_dos_times_only_is_compared_by_content(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    _dos_zip(src, tmp_path / "a.zip")
    pack(str(tmp_path / "a.zip"), str(tmp_path / "old"))
    _rewrite(src / "d1" / "f001.bin", b"x" * len((src / "d1" / "f001.bin").read_bytes()), MTIME_NS)
    _dos_zip(src, tmp_path / "b.zip")  # the same DOS time, the same size: only content tells
    summary = pack(str(tmp_path / "b.zip"), str(tmp_path / "new"), base=tmp_path / "old")
    assert summary.reuse is not None
    assert summary.reuse.reused_files == 0
    assert (summary.reuse.same_files, summary.reuse.stored_files) == (24, 1)
    pack(str(tmp_path / "b.zip"), str(tmp_path / "plain"))
    assert bundle_entries(tmp_path / "new") == bundle_entries(tmp_path / "plain")


def test_a_tar_member_a_second_from_the_racy_window_is_compared(tmp_path: Path) -> None:
    """A tar's mtime is whole seconds: the file's own may lie up to a second later, inside the
    window, where a same-size rewrite keeps its stat."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "label.txt").write_bytes(b"cat")
    set_mtimes(src, MTIME_NS - MTIME_NS % 10**9)
    created = MTIME_NS - MTIME_NS % 10**9 + 2_500_000_000  # 2.5 s later: racy_limit 0.5 s after
    pack(_tar(src, tmp_path / "a.tar"), str(tmp_path / "old"), PackOptions(created_ns=created))
    _rewrite(src / "label.txt", b"dog", MTIME_NS - MTIME_NS % 10**9)
    summary = pack(_tar(src, tmp_path / "b.tar"), str(tmp_path / "new"), base=tmp_path / "old")
    assert summary.reuse is not None and summary.reuse.stored_files == 1
    pack(str(tmp_path / "b.tar"), str(tmp_path / "plain"))
    assert bundle_entries(tmp_path / "new") == bundle_entries(tmp_path / "plain")


@pytest.mark.parametrize("kind", ["tar", "files_from"])
def test_check_content_compares_every_member_by_digest(tmp_path: Path, kind: str) -> None:
    summary, _new = _versions(tmp_path, kind, lambda src: None, check="content")
    assert summary.reuse is not None
    assert summary.stored_bytes == 0
    assert summary.reuse.same_files == summary.reuse.digest_compared == 25  # not the empty file


def test_dedup_stores_a_changed_members_duplicates_once(tmp_path: Path) -> None:
    def change(src: Path) -> None:
        for name in ("d0/f000.bin", "d1/f001.bin", "d2/f002.bin"):
            _rewrite(src / name, b"the same new bytes")

    summary, _new = _versions(tmp_path, "tar", change, dedup=True)
    assert summary.reuse is not None and summary.reuse.stored_files == 3
    assert summary.dedup_files == 2


def test_an_archive_on_a_base_packed_from_its_directory_compares_by_content(
    tmp_path: Path,
) -> None:
    """OLD from the directory (mtimes to the ns), NEW from a tar of it (whole seconds): no
    stat agrees, every file is compared, none is stored."""
    src = _tree(tmp_path / "src")
    assert MTIME_NS % 10**9  # not a whole second: the tar's mtimes differ from the tree's
    pack(str(src), str(tmp_path / "old"))
    summary = pack(_tar(src, tmp_path / "a.tar"), str(tmp_path / "new"), base=tmp_path / "old")
    assert summary.reuse is not None
    assert (summary.reuse.same_files, summary.reuse.stored_files) == (25, 0)
    assert summary.stored_bytes == 0


@pytest.mark.parametrize("seed", range(2))
def test_random_changes_in_a_chain_of_tar_generations_are_never_missed(
    tmp_path: Path, seed: int
) -> None:
    """Each generation packed from a fresh .tar.gz of the tree on the last: half the files
    written just now (inside the racy window, where only content tells a same-size rewrite)."""
    rng = random.Random(seed)
    src = _tree(tmp_path / "src", files=40, seed=seed)
    for path in sorted(src.rglob("*.bin"))[::2]:
        os.utime(path)
    previous = None
    for generation in range(4):
        if generation:
            for _ in range(rng.randint(3, 10)):
                random_change(rng, src)
        tarball = _tar(src, tmp_path / f"g{generation}.tgz", "-z")
        new = tmp_path / f"g{generation}"
        pack(tarball, str(new), base=previous)
        pack(tarball, str(tmp_path / f"plain{generation}"))
        assert bundle_entries(new) == bundle_entries(tmp_path / f"plain{generation}")
        assert verify(new).ok
        previous = new
