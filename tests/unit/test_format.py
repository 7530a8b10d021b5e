"""Unit tests of bundlefs.format: every encoder round-trips and every decoder refuses what
docs/format.md does not allow (with FormatError or a more specific BundleError)."""

from __future__ import annotations

import dataclasses
import os
import stat
import struct

import pytest

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.errors import FormatError, NotABundleError, UnsupportedVersionError

# --- keys and names -------------------------------------------------------------------------------


def test_entry_key_is_a_big_endian_u32_and_round_trips() -> None:
    assert fmt.entry_key(1) == b"\x00\x00\x00\x01"
    assert fmt.decode_entry_key(fmt.entry_key(0xDEADBEEF)) == 0xDEADBEEF


def test_entry_key_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.decode_entry_key(b"\x00\x01")


def test_entry_keys_sort_bytewise_in_numeric_order() -> None:
    numbers = [1, 2, 255, 256, 65535, 65536, 2**32 - 1]
    assert sorted(fmt.entry_key(n) for n in reversed(numbers)) == [
        fmt.entry_key(n) for n in numbers
    ]


def test_record_key_is_shard_then_offset_and_round_trips() -> None:
    key = fmt.record_key(3, 2**40 + 5)
    assert key == struct.pack(">IQ", 3, 2**40 + 5)
    assert len(key) == 12
    assert fmt.decode_record_key(key) == (3, 2**40 + 5)


def test_record_keys_sort_by_shard_before_offset() -> None:
    keys = [fmt.record_key(1, 0), fmt.record_key(0, 2**47), fmt.record_key(0, 5)]
    assert sorted(keys) == [fmt.record_key(0, 5), fmt.record_key(0, 2**47), fmt.record_key(1, 0)]


def test_record_key_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.decode_record_key(b"\x00" * 11)


def test_shard_and_owner_keys_are_u32_and_u16() -> None:
    assert fmt.shard_key(7) == b"\x00\x00\x00\x07"
    assert fmt.owner_key(7) == b"\x00\x07"


def test_shard_filename_is_eight_decimal_digits() -> None:
    assert fmt.shard_filename(0) == "shard-00000000"
    assert fmt.shard_filename(10) == "shard-00000010"
    assert fmt.shard_filename(65535) == "shard-00065535"


def test_version_1_shard_filename_was_eight_lowercase_hex_digits() -> None:
    assert fmt.shard_filename(10, 1) == "shard-0000000a"
    assert fmt.shard_filename(0xABCD, 1) == "shard-0000abcd"


@pytest.mark.parametrize("name", [b"", b".", b"..", b"a/b", b"nul\0", b"x" * 256], ids=repr)
def test_invalid_names_are_refused(name: bytes) -> None:
    with pytest.raises(FormatError):
        fmt.validate_name(name)


@pytest.mark.parametrize(
    "name", [b"a", b"...", b"\xff", b"with space", b"new\nline", b"x" * 255], ids=repr
)
def test_valid_names_are_accepted(name: bytes) -> None:
    fmt.validate_name(name)


def test_pad_to_rounds_up_to_the_block() -> None:
    assert [fmt.pad_to(n, 512) for n in (0, 1, 511, 512, 513)] == [0, 512, 512, 512, 1024]


# --- completion marker ----------------------------------------------------------------------------

MARKER = fmt.Marker(
    bundle_id=bytes(range(16)), index_size=53248, index_crc32c=0x12345678, shard_count=3
)


def test_marker_is_52_bytes_and_round_trips() -> None:
    data = fmt.encode_marker(MARKER, crc32c)
    assert len(data) == fmt.MARKER_SIZE == 52
    assert fmt.decode_marker(data, crc32c) == MARKER


def test_marker_ends_with_the_crc_of_its_first_48_bytes() -> None:
    data = fmt.encode_marker(MARKER, crc32c)
    assert struct.unpack(">I", data[48:])[0] == crc32c(data[:48])


@pytest.mark.parametrize("length", [0, 51, 53])
def test_marker_of_the_wrong_length_is_not_a_bundle(length: int) -> None:
    data = fmt.encode_marker(MARKER, crc32c)
    data = (data + b"\0")[:length]
    with pytest.raises(NotABundleError):
        fmt.decode_marker(data, crc32c)


def test_marker_with_the_wrong_magic_is_not_a_bundle() -> None:
    data = b"BNDLDUNE" + fmt.encode_marker(MARKER, crc32c)[8:]
    with pytest.raises(NotABundleError, match="magic"):
        fmt.decode_marker(data, crc32c)


@pytest.mark.parametrize("offset", [8, 16, 32, 44, 50])
def test_marker_with_a_flipped_byte_fails_its_checksum(offset: int) -> None:
    data = bytearray(fmt.encode_marker(MARKER, crc32c))
    data[offset] ^= 0x01
    with pytest.raises(NotABundleError):
        fmt.decode_marker(bytes(data), crc32c)


def _reseal(body: bytes) -> bytes:
    return body[:48] + struct.pack(">I", crc32c(body[:48]))


def test_marker_is_written_in_version_6() -> None:
    data = fmt.encode_marker(MARKER, crc32c)
    assert data[8:12] == struct.pack(">I", 6) == struct.pack(">I", fmt.FORMAT_VERSION)


@pytest.mark.parametrize("version", [0, 7, 2**32 - 1])
def test_marker_of_an_unknown_version_is_unsupported(version: int) -> None:
    data = fmt.encode_marker(MARKER, crc32c)
    data = _reseal(data[:8] + struct.pack(">I", version) + data[12:])
    with pytest.raises(UnsupportedVersionError, match="reads versions 1 to 6"):
        fmt.decode_marker(data, crc32c)


@pytest.mark.parametrize("version", [1, 2])
def test_marker_of_an_older_version_still_decodes_and_says_so(version: int) -> None:
    data = fmt.encode_marker(dataclasses.replace(MARKER, format_version=version), crc32c)
    assert fmt.decode_marker(data, crc32c).format_version == version


def test_marker_claiming_too_many_shards_is_refused() -> None:
    data = fmt.encode_marker(dataclasses.replace(MARKER, shard_count=fmt.MAX_SHARDS + 1), crc32c)
    with pytest.raises(FormatError):
        fmt.decode_marker(data, crc32c)


# --- LMDB meta page checks ------------------------------------------------------------------------


def _lmdb_head(page_size: int = 4096, last_pg: tuple[int, int] = (3, 3), magic: int = 0xBEEFC0DE):
    """The first two pages of a fake LMDB file with the fields §3.1 looks at."""
    head = bytearray(2 * page_size)
    for meta, last in zip((0, page_size), last_pg, strict=True):
        struct.pack_into("<II", head, meta + 16, magic, 1)
        struct.pack_into("<I", head, meta + 40, page_size)
        struct.pack_into("<Q", head, meta + 136, last)
    return bytes(head)


def test_lmdb_meta_within_the_file_is_accepted() -> None:
    fmt.check_lmdb_meta(_lmdb_head(), 4 * 4096)


def test_lmdb_meta_of_a_real_index_is_accepted(sample_bundle_path) -> None:
    index = sample_bundle_path / fmt.INDEX_DIR / fmt.INDEX_FILE
    data = index.read_bytes()
    fmt.check_lmdb_meta(data[: fmt.LMDB_META_PROBE + 65536], len(data))


@pytest.mark.parametrize("which", [0, 1])
def test_lmdb_meta_pointing_past_the_end_is_refused(which: int) -> None:
    last = [3, 3]
    last[which] = 4
    with pytest.raises(FormatError, match="past the end"):
        fmt.check_lmdb_meta(_lmdb_head(last_pg=tuple(last)), 4 * 4096)


def test_lmdb_meta_with_the_wrong_magic_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.check_lmdb_meta(_lmdb_head(magic=0xDEADBEEF), 4 * 4096)


