"""Format version 6's shard descriptor (52 bytes: ``base`` and ``base_shard``) and ``bases``
database (docs/format.md §3.5, §3.11), decoded as the document says and refused where it forbids."""

from __future__ import annotations

import struct

import pytest

from bundlefs.core import format as fmt
from bundlefs.errors import FormatError
from bundlefs.storage.bases import BasedShardStore, relative_location, resolve_base
from bundlefs.storage.location import parse_location
from bundlefs.storage.store import ShardStoreBase

CONFIG = fmt.Config()
OTHER = bytes(range(16))


def _descriptor(
    base: int, base_shard: int, header_id: bytes = OTHER, version: int = 5, index: int = 3
) -> bytes:
    """A version-6 descriptor by the document's table alone."""
    return struct.pack(
        ">QQIBB2xI16sII", 8192, 5000, 1, 1, version, index, header_id, base, base_shard
    )


def test_a_version_6_descriptor_is_52_bytes_and_names_its_base() -> None:
    info = fmt.decode_shard_info(_descriptor(2, 7), 6, 4, CONFIG)
    assert (info.base, info.base_shard, info.header_index, info.header_id) == (2, 7, 3, OTHER)
    assert fmt.encode_shard_info(info, 6, 4) == _descriptor(2, 7)


def test_a_version_5_descriptor_is_still_44_bytes() -> None:
    info = fmt.ShardInfo(8192, 5000, 1, 1, 5, 3, OTHER)
    assert len(fmt.encode_shard_info(info, 5, 4)) == 44
    assert fmt.decode_shard_info(fmt.encode_shard_info(info, 5, 4), 5, 4, CONFIG).base == 0


def test_a_version_6_descriptor_of_44_bytes_is_refused() -> None:
    with pytest.raises(FormatError, match="expected 52"):
        fmt.decode_shard_info(_descriptor(0, 0)[:44], 6, 4, CONFIG)


def test_a_shard_in_a_base_cannot_carry_this_bundles_id() -> None:
    with pytest.raises(FormatError, match="cannot carry this bundle's id"):
        fmt.decode_shard_info(_descriptor(1, 0, fmt.OWN_BUNDLE_ID, 6, 4), 6, 4, CONFIG)


def test_a_base_shard_without_a_base_is_refused() -> None:
    with pytest.raises(FormatError, match="base_shard without a base"):
        fmt.decode_shard_info(_descriptor(0, 5), 6, 4, CONFIG)


def test_a_base_is_its_bundle_id_then_its_location() -> None:
    value = fmt.encode_base(fmt.BaseRef(OTHER, "../old"))
    assert value == OTHER + b"../old"
    assert fmt.decode_base(1, fmt.base_key(1), value) == fmt.BaseRef(OTHER, "../old")


def test_bases_numbered_with_a_gap_are_refused() -> None:
    with pytest.raises(FormatError, match="not numbered 1 to n"):
        fmt.decode_base(1, fmt.base_key(2), OTHER + b"../old")


@pytest.mark.parametrize("location", [b"", b"x" * 1025, b"a\0b", b"\xff"])
def test_a_bad_base_location_is_refused(location: bytes) -> None:
    with pytest.raises(FormatError):
        fmt.decode_base(1, fmt.base_key(1), OTHER + location)


def test_a_shard_in_a_base_is_read_by_its_number_and_name_there() -> None:
    info = fmt.ShardInfo(1, 1, 1, header_id=OTHER, base=3, base_shard=12)
    assert fmt.store_name(40, 6, info) == "3/shard-00000012"
    assert fmt.store_name(40, 6, fmt.ShardInfo(1, 1, 1)) == "shard-00000040"


def test_a_relative_base_resolves_against_the_bundle_on_the_same_store() -> None:
    new = parse_location("s3://bucket/sets/new")
    old = resolve_base(new, "../old")
    assert (old.url, old.path) == ("s3://bucket/sets/old", "bucket/sets/old")
    assert relative_location(new, old) == "../old"
    assert resolve_base(new, "s3://other/old").url == "s3://other/old"


def test_a_relative_base_may_not_lead_out_of_the_store() -> None:
    with pytest.raises(FormatError, match="leads out of the store"):
        resolve_base(parse_location("s3://bucket/new"), "../../../x")


class _Named(ShardStoreBase):
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def read(self, name: str, offset: int, length: int, *, nowait: bool = False) -> bytes:
        return f"{self.tag}:{name}".encode()

    def close(self) -> None:
        pass


def test_the_based_store_routes_a_base_shard_to_its_base() -> None:
    store = BasedShardStore(_Named("own"), {1: _Named("one")}, {})  # type: ignore[arg-type]
    assert store.read("shard-00000002", 0, 1) == b"own:shard-00000002"
    assert store.read("1/shard-00000005", 0, 1) == b"one:shard-00000005"
    with pytest.raises(OSError):
        store.read("2/shard-00000005", 0, 1)
