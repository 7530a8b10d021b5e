"""Unit tests of bundlefs.format: every encoder round-trips and every decoder refuses what
docs/format.md does not allow (with FormatError or a more specific BundleError)."""

from __future__ import annotations

import dataclasses
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


def test_marker_of_a_newer_version_is_unsupported() -> None:
    data = fmt.encode_marker(MARKER, crc32c)
    data = _reseal(data[:8] + struct.pack(">I", 3) + data[12:])
    with pytest.raises(UnsupportedVersionError, match="reads versions 1 to 2"):
        fmt.decode_marker(data, crc32c)


def test_marker_of_version_1_still_decodes_and_says_so() -> None:
    data = fmt.encode_marker(dataclasses.replace(MARKER, format_version=1), crc32c)
    assert fmt.decode_marker(data, crc32c).format_version == 1


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


def test_config_of_a_newer_version_is_unsupported() -> None:
    with pytest.raises(UnsupportedVersionError):
        fmt.decode_config(_config_with(8, ">H", 3))


def test_config_of_version_1_ignores_the_field_version_2_counts_content_types_in() -> None:
    v1 = dataclasses.replace(CONFIG, format_version=1)
    data = bytearray(fmt.encode_config(v1))
    struct.pack_into(">H", data, 10, 7)  # reserved in version 1
    assert fmt.decode_config(bytes(data)) == v1


def test_config_of_version_2_round_trips_its_content_type_count() -> None:
    config = dataclasses.replace(CONFIG, content_type_count=300)
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


@pytest.mark.parametrize(
    "entry",
    [
        FILE,
        dataclasses.replace(FILE, flags=fmt.FLAG_NLINK, nlink=3),
        dataclasses.replace(FILE, user_data=b"\x00meta"),
        dataclasses.replace(FILE, flags=fmt.FLAG_NLINK, nlink=2, user_data=b"u" * 4096),
        DIRECTORY,
        dataclasses.replace(DIRECTORY, size=0, first_child=0, nlink=2),
        ROOT,
        SYMLINK,
        dataclasses.replace(SYMLINK, user_data=b"x"),
        LINK,
    ],
    ids=[
        "file",
        "file-nlink",
        "file-user-data",
        "file-nlink-user-data",
        "dir",
        "empty-dir",
        "root",
        "symlink",
        "symlink-user-data",
        "link",
    ],
)
def test_entry_round_trips(entry: fmt.Entry) -> None:
    flags = entry.flags | (fmt.FLAG_USER_DATA if entry.user_data else 0)
    assert fmt.decode_entry(entry.ino, fmt.encode_entry(entry)) == dataclasses.replace(
        entry, flags=flags
    )


def test_entry_without_nlink_flag_decodes_to_one_link() -> None:
    decoded = fmt.decode_entry(FILE.ino, fmt.encode_entry(dataclasses.replace(FILE, nlink=9)))
    assert decoded.nlink == 1


def test_entry_kind_properties() -> None:
    assert FILE.is_file and not FILE.is_dir and not FILE.is_symlink and not FILE.is_link
    assert DIRECTORY.is_dir and DIRECTORY.child_count == 4
    assert SYMLINK.is_symlink and SYMLINK.child_count == 0
    assert LINK.is_link and LINK.is_file


def test_file_entry_layout_follows_the_document() -> None:
    data = fmt.encode_entry(FILE)
    mode, flags, reserved, owner, mtime, size = struct.unpack_from(">HBBHqQ", data)
    assert (mode, flags, reserved, owner, mtime, size) == (FILE.mode, 0, 0, 1, FILE.mtime_ns, 1000)
    location, crc = struct.unpack_from(">QI", data, 22)
    assert location == 3 << 48 | (2**40 + 7)
    assert crc == 0xCAFEBABE
    assert data[34:] == b"file.bin"


def _entry_bytes(entry: fmt.Entry, offset: int, fmt_code: str, value: int) -> bytes:
    data = bytearray(fmt.encode_entry(entry))
    struct.pack_into(fmt_code, data, offset, value)
    return bytes(data)


def test_entry_with_unknown_flags_is_refused() -> None:
    with pytest.raises(FormatError, match="flags"):
        fmt.decode_entry(5, _entry_bytes(FILE, 2, ">B", 0x10))