@pytest.mark.parametrize("page_size", [256, 3000, 131072])
def test_lmdb_meta_with_an_invalid_page_size_is_refused(page_size: int) -> None:
    head = bytearray(_lmdb_head())
    struct.pack_into("<I", head, 40, page_size)
    with pytest.raises(FormatError):
        fmt.check_lmdb_meta(bytes(head), 4 * 4096)


def test_lmdb_file_too_short_for_two_meta_pages_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.check_lmdb_meta(_lmdb_head()[:100], 100)
    with pytest.raises(FormatError):
        fmt.check_lmdb_meta(_lmdb_head(last_pg=(0, 0)), 4096)


# --- config ---------------------------------------------------------------------------------------

CONFIG = fmt.Config(
    block_size=512,
    record_size=8192,
    large_file_threshold=1 << 20,
    compression=fmt.COMPRESSION_NONE,
    shard_count=2,
    owner_count=3,
    entry_count=10,
    file_count=5,
    dir_count=3,
    symlink_count=1,
    hardlink_count=1,
    data_bytes=12345,
    created_ns=-5,
)


def test_config_is_96_bytes_and_round_trips() -> None:
    data = fmt.encode_config(CONFIG)
    assert len(data) == fmt.CONFIG_SIZE == 96
    assert data[:8] == b"BUNDLEFS"
    assert fmt.decode_config(data) == CONFIG


def test_config_defaults_match_the_document() -> None:
    c = fmt.Config()
    assert (c.block_size, c.record_size, c.large_file_threshold) == (4096, 262144, 1 << 20)
    assert c.compression_name == "lz4"
    assert CONFIG.compression_name == "none"


def _config_with(offset: int, fmt_code: str, value: int) -> bytes:
    data = bytearray(fmt.encode_config(CONFIG))
    struct.pack_into(fmt_code, data, offset, value)
    return bytes(data)


@pytest.mark.parametrize("length", [95, 97])
def test_config_of_the_wrong_length_is_refused(length: int) -> None:
    with pytest.raises(FormatError):
        fmt.decode_config((fmt.encode_config(CONFIG) + b"\0")[:length])


def test_config_with_the_wrong_magic_is_refused() -> None:
    with pytest.raises(FormatError, match="magic"):
        fmt.decode_config(b"BUNDLEFZ" + fmt.encode_config(CONFIG)[8:])


def test_config_is_written_in_version_6() -> None:
    assert fmt.encode_config(CONFIG)[8:10] == b"\x00\x06"


@pytest.mark.parametrize("version", [0, 7, 0xFFFF])
def test_config_of_an_unknown_version_is_unsupported(version: int) -> None:
    with pytest.raises(UnsupportedVersionError, match="reads versions 1 to 6"):
        fmt.decode_config(_config_with(8, ">H", version))


def test_config_of_version_1_ignores_the_field_version_2_counts_content_types_in() -> None:
    v1 = dataclasses.replace(CONFIG, format_version=1)
    data = bytearray(fmt.encode_config(v1))
    struct.pack_into(">H", data, 10, 7)  # reserved in version 1
    assert fmt.decode_config(bytes(data)) == v1


@pytest.mark.parametrize("version", [2, 3])
def test_config_from_version_2_round_trips_its_content_type_count(version: int) -> None:
    config = dataclasses.replace(CONFIG, content_type_count=300, format_version=version)
    assert fmt.decode_config(fmt.encode_config(config)) == config


def test_config_with_unknown_incompatible_features_is_unsupported() -> None:
    with pytest.raises(UnsupportedVersionError, match="features"):
        fmt.decode_config(_config_with(12, ">I", 1))


@pytest.mark.parametrize("block_size", [256, 1000, 2 * 1024 * 1024])
def test_config_with_an_invalid_block_size_is_refused(block_size: int) -> None:
    with pytest.raises(FormatError, match="block size"):
        fmt.decode_config(_config_with(16, ">I", block_size))


@pytest.mark.parametrize("record_size", [4095, 16 * 1024 * 1024 + 1])
def test_config_with_an_invalid_record_size_is_refused(record_size: int) -> None:
    with pytest.raises(FormatError, match="record size"):
        fmt.decode_config(_config_with(20, ">I", record_size))


def test_config_with_an_unknown_compression_is_refused() -> None:
    with pytest.raises(FormatError, match="compression"):
        fmt.decode_config(_config_with(28, ">B", 3))


def test_zstd_compression_is_refused_in_a_version_1_config() -> None:
    v1 = dataclasses.replace(CONFIG, format_version=1, compression=fmt.COMPRESSION_ZSTD)
    with pytest.raises(FormatError, match="compression"):
        fmt.decode_config(fmt.encode_config(v1))


def test_config_without_a_root_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.decode_config(_config_with(40, ">Q", 0))


def test_config_with_too_many_shards_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.decode_config(_config_with(32, ">I", fmt.MAX_SHARDS + 1))


def test_validate_layout_accepts_the_limits() -> None:
    fmt.validate_layout(512, 4096)
    fmt.validate_layout(1024 * 1024, 16 * 1024 * 1024)


# --- owners ---------------------------------------------------------------------------------------


def test_owner_is_uid_then_gid_and_round_trips() -> None:
    assert fmt.encode_owner(1000, 100) == bytes.fromhex("000003e8 00000064")
    assert fmt.decode_owner(fmt.encode_owner(2**32 - 1, 0)) == (2**32 - 1, 0)


def test_owner_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.decode_owner(b"\0" * 7)


# --- entries --------------------------------------------------------------------------------------
# Versions 1 and 2 share one layout (version 1 has no CONTENT_TYPE); version 3 is the compact entry
# of docs/format.md §3.3.1. What an entry means is the same in both: the tests of meaning run on
# both layouts, the tests of bytes name theirs.

ENTRY_VERSIONS = pytest.mark.parametrize("version", [2, 3], ids=["v2", "v3"])

FILE = fmt.Entry(
    ino=5,
    mode=stat.S_IFREG | 0o644,
    owner=1,
    mtime_ns=-123456789012,
    size=1000,
    name=b"file.bin",
    shard=3,
    offset=2**40 + 7,
    crc32c=0xCAFEBABE,
)
SMALL_FILE = fmt.Entry(  # what most files look like: every field of version 3 at its narrowest
    ino=6,
    mode=stat.S_IFREG | 0o644,
    owner=0,
    mtime_ns=1_700_000_000 * 10**9,
    size=14,
    name=b"small.txt",
    shard=0,
    offset=4096,
    crc32c=0xB4712197,
)
DIRECTORY = fmt.Entry(
    ino=2,
    mode=stat.S_IFDIR | 0o755,
    owner=0,
    mtime_ns=1,
    size=4,
    name=b"dir",
    parent=1,
    first_child=10,
    nlink=3,
)
ROOT = fmt.Entry(
    ino=1,
    mode=stat.S_IFDIR | 0o755,
    owner=0,
    mtime_ns=0,
    size=1,
    name=b"",
    parent=1,
    first_child=2,
    nlink=3,
)
SYMLINK = fmt.Entry(
    ino=7,
    mode=stat.S_IFLNK | 0o777,
    owner=0,
    mtime_ns=5,
    size=9,
    name=b"ln",
    symlink=b"../target",
)
LINK = fmt.Entry(
    ino=8,
    mode=FILE.mode,
    owner=1,
    mtime_ns=FILE.mtime_ns,
    size=FILE.size,
    name=b"other",
    flags=fmt.FLAG_LINK,
    target=5,
)

