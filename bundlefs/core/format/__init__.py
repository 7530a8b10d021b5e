"""The bundlefs on-disk format, version 6 (versions 1 to 5 still read): layouts and keys.

docs/format.md in code, pure (no I/O, lmdb, lz4). Every decoder validates what it decodes and
raises ``FormatError`` for what the document does not allow. One namespace for callers, ``from
bundlefs.core import format as fmt``: this module re-exports every name and dispatches entries.
Rooms, each importing only those before it: ``constants`` (versions, names, limits, codes, flags),
``keys`` (LMDB keys, shard file names, the version check, metadata, content types, totals, source
records), ``bundle`` (marker, LMDB meta probe, config, owners), ``entry`` (``Entry``, the shared
validation), ``entry_v2`` (versions 1, 2), ``entry_v3`` (versions 3 to 6, ``reusable_file``),
``records`` (records, shard table, shard header), ``bases`` (version 6); apart, ``pages`` and
``dirents`` (names and modes for listings).

Order (bottom first): constants, keys, bundle, entry, entry_v2 | entry_v3, records, bases | pages |
dirents

May import: the standard library, ``bundlefs.errors``, ``bundlefs.core.format.*``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator

from bundlefs.core.format.bases import BaseRef, base_key, decode_base, encode_base, store_name
from bundlefs.core.format.bundle import (
    CONFIG_SIZE,
    LMDB_META_PROBE,
    MARKER_SIZE,
    Config,
    Marker,
    check_lmdb_meta,
    decode_config,
    decode_marker,
    decode_owner,
    encode_config,
    encode_marker,
    encode_owner,
    validate_layout,
)
from bundlefs.core.format.constants import (
    ALL_DBS,
    COMPRESSION_LZ4,
    COMPRESSION_NAMES,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    CONFIG_KEY,
    CONFIG_MAGIC,
    DB_BASES,
    DB_CONFIG,
    DB_ENTRIES,
    DB_META,
    DB_OWNERS,
    DB_RECORDS,
    DB_SHARDS,
    DB_SOURCES,
    DB_TOTALS,
    DB_TYPES,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_LARGE_FILE_THRESHOLD,
    DEFAULT_RECORD_SIZE,
    DEVICE_KINDS,
    DIGEST_NAME,
    DIGEST_SIZE,
    FIRST_BASES_VERSION,
    FIRST_SPECIAL_VERSION,
    FIRST_V5_VERSION,
    FLAG_CONTENT_TYPE,
    FLAG_DIGEST,
    FLAG_LINK,
    FLAG_NLINK,
    FLAG_USER_DATA,
    FORMAT_VERSION,
    INDEX_DIR,
    INDEX_FILE,
    KIND_BLOCK_DEVICE,
    KIND_CHAR_DEVICE,
    KIND_DIR,
    KIND_FIFO,
    KIND_FILE,
    KIND_SOCKET,
    KIND_SYMLINK,
    MARKER_MAGIC,
    MARKER_NAME,
    MAX_BLOCK_SIZE,
    MAX_CONTENT_TYPE,
    MAX_CONTENT_TYPES,
    MAX_ENTRIES,
    MAX_META_KEY,
    MAX_META_KEYS,
    MAX_META_VALUE,
    MAX_NAME,
    MAX_OWNERS,
    MAX_RECORD_SIZE,
    MAX_SHARD_STREAM,
    MAX_SHARDS,
    MAX_SYMLINK_TARGET,
    MAX_USER_DATA,
    MIN_BLOCK_SIZE,
    MIN_RECORD_SIZE,
    NO_CONTENT_TYPE,
    RECORD_RAW,
    RECORD_ZEROS,
    ROOT_INO,
    SHARD_MAGIC,
    SHARD_PREFIX,
    SPECIAL_KINDS,
    SUPPORTED_VERSIONS,
    V1_DBS,
    V2_DBS,
    XATTR_BUNDLE,
    XATTR_CONTENT_TYPE,
    XATTR_CRC,
    XATTR_DIGEST,
    XATTR_STATS,
    XATTR_TREE,
    XATTR_USER_DATA,
    databases,
)
from bundlefs.core.format.entry import Entry, makedev, validate_name
from bundlefs.core.format.entry_v2 import (
    _decode_entry_v2,
    _encode_entry_v2,
    _entry_name_v2,
    _file_extent_v2,
    _location_span_v2,
)
from bundlefs.core.format.entry_v3 import (
    LAYOUT_MTIME_NS,
    LAYOUT_OWNER,
    LAYOUT_SIZE_WIDTH,
    LAYOUT_WIDE_OFFSET,
    LAYOUT_WIDE_SHARD,
    _decode_entry_v3,
    _encode_entry_v3,
    _entry_name_v3,
    _file_extents_v3,
    _file_location_v3,
    _location_span_v3,
    _relocate_files_v3,
    reusable_file,
)
from bundlefs.core.format.keys import (
    TOTALS_SIZE,
    TreeTotals,
    check_version,
    content_type_key,
    decode_content_type,
    decode_entry_key,
    decode_meta,
    decode_record_key,
    decode_source,
    decode_totals,
    encode_content_type,
    encode_meta_value,
    encode_source,
    encode_totals,
    entry_key,
    meta_key,
    owner_key,
    record_key,
    shard_filename,
    shard_key,
    totals_key,
)
from bundlefs.core.format.records import (
    OWN_BUNDLE_ID,
    RECORD_VALUE_SIZE,
    SHARD_HEADER_SIZE,
    Record,
    ShardInfo,
    check_shard_header,
    decode_record,
    decode_shard_info,
    encode_record,
    encode_shard_header,
    encode_shard_info,
    pad_to,
)
from bundlefs.errors import FormatError


def encode_entry(e: Entry, version: int = FORMAT_VERSION) -> bytes:
    """Encode an entry value (the key is ``entry_key(e.ino)``) in ``version``'s layout."""
    if version >= 3:
        return _encode_entry_v3(e, version)
    return _encode_entry_v2(e)


