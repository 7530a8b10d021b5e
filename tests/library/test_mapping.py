"""``Bundle`` as a ``collections.abc.Mapping`` of the regular files' paths to their bytes
(read/mapping.py), on real bundles."""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from pathlib import Path

import pytest

from bundlefs import Bundle, CorruptDataError, IsADirectory
from bundlefs.core import format as fmt
from bundlefs.errors import NotARegularFile
from tests.conftest import SAMPLE_FILES, HardLink, expected_files, flip_byte


def test_a_bundle_is_a_mapping_of_every_regular_file_name_to_its_bytes(
    sample_bundle: Bundle,
) -> None:
    assert isinstance(sample_bundle, Mapping)
    assert dict(sample_bundle) == SAMPLE_FILES  # hard links once per name; no dirs or symlinks
    assert len(sample_bundle) == len(SAMPLE_FILES) == len(list(sample_bundle))
    assert sample_bundle["dir/hard2"] == SAMPLE_FILES["hard1"]


def test_keys_items_and_values_agree_and_come_in_stored_order(sample_bundle: Bundle) -> None:
    keys = list(sample_bundle.keys())
    assert keys == list(sample_bundle) == [p for p, _ in sample_bundle.iter_files()]
    assert list(sample_bundle.items()) == list(sample_bundle.iter_files())
    assert list(sample_bundle.values()) == [d for _, d in sample_bundle.iter_files()]
    where = [(sample_bundle.resolve(p).shard, sample_bundle.resolve(p).offset) for p in keys]
    assert where == sorted(where)
    assert len(sample_bundle.items()) == len(sample_bundle.values()) == len(keys)
    assert ("hello.txt", SAMPLE_FILES["hello.txt"]) in sample_bundle.items()


def test_items_stream_each_record_once_in_an_archive_like_order(pack_tree) -> None:
    spec = {f"d{d}": {f"f{i:03}": f"{d}/{i} ".encode() * 40 for i in range(40)} for d in range(2)}
    spec["a-link"] = HardLink("d1/f007")
    with Bundle(pack_tree(spec, record_size=4096), cache_size=4096) as b:
        items = list(b.items())
        misses = b.cache_stats().misses
        records = sum(len(list(b.content.records(s))) for s in range(b.config.shard_count))
        assert [p for p, _ in items] == list(b)  # the link comes next to its file, both ways
    assert dict(items) == expected_files(spec)
    assert misses == records


def test_a_key_is_any_path_naming_a_file_as_open_takes_it(sample_bundle: Bundle) -> None:
    expected = SAMPLE_FILES["dir/sub/deep.txt"]
    for key in (
        "dir/sub/deep.txt",
        "/dir/sub/deep.txt",
        b"dir/sub/deep.txt",
        Path("dir/sub/deep.txt"),
        "dirlink/sub/deep.txt",
        "dir//sub/./deep.txt",
    ):
        assert key in sample_bundle
        assert sample_bundle[key] == expected
    assert sample_bundle["link"] == SAMPLE_FILES["hello.txt"]  # a symlink is followed, as open
    assert "link" in sample_bundle and "link" not in list(sample_bundle)
    assert all(isinstance(k, str) and not k.startswith("/") for k in sample_bundle)


def test_a_missing_path_is_a_key_error_and_get_gives_the_default(sample_bundle: Bundle) -> None:
    for missing in ("nope", "dir/nope", "hello.txt/x", "dangling", "through-a-file", 42, None):
        assert missing not in sample_bundle
        with pytest.raises(KeyError):
            sample_bundle[missing]
        assert sample_bundle.get(missing) is None
        assert sample_bundle.get(missing, b"x") == b"x"
    assert sample_bundle.get("hello.txt") == SAMPLE_FILES["hello.txt"]


def test_a_directory_is_not_a_key_and_reading_it_is_a_directory_error(
    sample_bundle: Bundle,
) -> None:
    for directory in ("dir", "dirlink", "emptydir", "", "/"):
        assert directory not in sample_bundle
        with pytest.raises(IsADirectoryError) as e:
            sample_bundle[directory]
        assert isinstance(e.value, IsADirectory)


def test_a_fifo_is_not_a_key_and_reading_it_is_not_a_regular_file(tmp_path, pack_tree) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a")
    os.mkfifo(src / "fifo")
    with Bundle(pack_tree(str(src))) as b:
        assert dict(b) == {"a.bin": b"a"} and len(b) == 1
        assert "fifo" not in b
        with pytest.raises(NotARegularFile):
            b["fifo"]


def test_a_value_is_checked_against_its_crc(sample_bundle_path: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy.bundle"
    shutil.copytree(sample_bundle_path, copy)
    with Bundle(copy) as b:
        entry = b.resolve("noise.bin")
        record = b.content.record_at(entry.shard, entry.offset)
    flip_byte(copy / fmt.shard_filename(entry.shard), record.stored_offset + 40)
    with Bundle(copy) as b:
        assert "noise.bin" in b  # membership reads no content
        with pytest.raises(CorruptDataError):
            b["noise.bin"]


def test_an_empty_bundle_is_an_empty_mapping(pack_tree) -> None:
    with Bundle(pack_tree({"d": {}})) as b:
        assert len(b) == 0 and dict(b) == {} and list(b.items()) == []


def test_bundles_compare_by_identity_and_stay_hashable(sample_bundle_path: Path) -> None:
    with Bundle(sample_bundle_path) as a, Bundle(sample_bundle_path) as b:
        assert a == a and a != b  # not a comparison of every file's bytes
        assert len({a, b}) == 2
        weakref.ref(a)


def test_a_name_that_is_not_utf8_is_a_surrogate_escaped_key_and_its_bytes_look_it_up(
    pack_tree, tmp_path
) -> None:
    src = tmp_path / "odd"
    src.mkdir()
    with open(os.path.join(os.fsencode(src), b"bad\xff.bin"), "wb") as f:
        f.write(b"odd")
    with Bundle(pack_tree(str(src))) as b:
        (key,) = list(b)
        assert key == os.fsdecode(b"bad\xff.bin")
        assert b[key] == b[os.fsencode(key)] == b"odd"


def test_a_closed_bundle_says_so_rather_than_key_error(sample_bundle_path: Path) -> None:
    from bundlefs.errors import BundleClosedError

    b = Bundle(sample_bundle_path)
    b.close()
    with pytest.raises(BundleClosedError):
        b["hello.txt"]
    with pytest.raises(BundleClosedError):
        "hello.txt" in b  # noqa: B015