ENTRIES = {
    "file": FILE,
    "small-file": SMALL_FILE,
    "file-nlink": dataclasses.replace(FILE, flags=fmt.FLAG_NLINK, nlink=3),
    "file-user-data": dataclasses.replace(FILE, user_data=b"\x00meta"),
    "file-nlink-user-data": dataclasses.replace(
        FILE, flags=fmt.FLAG_NLINK, nlink=2, user_data=b"u" * 4096
    ),
    "file-everything": dataclasses.replace(
        SMALL_FILE, flags=fmt.FLAG_NLINK, nlink=2, content_type=7, user_data=b'{"a":1}'
    ),
    "dir": DIRECTORY,
    "empty-dir": dataclasses.replace(DIRECTORY, size=0, first_child=0, nlink=2),
    "root": ROOT,
    "symlink": SYMLINK,
    "symlink-user-data": dataclasses.replace(SYMLINK, user_data=b"x"),
    "link": LINK,
    "link-user-data": dataclasses.replace(LINK, user_data=b"yz"),
}


def _as_decoded(entry: fmt.Entry) -> fmt.Entry:
    """What decoding an encoded ``entry`` gives back: the flags say what the value holds."""
    flags = entry.flags | (fmt.FLAG_USER_DATA if entry.user_data else 0)
    if entry.content_type != fmt.NO_CONTENT_TYPE:
        flags |= fmt.FLAG_CONTENT_TYPE
    return dataclasses.replace(entry, flags=flags)


@ENTRY_VERSIONS
@pytest.mark.parametrize("entry", ENTRIES.values(), ids=ENTRIES.keys())
def test_entry_round_trips(entry: fmt.Entry, version: int) -> None:
    data = fmt.encode_entry(entry, version)
    assert fmt.decode_entry(entry.ino, data, version) == _as_decoded(entry)


@ENTRY_VERSIONS
@pytest.mark.parametrize("entry", ENTRIES.values(), ids=ENTRIES.keys())
def test_entry_name_finds_the_name_of_every_kind_of_entry(entry: fmt.Entry, version: int) -> None:
    assert fmt.entry_name(fmt.encode_entry(entry, version), version) == entry.name


def test_entries_are_written_in_version_3_by_default() -> None:
    assert fmt.encode_entry(FILE) == fmt.encode_entry(FILE, 3)
    assert fmt.decode_entry(FILE.ino, fmt.encode_entry(FILE, 3)) == FILE


@ENTRY_VERSIONS
def test_entry_without_nlink_flag_decodes_to_one_link(version: int) -> None:
    data = fmt.encode_entry(dataclasses.replace(FILE, nlink=9), version)
    assert fmt.decode_entry(FILE.ino, data, version).nlink == 1


def test_entry_kind_properties() -> None:
    assert FILE.is_file and not FILE.is_dir and not FILE.is_symlink and not FILE.is_link
    assert DIRECTORY.is_dir and DIRECTORY.child_count == 4
    assert SYMLINK.is_symlink and SYMLINK.child_count == 0
    assert LINK.is_link and LINK.is_file


def test_version_2_file_entry_layout_follows_the_document() -> None:
    data = fmt.encode_entry(FILE, 2)
    mode, flags, reserved, owner, mtime, size = struct.unpack_from(">HBBHqQ", data)
    assert (mode, flags, reserved, owner, mtime, size) == (FILE.mode, 0, 0, 1, FILE.mtime_ns, 1000)
    location, crc = struct.unpack_from(">QI", data, 22)
    assert location == 3 << 48 | (2**40 + 7)
    assert crc == 0xCAFEBABE
    assert data[34:] == b"file.bin"


def _entry_bytes(entry: fmt.Entry, offset: int, fmt_code: str, value: int, version: int) -> bytes:
    data = bytearray(fmt.encode_entry(entry, version))
    struct.pack_into(fmt_code, data, offset, value)
    return bytes(data)


def _with_size(entry: fmt.Entry, size: int, version: int) -> bytes:
    """``entry`` encoded, then its size field overwritten in place (the field keeps its width)."""
    if version < 3:
        return _entry_bytes(entry, 14, ">Q", size, version)
    data = fmt.encode_entry(entry, version)
    code = ">" + "BHIQ"[data[3] & fmt.LAYOUT_SIZE_WIDTH]  # §3.3.1: layout bits 0-1
    return _entry_bytes(entry, 4, code, size, version)


@ENTRY_VERSIONS
def test_entry_with_unknown_flags_is_refused(version: int) -> None:
    with pytest.raises(FormatError, match="flags"):
        fmt.decode_entry(5, _entry_bytes(FILE, 2, ">B", 0x10, version), version)


@ENTRY_VERSIONS
def test_file_entry_with_a_content_type_round_trips(version: int) -> None:
    entry = dataclasses.replace(FILE, content_type=513, user_data=b'{"label":3}')
    data = fmt.encode_entry(entry, version)
    decoded = fmt.decode_entry(entry.ino, data, version)
    assert decoded.content_type == 513 and decoded.flags & fmt.FLAG_CONTENT_TYPE
    assert decoded.user_data == b'{"label":3}'
    assert fmt.entry_name(data, version) == entry.name


@ENTRY_VERSIONS
@pytest.mark.parametrize("entry", ["DIRECTORY", "SYMLINK", "LINK"])
def test_content_type_flag_on_anything_but_a_plain_file_is_refused(
    entry: str, version: int
) -> None:
    value = globals()[entry]
    data = bytearray(fmt.encode_entry(value, version))
    data[2] |= fmt.FLAG_CONTENT_TYPE
    with pytest.raises(FormatError, match="content type"):
        fmt.decode_entry(value.ino, bytes(data), version)


@pytest.mark.parametrize(
    "media_type", [b"", b"text", b"/plain", b"text/pl\x00ain", b"x/" + b"y" * 200, b"t\xe9xt/x"]
)
def test_invalid_content_type_names_are_refused(media_type: bytes) -> None:
    with pytest.raises(FormatError, match="media type"):
        fmt.decode_content_type(media_type)


def test_metadata_items_must_be_utf8_with_a_nonempty_key() -> None:
    assert fmt.decode_meta(b"owner", "Zoë".encode()) == ("owner", "Zoë")
    for key, value in ((b"", b"v"), (b"k\x00", b"v"), (b"k", b"\xff"), (b"k" * 256, b"v")):
        with pytest.raises(FormatError):
            fmt.decode_meta(key, value)


@ENTRY_VERSIONS
def test_link_entry_carrying_nlink_is_refused(version: int) -> None:
    data = _entry_bytes(LINK, 2, ">B", fmt.FLAG_LINK | fmt.FLAG_NLINK, version)
    with pytest.raises(FormatError, match="NLINK"):
        fmt.decode_entry(8, data, version)


@ENTRY_VERSIONS
@pytest.mark.parametrize("flag", [fmt.FLAG_LINK, fmt.FLAG_NLINK])
def test_directory_with_file_only_flags_is_refused(flag: int, version: int) -> None:
    with pytest.raises(FormatError, match="file-only flags"):
        fmt.decode_entry(2, _entry_bytes(DIRECTORY, 2, ">B", flag, version), version)


@ENTRY_VERSIONS
@pytest.mark.parametrize("flag", [fmt.FLAG_LINK, fmt.FLAG_NLINK])
def test_symlink_with_file_only_flags_is_refused(flag: int, version: int) -> None:
    with pytest.raises(FormatError, match="file-only flags"):
        fmt.decode_entry(7, _entry_bytes(SYMLINK, 2, ">B", flag, version), version)


@ENTRY_VERSIONS
def test_file_entry_with_nlink_zero_is_refused(version: int) -> None:
    data = fmt.encode_entry(dataclasses.replace(FILE, flags=fmt.FLAG_NLINK, nlink=0), version)
    with pytest.raises(FormatError, match="nlink"):
        fmt.decode_entry(5, data, version)


@ENTRY_VERSIONS
def test_file_entry_past_the_shard_stream_limit_is_refused(version: int) -> None:
    entry = dataclasses.replace(FILE, offset=fmt.MAX_SHARD_STREAM, size=2)
    with pytest.raises(FormatError, match="shard stream limit"):
        fmt.decode_entry(5, fmt.encode_entry(entry, version), version)


