"""A pack on a base copies an unchanged file's entry value from OLD undecoded when the new entry
would encode to those very bytes, and builds the entry as any pack does when it would not (the
owners or content types tables numbered differently, user data, another mode): either way NEW
is what a pack that decodes and encodes every entry makes, and it verifies (digests, totals).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from bundlefs import Bundle, PackOptions, pack
from bundlefs.core import format as fmt
from bundlefs.packing import delta
from bundlefs.packing.sources import directory
from bundlefs.read.verify import verify
from bundlefs.storage.index import IndexReader, raw_records
from tests.support.trees import MTIME_NS, set_mtimes


def _tree(root: Path, files: int = 24) -> Path:
    rng = random.Random(3)
    for i in range(files):
        path = root / f"d{i % 3}" / (f"f{i:03d}.json" if i % 2 else f"f{i:03d}.bin")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b'{"a": 1}' * (i + 1) if i % 2 else rng.randbytes(rng.randint(1, 9000)))
    set_mtimes(root, MTIME_NS)
    return root


def _pack(src: Path, dest: Path, base: Path | None = None, **options) -> None:
    pack(str(src), str(dest), PackOptions(created_ns=1_800_000_000 * 10**9, **options), base=base)


def _values(bundle: Path) -> dict[bytes, bytes]:
    """Every file's entry value by name (names are unique in these trees)."""
    reader = IndexReader(str(bundle))
    try:
        root = reader.entry(fmt.ROOT_INO)
        out = {}
        for directory in reader.iter_entries(root.first_child, root.size):
            for _ino, value in reader.iter_raw(directory.first_child, directory.size):
                out[fmt.entry_name(value)] = value
        return out
    finally:
        reader.close()


def _entries(bundle: Path) -> dict[bytes, fmt.Entry]:
    return {name: fmt.decode_entry(2, value) for name, value in _values(bundle).items()}


def _content_type(bundle: Path, name: bytes) -> str | None:
    reader = IndexReader(str(bundle))
    try:
        return reader.content_type(fmt.decode_entry(2, _values(bundle)[name]))
    finally:
        reader.close()