def is_directory_value(data: bytes) -> bool:
    """Whether an (undecoded) entry value is a directory's: for scans that skip everything else."""
    return len(data) >= 2 and (data[0] << 8) & 0o170000 == KIND_DIR


def file_location(data: bytes, version: int = FORMAT_VERSION) -> tuple[int, int] | None:
    """(shard, offset) of a plain file's (undecoded) entry value, for scans that need where each
    file is stored and nothing else (read/stream.py); None for another kind of entry, a LINK
    entry, a value it cannot read, or a version before 3: decode those in full."""
    return _file_location_v3(data) if version >= 3 else None


def entry_name(data: bytes, version: int = FORMAT_VERSION) -> bytes:
    """Just the name of an entry value, nothing else decoded or validated: for binary search and
    name matching; what is used is then decoded in full (or checked by ``reusable_file``)."""
    if version >= 3:
        return _entry_name_v3(data)
    return _entry_name_v2(data)


def location_span(version: int = FORMAT_VERSION) -> Callable[[bytes], tuple[int, int] | None]:
    """For ``version``'s layout, a function giving where a regular file's location (shard and
    offset) lies in its entry value, ``(start, end)``, from the value's first bytes alone
    (unvalidated), or None for any other entry (a ``LINK`` too).

    Two values of one layout family (versions 1–2, or 3 and later) equal outside that span name
    files with the same name, mode, owner index, mtime, size, CRC32C, flags and optional parts,
    wherever their bytes are stored: what ``bundlefs diff`` compares before decoding anything.
    """
    return _location_span_v3 if version >= 3 else _location_span_v2


def decode_entry(ino: int, data: bytes, version: int = FORMAT_VERSION) -> Entry:
    """Decode and validate an entry value of ``version``'s layout. The root (``ino == 1``) alone
    has an empty name."""
    try:
        if version >= 3:
            return _decode_entry_v3(ino, data, version)
        return _decode_entry_v2(ino, data, version)
    except struct.error:
        raise FormatError(f"entry {ino} is truncated") from None


def file_extents(
    values: Iterable[bytes], version: int = FORMAT_VERSION
) -> Iterator[tuple[int, int, int]]:
    """(shard, offset, size) of each undecoded value in ``values`` that is a regular file holding
    its content (not a ``LINK``), nothing else decoded or validated: for scans over every file's
    location (``storage.liveness``, which checks the shard)."""
    try:
        if version >= 3:
            yield from _file_extents_v3(values)
            return
        for data in values:
            extent = _file_extent_v2(data)
            if extent is not None:
                yield extent
    except (struct.error, IndexError):
        raise FormatError("an entry is truncated") from None


def relocate_files(
    values: Iterable[bytes], where: Callable[[int, int, int], tuple[int, int]]
) -> Iterator[bytes]:
    """Compact entry values (version 3 on), one out per one in, each as it is but a file holding
    content: ``where`` maps its (shard, offset, size) to a new (shard, offset) (widths follow)."""
    try:
        yield from _relocate_files_v3(values, where)
    except (struct.error, IndexError):
        raise FormatError("an entry is truncated") from None