@ENTRY_VERSIONS
def test_file_location_out_of_range_cannot_be_encoded(version: int) -> None:
    with pytest.raises(FormatError):
        fmt.encode_entry(dataclasses.replace(FILE, shard=fmt.MAX_SHARDS), version)
    with pytest.raises(FormatError):
        fmt.encode_entry(dataclasses.replace(FILE, offset=2**48), version)


@ENTRY_VERSIONS
def test_directory_whose_children_precede_it_is_refused(version: int) -> None:
    data = fmt.encode_entry(dataclasses.replace(DIRECTORY, first_child=2), version)
    with pytest.raises(FormatError, match="follow"):
        fmt.decode_entry(2, data, version)


@ENTRY_VERSIONS
def test_directory_with_a_first_child_but_no_children_is_refused(version: int) -> None:
    data = fmt.encode_entry(dataclasses.replace(DIRECTORY, size=0), version)
    with pytest.raises(FormatError, match="first child"):
        fmt.decode_entry(2, data, version)


@ENTRY_VERSIONS
def test_directory_child_range_past_the_inode_limit_is_refused(version: int) -> None:
    entry = dataclasses.replace(DIRECTORY, first_child=2**32 - 2, size=5)
    with pytest.raises(FormatError, match="out of bounds"):
        fmt.decode_entry(2, fmt.encode_entry(entry, version), version)


@ENTRY_VERSIONS
@pytest.mark.parametrize("target", [b"", b"x" * 4096], ids=["empty", "4096"])
def test_symlink_target_of_invalid_length_is_refused(target: bytes, version: int) -> None:
    entry = dataclasses.replace(SYMLINK, symlink=target, size=len(target))
    with pytest.raises(FormatError, match="target"):
        fmt.decode_entry(7, fmt.encode_entry(entry, version), version)


@ENTRY_VERSIONS
def test_symlink_target_longer_than_the_value_is_refused(version: int) -> None:
    with pytest.raises(FormatError, match="target length 200"):
        fmt.decode_entry(7, _with_size(SYMLINK, 200, version), version)


@ENTRY_VERSIONS
def test_symlink_target_with_nul_is_refused(version: int) -> None:
    entry = dataclasses.replace(SYMLINK, symlink=b"a\0b", size=3)
    with pytest.raises(FormatError, match="NUL"):
        fmt.decode_entry(7, fmt.encode_entry(entry, version), version)


@ENTRY_VERSIONS
@pytest.mark.parametrize("kind", [stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK, 0])
def test_entry_of_another_file_type_is_refused(kind: int, version: int) -> None:
    with pytest.raises(FormatError, match="file type"):
        fmt.decode_entry(5, _entry_bytes(FILE, 0, ">H", kind | 0o644, version), version)


@ENTRY_VERSIONS
def test_encoding_another_file_type_is_refused(version: int) -> None:
    with pytest.raises(FormatError):
        fmt.encode_entry(dataclasses.replace(FILE, mode=stat.S_IFIFO | 0o644), version)


@pytest.mark.parametrize("cut", [0, 10, 21, 25, 33])
def test_truncated_version_2_file_entry_is_refused(cut: int) -> None:
    with pytest.raises(FormatError):
        fmt.decode_entry(5, fmt.encode_entry(dataclasses.replace(FILE, name=b""), 2)[:cut], 2)


def test_truncated_version_2_directory_entry_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.decode_entry(2, fmt.encode_entry(DIRECTORY, 2)[:30], 2)


@ENTRY_VERSIONS
@pytest.mark.parametrize("entry", ENTRIES.values(), ids=ENTRIES.keys())
def test_an_entry_cut_anywhere_before_its_name_is_refused(entry: fmt.Entry, version: int) -> None:
    # Cutting into the name leaves a shorter valid name; every earlier cut must be refused (a cut
    # at the start of the name leaves an entry without one, which only the root may be).
    data = fmt.encode_entry(entry, version)
    for cut in range(len(data) - len(entry.name)):
        with pytest.raises(FormatError):
            fmt.decode_entry(entry.ino, data[:cut], version)


@ENTRY_VERSIONS
@pytest.mark.parametrize("length", [0, 4097, 50])
def test_user_data_of_invalid_length_is_refused(length: int, version: int) -> None:
    # 50 is more bytes than the value holds. The length field comes right before the user data,
    # which comes right before the name (§3.3, both layouts).
    entry = dataclasses.replace(FILE, user_data=b"abc", name=b"n")
    data = bytearray(fmt.encode_entry(entry, version))
    struct.pack_into(">H", data, len(data) - len(b"n") - len(b"abc") - 2, length)
    with pytest.raises(FormatError, match="user data"):
        fmt.decode_entry(5, bytes(data), version)


@ENTRY_VERSIONS
@pytest.mark.parametrize("name", [b"", b".", b"..", b"a/b", b"a\0"], ids=repr)
def test_entry_with_an_invalid_name_is_refused(name: bytes, version: int) -> None:
    data = fmt.encode_entry(dataclasses.replace(FILE, name=name), version)
    with pytest.raises(FormatError, match="name"):
        fmt.decode_entry(5, data, version)


@ENTRY_VERSIONS
def test_root_with_a_name_is_refused(version: int) -> None:
    data = fmt.encode_entry(dataclasses.replace(ROOT, name=b"x"), version)
    with pytest.raises(FormatError, match="root"):
        fmt.decode_entry(1, data, version)


@ENTRY_VERSIONS
def test_root_that_is_not_a_directory_is_refused(version: int) -> None:
    data = fmt.encode_entry(dataclasses.replace(FILE, ino=1, name=b""), version)
    with pytest.raises(FormatError, match="root"):
        fmt.decode_entry(1, data, version)


@ENTRY_VERSIONS
@pytest.mark.parametrize("mtime_ns", [-(2**63), 2**63 - 1], ids=["min", "max"])
def test_mtime_at_the_i64_extremes_survives_encoding(mtime_ns: int, version: int) -> None:
    data = fmt.encode_entry(dataclasses.replace(FILE, mtime_ns=mtime_ns), version)
    assert fmt.decode_entry(5, data, version).mtime_ns == mtime_ns


@ENTRY_VERSIONS
def test_mtime_outside_64_bits_of_nanoseconds_cannot_be_encoded(version: int) -> None:
    with pytest.raises(FormatError, match="mtime"):
        fmt.encode_entry(dataclasses.replace(FILE, mtime_ns=2**63), version)


# --- the compact entry of version 3 (§3.3.1) ------------------------------------------------------
# mode u16, flags u8, layout u8, then size (1/2/4/8 bytes), mtime (u32 seconds or i64 ns), owner
# (u16, only when the layout says), then the kind's fixed part.


def v3(entry: fmt.Entry) -> bytes:
    return fmt.encode_entry(entry, 3)


def test_version_3_small_file_is_15_bytes_between_the_prefix_and_its_optional_parts() -> None:
    # §3.3.1's example: a 1,000-byte file, whole-second mtime, owner 0, shard 0, offset 123,456,
    # with a content type: 4 + 2 + 4 + 1 + 4 + 4 + 2 = 21 bytes before its name (36 in version 2).
    entry = dataclasses.replace(SMALL_FILE, size=1000, offset=123_456, content_type=3)
    data = v3(entry)
    assert data == (
        bytes.fromhex(
            "81 a4"  # 0: mode S_IFREG | 0644
            " 08"  # 2: flags CONTENT_TYPE
            " 01"  # 3: layout: size u16; mtime u32 seconds; no owner; u8 shard; u32 offset
            " 03 e8"  # 4: size 1000
            " 65 53 f1 00"  # 6: mtime 1,700,000,000 s
            " 00"  # 10: shard 0
            " 00 01 e2 40"  # 11: offset 123,456
            " b4 71 21 97"  # 15: crc32c
            " 00 03"  # 19: content type 3
        )
        + b"small.txt"  # 21: the name
    )
    assert len(data) - len(entry.name) == 21
    assert len(fmt.encode_entry(entry, 2)) - len(entry.name) == 36