def test_an_unchanged_file_keeps_its_bases_entry_value_and_digest(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    _pack(src, tmp_path / "old")
    _pack(src, tmp_path / "new", tmp_path / "old")
    assert _values(tmp_path / "new") == _values(tmp_path / "old")
    assert all(e.digest for e in _entries(tmp_path / "new").values())
    assert verify(tmp_path / "new").ok


def test_a_renumbered_owner_gets_the_new_bundles_index(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    os.chown(src / "d1" / "f004.bin", 1234, 1234)  # OLD: owners (0, 0), then (1234, 1234)
    _pack(src, tmp_path / "old")
    os.chown(src, 1234, 1234)  # NEW: the root's (1234, 1234) comes first, every index moves
    os.chown(src / "d0" / "f000.bin", 1234, 1234)
    set_mtimes(src, MTIME_NS)
    _pack(src, tmp_path / "new", tmp_path / "old")
    reader = IndexReader(str(tmp_path / "new"))
    try:
        assert reader.owners == [(1234, 1234), (0, 0)]
    finally:
        reader.close()
    with Bundle(tmp_path / "new") as b:
        for path in ("d0/f000.bin", "d1/f004.bin", "d2/f002.bin", "d0/f003.json"):
            st = os.lstat(src / path)
            assert (b.lstat(path).st_uid, b.lstat(path).st_gid) == (st.st_uid, st.st_gid), path
    assert verify(tmp_path / "new").ok


def test_user_data_is_attached_to_an_unchanged_file(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    _pack(src, tmp_path / "old")
    _pack(src, tmp_path / "new", tmp_path / "old", user_data=lambda rel, st: rel[-4:])
    entries = _entries(tmp_path / "new")
    assert all(name[-4:] == e.user_data for name, e in entries.items())
    old = _entries(tmp_path / "old")
    assert all(e.digest == old[name].digest for name, e in entries.items())
    assert verify(tmp_path / "new").ok


def test_an_unchanged_file_keeps_its_bases_content_type_without_detection(
    tmp_path: Path,
) -> None:
    src = _tree(tmp_path / "src")
    _pack(src, tmp_path / "old")
    _pack(src, tmp_path / "new", tmp_path / "old", detect_content_types=False)
    media_type = _content_type(tmp_path / "new", b"f001.json")
    assert media_type is not None
    assert media_type == _content_type(tmp_path / "old", b"f001.json")
    assert verify(tmp_path / "new").ok


def test_a_chmod_of_an_unchanged_file_is_in_its_new_entry(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    _pack(src, tmp_path / "old")
    os.chmod(src / "d2" / "f002.bin", 0o4711)
    _pack(src, tmp_path / "new", tmp_path / "old")
    new, old = _values(tmp_path / "new"), _values(tmp_path / "old")
    assert fmt.decode_entry(2, new[b"f002.bin"]).mode & 0o7777 == 0o4711
    assert new[b"f002.bin"] != old[b"f002.bin"]
    assert {k: v for k, v in new.items() if k != b"f002.bin"} == {
        k: v for k, v in old.items() if k != b"f002.bin"
    }
    assert verify(tmp_path / "new").ok


def test_the_bases_records_are_copied_as_they_are(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    _pack(src, tmp_path / "old")
    (src / "d0" / "f000.bin").write_bytes(b"new content")  # NEW has a shard of its own too
    _pack(src, tmp_path / "new", tmp_path / "old")
    old, new = IndexReader(str(tmp_path / "old")), IndexReader(str(tmp_path / "new"))
    try:
        assert raw_records(old, 0) and raw_records(new, 0) == raw_records(old, 0)
        assert new.config.shard_count == 2 and raw_records(new, 1)
    finally:
        old.close()
        new.close()
    assert verify(tmp_path / "new").ok


def test_unchanged_changed_and_new_files_of_a_directory_arrive_in_name_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(directory, "KNOWN_WINDOW", 3)  # windows end between every kind of file
    src = _tree(tmp_path / "src", files=30)
    _pack(src, tmp_path / "old")
    folder = src / "d1"
    for name in ("f001.json", "f010.bin", "f013.json"):  # changed: lstat'ed twice, stored
        (folder / name).write_bytes(b"changed " + name.encode())
    for name in ("f003.json.new", "f000.bin", "zz.bin"):  # new names among the old ones
        (folder / name).write_bytes(name.encode())
    (folder / "f004.bin").unlink()
    summary = pack(str(src), str(tmp_path / "new"), PackOptions(), base=tmp_path / "old")
    assert summary.reuse is not None and summary.reuse.reused_files == 30 - 4
    with Bundle(tmp_path / "new") as b:
        names = [e.name for e in b.scandir("d1")]
        assert names == sorted(os.listdir(folder), key=os.fsencode)
        for name in names:
            assert b.read(f"d1/{name}") == (folder / name).read_bytes(), name
    assert verify(tmp_path / "new").ok


def test_a_file_amid_a_run_of_unchanged_files_that_cannot_be_copied_keeps_its_place(
    tmp_path: Path,
) -> None:
    src = _tree(tmp_path / "src", files=30)
    _pack(src, tmp_path / "old")
    os.chown(src / "d1" / "f013.json", 1234, 1234)  # same stat but a new owner: built anew
    summary = pack(str(src), str(tmp_path / "new"), PackOptions(), base=tmp_path / "old")
    assert summary.reuse is not None and summary.reuse.reused_files == 30
    new, old = _values(tmp_path / "new"), _values(tmp_path / "old")
    assert new[b"f013.json"] != old[b"f013.json"]
    assert {k: v for k, v in new.items() if k != b"f013.json"} == {
        k: v for k, v in old.items() if k != b"f013.json"
    }
    with Bundle(tmp_path / "new") as b:
        for folder in ("d0", "d1", "d2"):
            names = [e.name for e in b.scandir(folder)]
            assert names == sorted(os.listdir(src / folder), key=os.fsencode)
        assert b.lstat("d1/f013.json").st_uid == 1234
        assert b.read("d1/f013.json") == (src / "d1" / "f013.json").read_bytes()
    assert verify(tmp_path / "new").ok


def test_a_file_rewritten_after_its_run_was_lstated_is_found_by_the_next_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _tree(tmp_path / "src", files=30)
    _pack(src, tmp_path / "old")
    victim = src / "d1" / "f013.json"
    walk = delta.DeltaSource._walk

    def rewriting_walk(self, rel, copyable, read_if):  # type: ignore[no-untyped-def]
        for item in walk(self, rel, copyable, read_if):
            yield item
            if item.run is not None and any(known[1] == victim.name.encode() for known in item.run):
                victim.write_bytes(b"X" * victim.stat().st_size)  # same size, mid-pack

    monkeypatch.setattr(delta.DeltaSource, "_walk", rewriting_walk)
    pack(str(src), str(tmp_path / "new"), PackOptions(), base=tmp_path / "old")
    monkeypatch.undo()
    assert victim.read_bytes()[:1] == b"X"  # rewritten after its run was lstat'ed
    assert verify(tmp_path / "new").ok  # NEW holds the file as lstat'ed: OLD's content
    pack(str(src), str(tmp_path / "next"), PackOptions(), base=tmp_path / "new")
    with Bundle(tmp_path / "next") as b:
        assert b.read("d1/f013.json") == victim.read_bytes()
    assert verify(tmp_path / "next").ok