__all__ = [
    "DB_SOURCES",
    "encode_source",
    "decode_source",
    "reusable_file",
    "totals_key",
    "encode_totals",
    "decode_totals",
    "TreeTotals",
    "TOTALS_SIZE",
    "XATTR_DIGEST",
    "V2_DBS",
    "FLAG_DIGEST",
    "FIRST_V5_VERSION",
    "DIGEST_SIZE",
    "DIGEST_NAME",
    "DB_TOTALS",
    "ALL_DBS",
    "COMPRESSION_LZ4",
    "COMPRESSION_NAMES",
    "COMPRESSION_NONE",
    "COMPRESSION_ZSTD",
    "CONFIG_KEY",
    "CONFIG_MAGIC",
    "CONFIG_SIZE",
    "Config",
    "DB_CONFIG",
    "DB_ENTRIES",
    "DB_META",
    "DB_OWNERS",
    "DB_RECORDS",
    "DB_SHARDS",
    "DB_TYPES",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_LARGE_FILE_THRESHOLD",
    "DEFAULT_RECORD_SIZE",
    "DEVICE_KINDS",
    "Entry",
    "FIRST_SPECIAL_VERSION",
    "FLAG_CONTENT_TYPE",
    "FLAG_LINK",
    "FLAG_NLINK",
    "FLAG_USER_DATA",
    "FORMAT_VERSION",
    "INDEX_DIR",
    "INDEX_FILE",
    "KIND_BLOCK_DEVICE",
    "KIND_CHAR_DEVICE",
    "KIND_DIR",
    "KIND_FIFO",
    "KIND_FILE",
    "KIND_SOCKET",
    "KIND_SYMLINK",
    "LAYOUT_MTIME_NS",
    "LAYOUT_OWNER",
    "LAYOUT_SIZE_WIDTH",
    "LAYOUT_WIDE_OFFSET",
    "LAYOUT_WIDE_SHARD",
    "LMDB_META_PROBE",
    "MARKER_MAGIC",
    "MARKER_NAME",
    "MARKER_SIZE",
    "MAX_BLOCK_SIZE",
    "MAX_CONTENT_TYPE",
    "MAX_CONTENT_TYPES",
    "MAX_ENTRIES",
    "MAX_META_KEY",
    "MAX_META_KEYS",
    "MAX_META_VALUE",
    "MAX_NAME",
    "MAX_OWNERS",
    "MAX_RECORD_SIZE",
    "MAX_SHARDS",
    "MAX_SHARD_STREAM",
    "MAX_SYMLINK_TARGET",
    "MAX_USER_DATA",
    "MIN_BLOCK_SIZE",
    "MIN_RECORD_SIZE",
    "Marker",
    "NO_CONTENT_TYPE",
    "OWN_BUNDLE_ID",
    "RECORD_RAW",
    "RECORD_VALUE_SIZE",
    "RECORD_ZEROS",
    "ROOT_INO",
    "Record",
    "SHARD_HEADER_SIZE",
    "SHARD_MAGIC",
    "SHARD_PREFIX",
    "SPECIAL_KINDS",
    "SUPPORTED_VERSIONS",
    "ShardInfo",
    "V1_DBS",
    "XATTR_BUNDLE",
    "XATTR_CONTENT_TYPE",
    "XATTR_CRC",
    "XATTR_STATS",
    "XATTR_TREE",
    "XATTR_USER_DATA",
    "check_lmdb_meta",
    "check_shard_header",
    "check_version",
    "content_type_key",
    "databases",
    "decode_config",
    "decode_content_type",
    "decode_entry",
    "decode_entry_key",
    "decode_marker",
    "decode_meta",
    "decode_owner",
    "decode_record",
    "decode_record_key",
    "decode_shard_info",
    "encode_config",
    "encode_content_type",
    "encode_entry",
    "file_extents",
    "encode_marker",
    "encode_meta_value",
    "encode_owner",
    "encode_record",
    "encode_shard_header",
    "encode_shard_info",
    "entry_key",
    "entry_name",
    "file_location",
    "location_span",
    "is_directory_value",
    "makedev",
    "meta_key",
    "owner_key",
    "pad_to",
    "record_key",
    "relocate_files",
]
__all__ += ["shard_filename", "shard_key", "validate_layout", "validate_name"]
__all__ += ["BaseRef", "DB_BASES", "FIRST_BASES_VERSION", "base_key", "decode_base"]
__all__ += ["encode_base", "store_name"]