@pytest.mark.parametrize(
    "size, width, code",
    [
        (0, 1, 0),
        (255, 1, 0),
        (256, 2, 1),
        (65535, 2, 1),
        (65536, 4, 2),
        (2**32 - 1, 4, 2),
        (2**32, 8, 3),
        (2**48 - 4096 - 1, 8, 3),
    ],
)
def test_version_3_file_size_is_as_wide_as_its_value_needs(
    size: int, width: int, code: int
) -> None:
    data = v3(dataclasses.replace(SMALL_FILE, size=size))
    assert data[3] & fmt.LAYOUT_SIZE_WIDTH == code
    assert int.from_bytes(data[4 : 4 + width], "big") == size
    assert len(data) == 4 + width + 4 + 1 + 4 + 4 + len(SMALL_FILE.name)
    assert fmt.decode_entry(SMALL_FILE.ino, data, 3).size == size


@pytest.mark.parametrize(
    "mtime_ns, stored",
    [
        (0, struct.pack(">I", 0)),
        (1_700_000_000 * 10**9, struct.pack(">I", 1_700_000_000)),
        ((2**32 - 1) * 10**9, struct.pack(">I", 2**32 - 1)),  # 2106-02-07: the last u32 second
        (1_700_000_000 * 10**9 + 1, struct.pack(">q", 1_700_000_000 * 10**9 + 1)),
        (-(10**9), struct.pack(">q", -(10**9))),  # 1969: before the epoch
        (2**32 * 10**9, struct.pack(">q", 2**32 * 10**9)),  # past 2106
    ],
    ids=["epoch", "whole-second", "last-u32-second", "nanoseconds", "before-1970", "past-2106"],
)
def test_version_3_mtime_is_u32_whole_seconds_when_it_can_be_else_i64_ns(
    mtime_ns: int, stored: bytes
) -> None:
    data = v3(dataclasses.replace(SMALL_FILE, mtime_ns=mtime_ns))
    assert bool(data[3] & fmt.LAYOUT_MTIME_NS) == (len(stored) == 8)
    assert data[5 : 5 + len(stored)] == stored  # after the one-byte size
    assert fmt.decode_entry(SMALL_FILE.ino, data, 3).mtime_ns == mtime_ns


def test_version_3_owner_0_is_not_stored() -> None:
    data = v3(SMALL_FILE)
    assert not data[3] & fmt.LAYOUT_OWNER
    assert data[9:10] == b"\x00" and data[10:14] == struct.pack(">I", 4096)  # shard, then offset


def test_version_3_any_other_owner_is_a_u16_after_the_mtime() -> None:
    data = v3(dataclasses.replace(SMALL_FILE, owner=0x1234))
    assert data[3] & fmt.LAYOUT_OWNER
    assert data[9:11] == b"\x12\x34"
    assert len(data) == len(v3(SMALL_FILE)) + 2
    assert fmt.decode_entry(SMALL_FILE.ino, data, 3).owner == 0x1234


@pytest.mark.parametrize(
    "shard, wide, stored",
    [
        (0, False, b"\x00"),
        (255, False, b"\xff"),
        (256, True, b"\x01\x00"),
        (65535, True, b"\xff\xff"),
    ],
)
def test_version_3_shard_index_is_u8_up_to_255_else_u16(
    shard: int, wide: bool, stored: bytes
) -> None:
    data = v3(dataclasses.replace(SMALL_FILE, shard=shard))
    assert bool(data[3] & fmt.LAYOUT_WIDE_SHARD) == wide
    assert data[9 : 9 + len(stored)] == stored
    assert fmt.decode_entry(SMALL_FILE.ino, data, 3).shard == shard


@pytest.mark.parametrize(
    "offset, wide", [(0, False), (2**32 - 1, False), (2**32, True), (2**48 - 1 - 14, True)]
)
def test_version_3_offset_is_u32_below_4_gib_else_u64(offset: int, wide: bool) -> None:
    data = v3(dataclasses.replace(SMALL_FILE, offset=offset))
    assert bool(data[3] & fmt.LAYOUT_WIDE_OFFSET) == wide
    width = 8 if wide else 4
    assert int.from_bytes(data[10 : 10 + width], "big") == offset
    assert struct.unpack_from(">I", data, 10 + width)[0] == SMALL_FILE.crc32c
    assert fmt.decode_entry(SMALL_FILE.ino, data, 3).offset == offset


def test_version_3_offset_past_48_bits_is_refused() -> None:
    data = bytearray(v3(dataclasses.replace(SMALL_FILE, size=0, offset=2**32)))
    struct.pack_into(">Q", data, 10, 2**48)  # the u64 offset: after u8 size, u32 mtime, u8 shard
    with pytest.raises(FormatError, match="shard stream limit"):
        fmt.decode_entry(SMALL_FILE.ino, bytes(data), 3)


@pytest.mark.parametrize("children", [0, 1, 255, 65536])
def test_version_3_directory_size_is_always_u32(children: int) -> None:
    entry = dataclasses.replace(DIRECTORY, size=children, first_child=10 if children else 0)
    data = v3(entry)
    assert data[3] & fmt.LAYOUT_SIZE_WIDTH == 2
    assert struct.unpack_from(">I", data, 4)[0] == children
    assert fmt.decode_entry(DIRECTORY.ino, data, 3) == entry


def test_version_3_directory_holds_parent_first_child_and_nlink_after_the_common_fields() -> None:
    assert v3(ROOT) == bytes.fromhex(
        "41 ed"  # mode S_IFDIR | 0755
        " 00"  # flags
        " 02"  # layout: size u32 (a directory's always is), mtime u32 seconds, no owner
        " 00 00 00 01"  # size: one child
        " 00 00 00 00"  # mtime 0 s
        " 00 00 00 01 00 00 00 02 00 00 00 03"  # parent 1, first_child 2, nlink 3
    )  # and the root's empty name


def test_version_3_link_entry_holds_just_its_target() -> None:
    link = dataclasses.replace(LINK, owner=0, mtime_ns=0, size=14)
    assert v3(link) == bytes.fromhex("81 a4 01 00 0e 00 00 00 00 00 00 00 05") + b"other"


def test_version_3_symlink_target_follows_the_common_fields() -> None:
    assert v3(SYMLINK) == bytes.fromhex("a1 ff 00 04 09 00 00 00 00 00 00 00 05") + (
        b"../target" + b"ln"
    )  # mtime 5 ns is not whole seconds: i64


def test_version_3_reader_accepts_any_width_that_holds_the_value() -> None:
    # Every field written at its widest: u64 size, i64 mtime, owner 0 stored, u16 shard, u64 offset.
    layout = (
        3 | fmt.LAYOUT_MTIME_NS | fmt.LAYOUT_OWNER | fmt.LAYOUT_WIDE_SHARD | fmt.LAYOUT_WIDE_OFFSET
    )
    wide = (
        struct.pack(">HBB", SMALL_FILE.mode, 0, layout)
        + struct.pack(">QqH", SMALL_FILE.size, SMALL_FILE.mtime_ns, 0)
        + struct.pack(">HQI", 0, SMALL_FILE.offset, SMALL_FILE.crc32c)
        + SMALL_FILE.name
    )
    assert fmt.decode_entry(SMALL_FILE.ino, wide, 3) == SMALL_FILE
    assert fmt.entry_name(wide, 3) == SMALL_FILE.name
    assert len(wide) > len(v3(SMALL_FILE))