def test_file_entry_with_a_content_type_round_trips() -> None:
    entry = dataclasses.replace(FILE, content_type=513, user_data=b'{"label":3}')
    data = fmt.encode_entry(entry)
    decoded = fmt.decode_entry(entry.ino, data)
    assert decoded.content_type == 513 and decoded.flags & fmt.FLAG_CONTENT_TYPE
    assert decoded.user_data == b'{"label":3}'
    assert fmt.entry_name(data) == entry.name


@pytest.mark.parametrize("entry", ["DIRECTORY", "SYMLINK", "LINK"])
def test_content_type_flag_on_anything_but_a_plain_file_is_refused(entry: str) -> None:
    value = globals()[entry]
    data = bytearray(fmt.encode_entry(value))
    data[2] |= fmt.FLAG_CONTENT_TYPE
    with pytest.raises(FormatError, match="content type"):
        fmt.decode_entry(value.ino, bytes(data))


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


def test_link_entry_carrying_nlink_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.decode_entry(8, _entry_bytes(LINK, 2, ">B", fmt.FLAG_LINK | fmt.FLAG_NLINK))


@pytest.mark.parametrize("flag", [fmt.FLAG_LINK, fmt.FLAG_NLINK])
def test_directory_with_file_only_flags_is_refused(flag: int) -> None:
    with pytest.raises(FormatError):
        fmt.decode_entry(2, _entry_bytes(DIRECTORY, 2, ">B", flag))


@pytest.mark.parametrize("flag", [fmt.FLAG_LINK, fmt.FLAG_NLINK])
def test_symlink_with_file_only_flags_is_refused(flag: int) -> None:
    with pytest.raises(FormatError):
        fmt.decode_entry(7, _entry_bytes(SYMLINK, 2, ">B", flag))


def test_file_entry_with_nlink_zero_is_refused() -> None:
    data = fmt.encode_entry(dataclasses.replace(FILE, flags=fmt.FLAG_NLINK, nlink=0))
    with pytest.raises(FormatError, match="nlink"):
        fmt.decode_entry(5, data)


def test_file_entry_past_the_shard_stream_limit_is_refused() -> None:
    data = fmt.encode_entry(dataclasses.replace(FILE, offset=fmt.MAX_SHARD_STREAM, size=2))
    with pytest.raises(FormatError):
        fmt.decode_entry(5, data)


def test_file_location_out_of_range_cannot_be_encoded() -> None:
    with pytest.raises(FormatError):
        fmt.encode_entry(dataclasses.replace(FILE, shard=fmt.MAX_SHARDS))
    with pytest.raises(FormatError):
        fmt.encode_entry(dataclasses.replace(FILE, offset=2**48))


def test_directory_whose_children_precede_it_is_refused() -> None:
    with pytest.raises(FormatError, match="follow"):
        fmt.decode_entry(2, fmt.encode_entry(dataclasses.replace(DIRECTORY, first_child=2)))


def test_directory_with_a_first_child_but_no_children_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.decode_entry(2, fmt.encode_entry(dataclasses.replace(DIRECTORY, size=0)))


def test_directory_child_range_past_the_inode_limit_is_refused() -> None:
    entry = dataclasses.replace(DIRECTORY, first_child=2**32 - 2, size=5)
    with pytest.raises(FormatError):
        fmt.decode_entry(2, fmt.encode_entry(entry))


@pytest.mark.parametrize("target", [b"", b"x" * 4096], ids=["empty", "4096"])
def test_symlink_target_of_invalid_length_is_refused(target: bytes) -> None:
    entry = dataclasses.replace(SYMLINK, symlink=target, size=len(target))
    with pytest.raises(FormatError, match="target"):
        fmt.decode_entry(7, fmt.encode_entry(entry))


def test_symlink_target_longer_than_the_value_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.decode_entry(7, _entry_bytes(SYMLINK, 14, ">Q", 200))


def test_symlink_target_with_nul_is_refused() -> None:
    entry = dataclasses.replace(SYMLINK, symlink=b"a\0b", size=3)
    with pytest.raises(FormatError, match="NUL"):
        fmt.decode_entry(7, fmt.encode_entry(entry))


@pytest.mark.parametrize("kind", [stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK, 0])
def test_entry_of_another_file_type_is_refused(kind: int) -> None:
    with pytest.raises(FormatError, match="file type"):
        fmt.decode_entry(5, _entry_bytes(FILE, 0, ">H", kind | 0o644))


