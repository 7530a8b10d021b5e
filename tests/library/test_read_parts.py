"""The seams inside ``read/``: ``ReadOptions``, ``BundleParts`` (one assembly, the record cache
injectable), ``BundleFile`` and the stream without a ``Bundle``. (The import order read/__init__.py
states is tests/unit/test_layering.py's.)"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from bundlefs import Bundle, ReadOptions, RemoteOptions
from bundlefs.read.assemble import BundleParts
from bundlefs.read.cache import RecordCache
from bundlefs.read.fileobj import BundleFile
from bundlefs.read.options import ReadKeywords
from bundlefs.read.stream import iter_files
from bundlefs.storage.location import parse_location
from tests.conftest import SAMPLE_FILES


def test_keywords_and_options_open_the_same_bundle(sample_bundle_path: Path) -> None:
    options = ReadOptions(cache_size=1 << 20, check_index=False)
    assert options.with_keywords(cache_size=1 << 20, check_index=False) == options
    with (
        Bundle(sample_bundle_path, options=options) as by_value,
        Bundle(sample_bundle_path, cache_size=1 << 20, check_index=False) as by_keywords,
    ):
        assert by_value.options == by_keywords.options == options
        assert by_value.cache.capacity == 1 << 20
    # Keywords given with options override its fields; the remote ones land in RemoteOptions.
    with Bundle(sample_bundle_path, options=options, name_cache=0) as b:
        assert b.options == ReadOptions(cache_size=1 << 20, name_cache=0, check_index=False)
    remote = ReadOptions().with_keywords(store_timeout=5.0, disk_cache=Path("/tmp/x"))
    assert remote.remote == RemoteOptions(disk_cache="/tmp/x", store_timeout=5.0)
    assert remote.remote.given() == {"disk_cache": "/tmp/x", "store_timeout": 5.0}
    assert pickle.loads(pickle.dumps(remote)) == remote


def test_the_keywords_type_checkers_see_are_the_options_fields() -> None:
    fields = {f.name for f in dataclasses.fields(ReadOptions)} - {"remote"}
    fields |= {f.name for f in dataclasses.fields(RemoteOptions)}
    assert set(ReadKeywords.__annotations__) == fields


def test_an_unknown_keyword_is_a_type_error(sample_bundle_path: Path) -> None:
    with pytest.raises(TypeError, match="cache_sise"):
        Bundle(sample_bundle_path, cache_sise=1)  # type: ignore[call-arg]


def test_a_local_bundle_drops_the_remote_options(sample_bundle_path: Path) -> None:
    with Bundle(sample_bundle_path, disk_cache_size=0, cache_size=1 << 20) as b:
        assert b.options == ReadOptions(cache_size=1 << 20)


def test_parts_may_share_a_record_cache(sample_bundle_path: Path) -> None:
    shared = RecordCache(8 << 20)
    location = parse_location(str(sample_bundle_path))
    one = BundleParts.open(location, ReadOptions(), record_cache=shared)
    two = BundleParts.open(location, ReadOptions(), record_cache=shared)
    try:
        assert one.content.cache is two.content.cache is shared
        assert one.remote is None and one.storage_stats() is None
        entry = one.tree.resolve(b"hello.txt")
        assert bytes(one.content.read_at(entry, 0, entry.size)) == SAMPLE_FILES["hello.txt"]
        held = shared.stats()
        entry = two.tree.resolve(b"hello.txt")
        assert bytes(two.content.read_at(entry, 0, entry.size)) == SAMPLE_FILES["hello.txt"]
        assert shared.stats().hits > held.hits  # the second read came from the shared cache
        one.close()
        assert shared.stats().size  # a cache it was given outlives the parts
    finally:
        two.close()
    own = BundleParts.open(location, ReadOptions(cache_size=1 << 20))
    assert own.owns_cache and own.content.cache.capacity == 1 << 20
    own.close()


def test_a_bundle_file_and_the_stream_need_only_the_parts(sample_bundle_path: Path) -> None:
    parts = BundleParts.open(parse_location(str(sample_bundle_path)), ReadOptions())
    try:
        entry = parts.tree.resolve(b"dir/sub/deep.txt")
        with BundleFile(parts.content, entry, "dir/sub/deep.txt") as f:
            assert f.read() == b"deep down\n" and f.name == "dir/sub/deep.txt"
        streamed = dict(iter_files(parts.tree, parts.content))
        assert streamed["dir/sub/deep.txt"] == b"deep down\n"
    finally:
        parts.close()