@pytest.mark.parametrize("bit", [0x40, 0x80])
@pytest.mark.parametrize("entry", ["SMALL_FILE", "DIRECTORY", "SYMLINK", "LINK"])
def test_version_3_layout_with_unknown_bits_is_refused(entry: str, bit: int) -> None:
    value = globals()[entry]
    data = bytearray(v3(value))
    data[3] |= bit
    with pytest.raises(FormatError, match="layout"):
        fmt.decode_entry(value.ino, bytes(data), 3)


@pytest.mark.parametrize("bit", [fmt.LAYOUT_WIDE_SHARD, fmt.LAYOUT_WIDE_OFFSET])
@pytest.mark.parametrize("entry", ["DIRECTORY", "ROOT", "SYMLINK", "LINK"])
def test_version_3_file_location_layout_bits_on_anything_but_a_file_are_refused(
    entry: str, bit: int
) -> None:
    value = globals()[entry]
    data = bytearray(v3(value))
    data[3] |= bit
    with pytest.raises(FormatError, match="layout"):
        fmt.decode_entry(value.ino, bytes(data), 3)


def test_version_3_entry_name_of_a_value_shorter_than_the_prefix_is_refused() -> None:
    for cut in range(4):
        with pytest.raises(FormatError, match="truncated"):
            fmt.entry_name(v3(SMALL_FILE)[:cut], 3)


# --- records --------------------------------------------------------------------------------------

REC_CONFIG = fmt.Config(block_size=4096, record_size=65536)
RECORD = fmt.Record(
    shard=2, offset=65536, stored_offset=8192, stored_length=1000, length=65536, crc32c=7, flags=0
)


@pytest.mark.parametrize(
    "record",
    [
        RECORD,
        dataclasses.replace(RECORD, stored_length=0, flags=fmt.RECORD_ZEROS),
        dataclasses.replace(RECORD, stored_length=65536, flags=fmt.RECORD_RAW),
        dataclasses.replace(RECORD, stored_length=1, length=1, flags=fmt.RECORD_RAW),
    ],
    ids=["lz4", "zeros", "raw", "raw-one-byte"],
)
def test_record_round_trips(record: fmt.Record) -> None:
    data = fmt.encode_record(record)
    assert len(data) == fmt.RECORD_VALUE_SIZE == 21
    assert fmt.decode_record(record.shard, record.offset, data, REC_CONFIG) == record


def test_record_end_is_offset_plus_length() -> None:
    assert RECORD.end == 131072


@pytest.mark.parametrize(
    "changes",
    [
        dict(flags=fmt.RECORD_ZEROS | fmt.RECORD_RAW),
        dict(flags=0x04),
        dict(length=0),
        dict(length=65537),
        dict(stored_offset=0),
        dict(stored_offset=4097),
        dict(flags=fmt.RECORD_ZEROS, stored_length=1),
        dict(flags=fmt.RECORD_RAW, stored_length=100),
        dict(stored_length=65536),
        dict(stored_length=0),
    ],
    ids=[
        "zeros-and-raw",
        "unknown-flag",
        "empty",
        "longer-than-record-size",
        "in-the-header",
        "not-block-aligned",
        "zeros-with-bytes",
        "raw-length-mismatch",
        "lz4-not-smaller",
        "lz4-empty",
    ],
)
def test_invalid_record_is_refused(changes: dict) -> None:
    data = fmt.encode_record(dataclasses.replace(RECORD, **changes))
    with pytest.raises(FormatError, match="record 2:65536"):
        fmt.decode_record(2, 65536, data, REC_CONFIG)


def test_record_value_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.decode_record(0, 0, fmt.encode_record(RECORD)[:-1], REC_CONFIG)


def test_compressed_record_of_a_shard_stored_without_compression_is_refused() -> None:
    # From version 3 the shard table says how each shard's records are stored (§3.4, §3.5).
    data = fmt.encode_record(RECORD)
    with pytest.raises(FormatError, match="without compression"):
        fmt.decode_record(2, 65536, data, REC_CONFIG, fmt.COMPRESSION_NONE)


def test_compressed_record_follows_its_shards_codec_not_the_configs() -> None:
    config = dataclasses.replace(REC_CONFIG, compression=fmt.COMPRESSION_NONE)
    data = fmt.encode_record(RECORD)
    assert fmt.decode_record(2, 65536, data, config, fmt.COMPRESSION_ZSTD) == RECORD
    with pytest.raises(FormatError, match="without compression"):
        fmt.decode_record(2, 65536, data, config)  # no codec given: the config's


# --- the shard table (§3.5) -----------------------------------------------------------------------

OTHER_BUNDLE = bytes(range(200, 216))
SHARD_CONFIG = fmt.Config(compression=fmt.COMPRESSION_ZSTD, shard_count=10)


def _shard(**changes) -> fmt.ShardInfo:
    """Shard 4's descriptor in a version-3 bundle that wrote it."""
    fields = dict(file_size=8192, uncompressed_size=2**47, record_count=3,
                  codec=fmt.COMPRESSION_ZSTD, header_version=3, header_index=4)  # fmt: skip
    return fmt.ShardInfo(**{**fields, **changes})


def test_version_3_shard_descriptor_is_44_bytes_laid_out_as_the_document_says() -> None:
    info = _shard(
        header_version=1, codec=fmt.COMPRESSION_LZ4, header_index=9, header_id=OTHER_BUNDLE
    )
    assert fmt.encode_shard_info(info, 3, 4) == (
        struct.pack(">QQI", 8192, 2**47, 3)  # 0: file_size, 8: uncompressed_size, 16: records
        + bytes([fmt.COMPRESSION_LZ4, 1])  # 20: compression, 21: header_version
        + bytes(2)  # 22: reserved
        + struct.pack(">I", 9)  # 24: header_index
        + OTHER_BUNDLE  # 28: header_bundle_id
    )


@pytest.mark.parametrize(
    "info",
    [
        _shard(),
        _shard(codec=fmt.COMPRESSION_NONE),
        _shard(codec=fmt.COMPRESSION_LZ4, header_version=1, header_index=0, header_id=OTHER_BUNDLE),
        _shard(header_version=2, header_index=11, header_id=OTHER_BUNDLE),
        _shard(header_version=3, header_index=65535, header_id=OTHER_BUNDLE),
    ],
    ids=["own", "own-uncompressed", "version-1-shard", "version-2-shard", "version-3-shard"],
)
def test_version_3_shard_descriptor_round_trips(info: fmt.ShardInfo) -> None:
    data = fmt.encode_shard_info(info, 3, 4)
    assert len(data) == 44
    assert fmt.decode_shard_info(data, 3, 4, SHARD_CONFIG) == info


def test_own_shard_descriptor_is_written_with_the_shards_own_index() -> None:
    data = fmt.encode_shard_info(_shard(header_index=None), 3, 4)
    assert struct.unpack_from(">I", data, 24)[0] == 4
    assert data[28:] == fmt.OWN_BUNDLE_ID == bytes(16)
    assert fmt.decode_shard_info(data, 3, 4, SHARD_CONFIG).header_index == 4


def test_version_3_shard_descriptor_ignores_its_reserved_bytes() -> None:
    data = bytearray(fmt.encode_shard_info(_shard(), 3, 4))
    data[22:24] = b"\xff\xff"
    assert fmt.decode_shard_info(bytes(data), 3, 4, SHARD_CONFIG) == _shard()


@pytest.mark.parametrize("version", [1, 2])
def test_version_1_and_2_shard_descriptor_is_20_bytes_and_takes_the_rest_from_the_bundle(
    version: int,
) -> None:
    config = dataclasses.replace(SHARD_CONFIG, format_version=version, compression=1)
    data = fmt.encode_shard_info(_shard(), version, 4)
    assert data == struct.pack(">QQI", 8192, 2**47, 3)
    decoded = fmt.decode_shard_info(data, version, 4, config)
    assert decoded == fmt.ShardInfo(8192, 2**47, 3, fmt.COMPRESSION_LZ4, version, 4)