def test_encoding_another_file_type_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.encode_entry(dataclasses.replace(FILE, mode=stat.S_IFIFO | 0o644))


@pytest.mark.parametrize("cut", [0, 10, 21, 25, 33])
def test_truncated_file_entry_is_refused(cut: int) -> None:
    with pytest.raises(FormatError):
        fmt.decode_entry(5, fmt.encode_entry(dataclasses.replace(FILE, name=b""))[:cut])


def test_truncated_directory_entry_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.decode_entry(2, fmt.encode_entry(DIRECTORY)[:30])


@pytest.mark.parametrize("length", [0, 4097, 50])
def test_user_data_of_invalid_length_is_refused(length: int) -> None:
    # 50 is more bytes than the value holds.
    entry = dataclasses.replace(FILE, user_data=b"abc", name=b"n")
    data = bytearray(fmt.encode_entry(entry))
    struct.pack_into(">H", data, 34, length)
    with pytest.raises(FormatError, match="user data"):
        fmt.decode_entry(5, bytes(data))


@pytest.mark.parametrize("name", [b"", b".", b"..", b"a/b", b"a\0"], ids=repr)
def test_entry_with_an_invalid_name_is_refused(name: bytes) -> None:
    with pytest.raises(FormatError, match="name"):
        fmt.decode_entry(5, fmt.encode_entry(dataclasses.replace(FILE, name=name)))


def test_root_with_a_name_is_refused() -> None:
    with pytest.raises(FormatError, match="root"):
        fmt.decode_entry(1, fmt.encode_entry(dataclasses.replace(ROOT, name=b"x")))


def test_root_that_is_not_a_directory_is_refused() -> None:
    with pytest.raises(FormatError, match="root"):
        fmt.decode_entry(1, fmt.encode_entry(dataclasses.replace(FILE, ino=1, name=b"")))


def test_negative_mtime_survives_encoding() -> None:
    decoded = fmt.decode_entry(5, fmt.encode_entry(dataclasses.replace(FILE, mtime_ns=-(2**63))))
    assert decoded.mtime_ns == -(2**63)


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


# --- shards ---------------------------------------------------------------------------------------


def test_shard_info_round_trips() -> None:
    info = fmt.ShardInfo(file_size=8192, uncompressed_size=2**47, record_count=3)
    data = fmt.encode_shard_info(info)
    assert len(data) == 20
    assert fmt.decode_shard_info(data) == info


def test_shard_info_with_a_stream_past_the_limit_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.decode_shard_info(fmt.encode_shard_info(fmt.ShardInfo(0, 2**48, 0)))


def test_shard_info_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(FormatError):
        fmt.decode_shard_info(b"\0" * 19)


BUNDLE_ID = bytes(range(100, 116))


def test_shard_header_is_32_bytes_and_checks() -> None:
    header = fmt.encode_shard_header(4, BUNDLE_ID)
    assert len(header) == fmt.SHARD_HEADER_SIZE == 32
    assert header[:8] == b"BNDLSHRD"
    fmt.check_shard_header(header + bytes(100), 4, BUNDLE_ID)


@pytest.mark.parametrize(
    "header, error",
    [
        (fmt.encode_shard_header(4, BUNDLE_ID)[:31], FormatError),
        (b"BNDLSHRX" + fmt.encode_shard_header(4, BUNDLE_ID)[8:], FormatError),
        (fmt.encode_shard_header(5, BUNDLE_ID), FormatError),
        (fmt.encode_shard_header(4, bytes(16)), FormatError),
        (
            fmt.encode_shard_header(4, BUNDLE_ID)[:8]
            + struct.pack(">I", 3)
            + fmt.encode_shard_header(4, BUNDLE_ID)[12:],
            UnsupportedVersionError,
        ),
        (fmt.encode_shard_header(4, BUNDLE_ID, 1), UnsupportedVersionError),
    ],
    ids=["short", "magic", "wrong-index", "other-bundle", "newer-version", "older-version"],
)
def test_shard_header_mismatch_is_refused(header: bytes, error: type) -> None:
    with pytest.raises(error):
        fmt.check_shard_header(header, 4, BUNDLE_ID)
