"""A pack on a base asks the kernel to read ahead the files it will read (``ReadHints``): only
small regular files of one link, never more than ``_HINT_FILES`` files or ``_HINT_BYTES`` bytes
ahead of the reader, and never something a hint could disturb (a FIFO, a symlink's target).
The hints are hints: the bundle is the same with them or without.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bundlefs import PackOptions, pack
from bundlefs.packing.sources import directory, read_hints
from tests.conftest import bundle_entries
from tests.support.trees import MTIME_NS, set_mtimes

needs_fadvise = pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")


@pytest.fixture
def hinted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``posix_fadvise(WILLNEED)`` is called on, in order (the call still made)."""
    calls: list[str] = []
    real = os.posix_fadvise

    def recording(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_WILLNEED:
            calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", recording)
    return calls


@needs_fadvise
def test_only_small_regular_files_of_one_link_are_hinted(tmp_path: Path, hinted: list) -> None:
    (tmp_path / "small").write_bytes(b"x" * 100)
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "large").write_bytes(b"x" * (read_hints._READ_AHEAD_MAX + 1))
    (tmp_path / "linked").write_bytes(b"y")
    os.link(tmp_path / "linked", tmp_path / "second-link")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "symlink").symlink_to("small")
    names = ["small", "empty", "large", "linked", "fifo", "symlink", "missing"]
    hints = read_hints.ReadHints([os.fsencode(tmp_path / n) for n in names])
    hints.before(0)
    assert hinted == [str(tmp_path / "small")]


@needs_fadvise
def test_hints_stay_within_their_file_window(tmp_path: Path, hinted: list) -> None:
    paths = []
    for i in range(read_hints._HINT_FILES * 3):
        (tmp_path / f"f{i:03d}").write_bytes(b"z")
        paths.append(os.fsencode(tmp_path / f"f{i:03d}"))
    hints = read_hints.ReadHints(paths)
    hints.before(0)
    assert len(hinted) == read_hints._HINT_FILES
    hints.before(10)  # ten read: ten more hinted, none twice
    assert hinted == [os.fsdecode(p) for p in paths[: read_hints._HINT_FILES + 10]]


@needs_fadvise
def test_hints_stay_within_their_byte_budget(
    tmp_path: Path, hinted: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(read_hints, "_HINT_BYTES", 3000)
    paths = []
    for i in range(10):
        (tmp_path / f"f{i}").write_bytes(b"b" * 1000)
        paths.append(os.fsencode(tmp_path / f"f{i}"))
    hints = read_hints.ReadHints(paths)
    hints.before(0)
    assert len(hinted) == 3
    hints.before(2)  # two read: their 2,000 bytes are free again
    assert len(hinted) == 5


@needs_fadvise
def test_a_pack_on_a_base_hints_the_files_it_reads_and_stores_the_same(
    tmp_path: Path, hinted: list
) -> None:
    src = tmp_path / "src"
    for i in range(40):
        path = src / f"d{i % 2}" / f"f{i:02d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"line %d\n" % i * (i + 1))
    set_mtimes(src, MTIME_NS)
    pack(str(src), str(tmp_path / "old"), PackOptions())
    changed = [src / "d0" / "f04.txt", src / "d1" / "f13.txt"]
    for path in changed:
        path.write_bytes(b"new content\n" * 3)
        os.utime(path, ns=(MTIME_NS, MTIME_NS + 10**9))
    hinted.clear()
    pack(str(src), str(tmp_path / "new"), PackOptions(), base=str(tmp_path / "old"))
    assert sorted(hinted) == sorted(str(p) for p in changed)  # the unchanged: not read, not hinted
    pack(str(src), str(tmp_path / "flat"), PackOptions())
    assert bundle_entries(tmp_path / "new") == bundle_entries(tmp_path / "flat")


@needs_fadvise
def test_the_next_directorys_files_are_hinted_before_this_ones_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    for d in range(3):
        for i in range(5):
            path = src / f"d{d}" / f"f{i}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"%d %d\n" % (d, i) * 50)
    set_mtimes(src, MTIME_NS)
    pack(str(src), str(tmp_path / "old"), PackOptions())
    for d in range(3):
        os.utime(src / f"d{d}" / "f2.txt", ns=(MTIME_NS, MTIME_NS + 10**9))  # touched
    events: list[tuple[str, str]] = []
    real_fadvise, real_probe = os.posix_fadvise, directory._probe

    def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        events.append(
            ("hint", os.path.basename(os.path.dirname(os.readlink(f"/proc/self/fd/{fd}"))))
        )
        real_fadvise(fd, offset, length, advice)

    def probe(path: bytes, *args: object) -> object:
        events.append(("read", os.path.basename(os.path.dirname(os.fsdecode(path)))))
        return real_probe(path, *args)

    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    monkeypatch.setattr(directory, "_probe", probe)
    summary = pack(str(src), str(tmp_path / "new"), PackOptions(), base=str(tmp_path / "old"))
    assert summary.stored_bytes == 0
    assert events.count(("hint", "d1")) == 1  # once, though split ahead
    assert events.index(("hint", "d1")) < events.index(("read", "d0"))
    assert events.index(("hint", "d2")) < events.index(("read", "d1"))