def test_version_2_shard_takes_its_codec_from_the_config() -> None:
    config = dataclasses.replace(SHARD_CONFIG, format_version=2)
    data = fmt.encode_shard_info(_shard(), 2, 4)
    assert fmt.decode_shard_info(data, 2, 4, config).codec == fmt.COMPRESSION_ZSTD


def test_version_1_shard_records_are_lz4_whatever_the_config_says() -> None:
    config = fmt.Config(compression=fmt.COMPRESSION_NONE, format_version=1)
    data = fmt.encode_shard_info(_shard(), 1, 4)
    assert fmt.decode_shard_info(data, 1, 4, config).codec == fmt.COMPRESSION_LZ4


@pytest.mark.parametrize("version", [1, 2, 3])
def test_shard_descriptor_with_a_stream_past_the_limit_is_refused(version: int) -> None:
    data = fmt.encode_shard_info(_shard(uncompressed_size=2**48), version, 4)
    config = dataclasses.replace(SHARD_CONFIG, format_version=version, compression=1)
    with pytest.raises(FormatError, match="stream size"):
        fmt.decode_shard_info(data, version, 4, config)


@pytest.mark.parametrize(
    "version, length", [(1, 19), (2, 19), (2, 21), (2, 44), (3, 20), (3, 43), (3, 45)]
)
def test_shard_descriptor_of_the_wrong_length_is_refused(version: int, length: int) -> None:
    config = dataclasses.replace(SHARD_CONFIG, format_version=version, compression=1)
    with pytest.raises(FormatError, match="shard value"):
        fmt.decode_shard_info(b"\0" * length, version, 4, config)


@pytest.mark.parametrize("header_version", [0, 4, 255])
def test_shard_descriptor_with_a_header_version_past_the_bundles_is_refused(
    header_version: int,
) -> None:
    data = fmt.encode_shard_info(
        _shard(header_version=header_version, header_id=OTHER_BUNDLE), 3, 4
    )
    with pytest.raises(FormatError, match="header version"):
        fmt.decode_shard_info(data, 3, 4, SHARD_CONFIG)


@pytest.mark.parametrize("codec", [3, 0xFF])
def test_shard_descriptor_with_an_unknown_codec_is_refused(codec: int) -> None:
    data = fmt.encode_shard_info(_shard(codec=codec), 3, 4)
    with pytest.raises(FormatError, match="compression"):
        fmt.decode_shard_info(data, 3, 4, SHARD_CONFIG)


@pytest.mark.parametrize("codec", [fmt.COMPRESSION_NONE, fmt.COMPRESSION_ZSTD])
def test_version_1_shard_descriptor_with_a_codec_other_than_lz4_is_refused(codec: int) -> None:
    # (zstd did not exist in version 1: an unknown code there.)
    info = _shard(codec=codec, header_version=1, header_id=OTHER_BUNDLE)
    with pytest.raises(FormatError, match="shard 4: .*(version 1|compression)"):
        fmt.decode_shard_info(fmt.encode_shard_info(info, 3, 4), 3, 4, SHARD_CONFIG)


@pytest.mark.parametrize(
    "changes",
    [dict(header_index=5), dict(header_version=2), dict(header_version=1, codec=1)],
    ids=["other-index", "older-version", "version-1"],
)
def test_own_shard_descriptor_must_carry_its_own_index_and_the_bundles_version(
    changes: dict,
) -> None:
    # Zeros in header_bundle_id: this bundle wrote the shard, so its header says this bundle's
    # version and this shard's index.
    data = fmt.encode_shard_info(_shard(**changes), 3, 4)
    with pytest.raises(FormatError, match="own shard"):
        fmt.decode_shard_info(data, 3, 4, SHARD_CONFIG)


# --- shard headers (§4) ---------------------------------------------------------------------------

BUNDLE_ID = bytes(range(100, 116))
OWN = _shard(header_version=6)  # shard 4, written by this (version 6) bundle
FOREIGN = _shard(
    header_version=1, codec=fmt.COMPRESSION_LZ4, header_index=9, header_id=OTHER_BUNDLE
)


def test_shard_header_is_32_bytes_and_checks() -> None:
    header = fmt.encode_shard_header(4, BUNDLE_ID)
    assert len(header) == fmt.SHARD_HEADER_SIZE == 32
    assert header == b"BNDLSHRD" + struct.pack(">II", 6, 4) + BUNDLE_ID
    fmt.check_shard_header(header + bytes(100), 4, BUNDLE_ID, OWN)


@pytest.mark.parametrize(
    "header, error",
    [
        (fmt.encode_shard_header(4, BUNDLE_ID)[:31], FormatError),
        (b"BNDLSHRX" + fmt.encode_shard_header(4, BUNDLE_ID)[8:], FormatError),
        (fmt.encode_shard_header(5, BUNDLE_ID), FormatError),
        (fmt.encode_shard_header(4, bytes(16)), FormatError),
        (fmt.encode_shard_header(4, OTHER_BUNDLE), FormatError),
        (fmt.encode_shard_header(4, BUNDLE_ID, 7), UnsupportedVersionError),
        (fmt.encode_shard_header(4, BUNDLE_ID, 2), UnsupportedVersionError),
        (fmt.encode_shard_header(4, BUNDLE_ID, 1), UnsupportedVersionError),
    ],
    ids=[
        "short",
        "magic",
        "wrong-index",
        "zeros-id",
        "other-bundle",
        "newer-version",
        "version-2",
        "version-1",
    ],  # fmt: skip
)
def test_shard_header_mismatch_is_refused(header: bytes, error: type) -> None:
    with pytest.raises(error):
        fmt.check_shard_header(header, 4, BUNDLE_ID, OWN)


def test_shard_header_of_a_version_2_bundle_carries_version_2() -> None:
    info = fmt.ShardInfo(8192, 100, 1, fmt.COMPRESSION_LZ4, 2, 4)  # as decode_shard_info gives
    fmt.check_shard_header(fmt.encode_shard_header(4, BUNDLE_ID, 2), 4, BUNDLE_ID, info)
    with pytest.raises(UnsupportedVersionError):
        fmt.check_shard_header(fmt.encode_shard_header(4, BUNDLE_ID, 3), 4, BUNDLE_ID, info)


def test_shard_linked_from_another_bundle_has_the_header_its_descriptor_names() -> None:
    # Shard 4 of this bundle is shard 9 of a version-1 bundle, linked in unchanged.
    fmt.check_shard_header(fmt.encode_shard_header(9, OTHER_BUNDLE, 1), 4, BUNDLE_ID, FOREIGN)


@pytest.mark.parametrize(
    "header, error",
    [
        (fmt.encode_shard_header(9, BUNDLE_ID, 1), FormatError),
        (fmt.encode_shard_header(4, OTHER_BUNDLE, 1), FormatError),
        (fmt.encode_shard_header(4, BUNDLE_ID, 3), UnsupportedVersionError),
        (fmt.encode_shard_header(9, OTHER_BUNDLE, 2), UnsupportedVersionError),
        (fmt.encode_shard_header(9, bytes(range(16)), 1), FormatError),
    ],
    ids=[
        "this-bundles-id",
        "this-shards-index",
        "this-bundles-own-header",
        "other-version",
        "a-third-bundle",
    ],  # fmt: skip
)
def test_shard_linked_from_another_bundle_with_any_other_header_is_refused(
    header: bytes, error: type
) -> None:
    with pytest.raises(error):
        fmt.check_shard_header(header, 4, BUNDLE_ID, FOREIGN)


# --- special files of version 4 (§3.3.2) ----------------------------------------------------------

SPECIALS = {
    "fifo": fmt.Entry(ino=5, mode=stat.S_IFIFO | 0o640, owner=0, mtime_ns=10**18, size=0,
                      name=b"fifo"),
    "socket": fmt.Entry(ino=5, mode=stat.S_IFSOCK | 0o755, owner=2, mtime_ns=-5, size=0,
                        name=b"sock", flags=fmt.FLAG_USER_DATA, user_data=b"{}"),
    "char": fmt.Entry(ino=5, mode=stat.S_IFCHR | 0o600, owner=0, mtime_ns=10**18, size=0,
                      name=b"null", rdev=os.makedev(1, 3)),
    "whiteout": fmt.Entry(ino=5, mode=stat.S_IFCHR, owner=0, mtime_ns=0, size=0, name=b"gone"),
    "block": fmt.Entry(ino=5, mode=stat.S_IFBLK | 0o660, owner=1, mtime_ns=10**18, size=0,
                       name=b"sda", rdev=fmt.makedev(2**32 - 1, 2**32 - 1)),
}  # fmt: skip


@pytest.mark.parametrize("entry", SPECIALS.values(), ids=SPECIALS.keys())
def test_version_4_special_file_round_trips_with_its_device_number(entry: fmt.Entry) -> None:
    data = fmt.encode_entry(entry, 4)
    assert fmt.decode_entry(entry.ino, data, 4) == entry
    assert fmt.entry_name(data, 4) == entry.name
    assert entry.is_special and not entry.is_file and entry.blocks == 0


def test_makedev_packs_major_and_minor_as_the_operating_system_does() -> None:
    for major, minor in ((1, 3), (259, 2**20 + 5), (2**31 - 1, 2**31 - 1), (0, 0)):
        assert fmt.makedev(major, minor) == os.makedev(major, minor)


def test_version_4_device_holds_major_and_minor_as_two_u32_after_the_common_fields() -> None:
    data = fmt.encode_entry(SPECIALS["char"], 4)
    # mode, flags 0, layout 0 (size u8, mtime u32 seconds, owner 0 not stored), size 0, mtime
    assert (
        data
        == struct.pack(">HBBBI", stat.S_IFCHR | 0o600, 0, 0, 0, 10**9)
        + struct.pack(">II", 1, 3)
        + b"null"
    )


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("entry", SPECIALS.values(), ids=SPECIALS.keys())
def test_a_special_file_is_not_in_versions_before_4(entry: fmt.Entry, version: int) -> None:
    with pytest.raises(FormatError, match="cannot encode file type"):
        fmt.encode_entry(entry, version)
    # Version 3 sees the file type; versions 1 and 2 a value too short for their header.
    with pytest.raises(FormatError, match="unsupported file type|truncated"):
        fmt.decode_entry(entry.ino, fmt.encode_entry(entry, 4), version)


def _special_value(kind: int, flags: int = 0, layout: int = 0, size: bytes = b"\0") -> bytes:
    numbers = struct.pack(">II", 8, 1) if kind in fmt.DEVICE_KINDS else b""
    return struct.pack(">HBB", kind | 0o644, flags, layout) + size + bytes(4) + numbers + b"name"


@pytest.mark.parametrize(
    "value, error",
    [
        (_special_value(stat.S_IFIFO, size=b"\x05"), "special file of size 5"),
        (_special_value(stat.S_IFBLK, size=b"\x01"), "device of size 1"),
        (_special_value(stat.S_IFSOCK, flags=fmt.FLAG_LINK), "file-only flags"),
        (_special_value(stat.S_IFCHR, flags=fmt.FLAG_NLINK), "file-only flags"),
        (_special_value(stat.S_IFIFO, flags=fmt.FLAG_CONTENT_TYPE), "content type"),
        (_special_value(stat.S_IFCHR, flags=0x80), "unknown flags"),
        (_special_value(stat.S_IFIFO, layout=fmt.LAYOUT_WIDE_SHARD), "invalid layout"),
        (_special_value(stat.S_IFCHR)[:12], "truncated"),  # the minor number cut short
        (_special_value(0o070000), "unsupported file type"),  # no such file type
    ],
    ids=[
        "fifo-size",
        "device-size",
        "link",
        "nlink",
        "content-type",
        "unknown-flag",
        "layout",
        "truncated-device-number",
        "file-type-7",
    ],  # fmt: skip
)
def test_a_version_4_special_entry_breaking_a_rule_is_a_format_error(
    value: bytes, error: str
) -> None:
    with pytest.raises(FormatError, match=error):
        fmt.decode_entry(5, value, 4)


def test_a_special_file_with_a_size_or_a_fifo_with_a_device_number_is_not_encoded() -> None:
    with pytest.raises(FormatError, match="has a size"):
        fmt.encode_entry(dataclasses.replace(SPECIALS["fifo"], size=1), 4)
    with pytest.raises(FormatError, match="device number"):
        fmt.encode_entry(dataclasses.replace(SPECIALS["fifo"], rdev=7), 4)
    with pytest.raises(FormatError, match="device number"):
        fmt.encode_entry(dataclasses.replace(SPECIALS["char"], rdev=2**64), 4)


def test_a_version_4_config_counts_special_files_by_the_entries_no_field_counts() -> None:
    config = dataclasses.replace(CONFIG, entry_count=CONFIG.entry_count + 3)
    assert fmt.decode_config(fmt.encode_config(config)).special_count == 3
    forged = dataclasses.replace(CONFIG, entry_count=1, file_count=5)
    with pytest.raises(FormatError, match="more entries by kind"):
        fmt.decode_config(fmt.encode_config(forged))


# --- file locations without decoding (compaction) -------------------------------------------------


@ENTRY_VERSIONS
def test_file_extents_are_the_locations_of_the_files_holding_content(version: int) -> None:
    entries = [ROOT, DIRECTORY, FILE, SYMLINK, LINK, SMALL_FILE]
    values = [fmt.encode_entry(e, version) for e in entries]
    assert list(fmt.file_extents(values, version)) == [
        (FILE.shard, FILE.offset, FILE.size),
        (SMALL_FILE.shard, SMALL_FILE.offset, SMALL_FILE.size),
    ]


@pytest.mark.parametrize("shard, offset", [(1, 10), (300, 2**40), (0, 0), (2, 2**32 - 1)])
def test_relocating_a_file_changes_its_location_and_nothing_else(shard: int, offset: int) -> None:
    tagged = dataclasses.replace(
        FILE, flags=fmt.FLAG_NLINK, nlink=3, content_type=2, user_data=b"{}"
    )
    entries = [ROOT, DIRECTORY, tagged, SYMLINK, LINK, SMALL_FILE]
    values = [fmt.encode_entry(e) for e in entries]
    moved = list(fmt.relocate_files(values, lambda _s, _o, _n: (shard, offset)))
    expected = [
        dataclasses.replace(e, shard=shard, offset=offset) if e.is_file and not e.is_link else e
        for e in entries
    ]
    assert moved == [fmt.encode_entry(e) for e in expected]


def test_relocating_a_file_past_the_stream_limit_is_refused() -> None:
    values = [fmt.encode_entry(FILE)]
    with pytest.raises(FormatError):
        list(fmt.relocate_files(values, lambda _s, _o, _n: (0, 2**48)))


@pytest.mark.parametrize("version", [3, 4])
def test_file_location_is_a_plain_files_shard_and_offset_and_none_for_the_rest(version) -> None:
    wide = dataclasses.replace(FILE, shard=300, user_data=b"{}", content_type=2)  # owner, wide
    entries = [ROOT, DIRECTORY, FILE, SMALL_FILE, wide, SYMLINK, LINK]
    got = [fmt.file_location(fmt.encode_entry(e, version), version) for e in entries]
    assert got == [None, None, (3, 2**40 + 7), (0, 4096), (300, 2**40 + 7), None, None]
    assert fmt.file_location(fmt.encode_entry(FILE, version)[:5], version) is None  # truncated


def test_file_location_leaves_versions_before_3_to_a_full_decode() -> None:
    assert fmt.file_location(fmt.encode_entry(FILE, 2), 2) is None
