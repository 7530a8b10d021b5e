"""Records and shards: the record descriptor, the shard table (versions 1–2 and 3) and the shard
file header (docs/format.md §3.4–§3.6, §4).

May import: the standard library, ``bundlefs.errors``, ``bundlefs.core.format.constants``,
``bundlefs.core.format.bundle``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from bundlefs.core.format.bundle import Config
from bundlefs.core.format.constants import (
    _COMPRESSIONS_OF_VERSION,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    FIRST_BASES_VERSION,
    FORMAT_VERSION,
    MAX_SHARD_STREAM,
    RECORD_RAW,
    RECORD_ZEROS,
    SHARD_MAGIC,
    SUPPORTED_VERSIONS,
)
from bundlefs.errors import FormatError, UnsupportedVersionError

_RECORD = struct.Struct(">QIIIB")
RECORD_VALUE_SIZE = _RECORD.size  # 21


@dataclass(slots=True)
class Record:
    """A record descriptor (treat as read-only; not frozen for the same reason as ``Entry``)."""

    shard: int
    offset: int  # first byte in the uncompressed stream
    stored_offset: int
    stored_length: int
    length: int
    crc32c: int
    flags: int

    @property
    def end(self) -> int:
        return self.offset + self.length


def encode_record(r: Record) -> bytes:
    return _RECORD.pack(r.stored_offset, r.stored_length, r.length, r.crc32c, r.flags)


def decode_record(
    shard: int, offset: int, data: bytes, config: Config, codec: int | None = None
) -> Record:
    """Decode and validate a record of ``shard``, whose compressed records are stored with
    ``codec`` (its shard table entry's; None: the bundle's own ``record_codec``)."""
    if len(data) != RECORD_VALUE_SIZE:
        raise FormatError(f"record value of {len(data)} bytes, expected {RECORD_VALUE_SIZE}")
    stored_offset, stored_length, length, crc, flags = _RECORD.unpack(data)
    r = Record(shard, offset, stored_offset, stored_length, length, crc, flags)
    bad = None
    if flags & ~(RECORD_ZEROS | RECORD_RAW) or flags == RECORD_ZEROS | RECORD_RAW:
        bad = f"unknown flags 0x{flags:x}"
    elif not 1 <= length <= config.record_size:
        bad = f"length {length} outside 1..{config.record_size}"
    elif stored_offset < config.block_size or stored_offset % config.block_size:
        bad = f"stored offset {stored_offset} is not a block boundary past the header"
    elif flags & RECORD_ZEROS and stored_length:
        bad = "a zeros record with stored bytes"
    elif flags & RECORD_RAW and stored_length != length:
        bad = "a raw record whose stored length differs from its length"
    elif not flags and not 0 < stored_length < length:
        bad = f"compressed length {stored_length} not smaller than {length}"
    elif not flags and (config.record_codec if codec is None else codec) == COMPRESSION_NONE:
        bad = "a compressed record in a bundle packed without compression"
    if bad:
        raise FormatError(f"record {shard}:{offset} is invalid: {bad}")
    return r


# --- shards --------------------------------------------------------------------------------------

_SHARD_INFO = struct.Struct(">QQI")  # versions 1 and 2: 20 bytes
_SHARD_ENTRY = struct.Struct(">QQIBB2xI16s")  # version 3, the shard table: 44 bytes
_SHARD_BASE = struct.Struct(">II")  # version 6: base, base_shard after those (52 bytes)
_SHARD_HEADER = struct.Struct(">8sII16s")
SHARD_HEADER_SIZE = _SHARD_HEADER.size
OWN_BUNDLE_ID = bytes(16)  # a shard table entry's header_id for a shard this bundle wrote


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """A shard's descriptor. From version 3 on, the shard table also says how the shard's
    records are compressed and what its header says, so a bundle can hold shards other bundles
    wrote (``bundlefs merge`` links them in unchanged). A version 1 or 2 descriptor decodes with
    the bundle's own values in those fields."""

    file_size: int
    uncompressed_size: int
    record_count: int
    codec: int = COMPRESSION_LZ4  # how a record without ZEROS or RAW is stored
    header_version: int = FORMAT_VERSION  # the format version in the shard file's header
    header_index: int | None = None  # the shard index in its header; None: its index here
    header_id: bytes = OWN_BUNDLE_ID  # the bundle id in its header; zeros: this bundle's
    base: int = 0  # version 6: 0, the file is this bundle's; k, it is in base k (``bases``)
    base_shard: int = 0  # its index in that base (named shard-%08d there); 0 when base is 0


def encode_shard_info(s: ShardInfo, version: int = FORMAT_VERSION, index: int = 0) -> bytes:
    """The ``shards`` value of shard ``index``."""
    if version < 3:
        return _SHARD_INFO.pack(s.file_size, s.uncompressed_size, s.record_count)
    header_index = index if s.header_index is None else s.header_index
    value = _SHARD_ENTRY.pack(
        s.file_size,
        s.uncompressed_size,
        s.record_count,
        s.codec,
        s.header_version,
        header_index,
        s.header_id,
    )
    if version < FIRST_BASES_VERSION:
        if s.base:
            raise FormatError(f"a version {version} bundle has no bases")
        return value
    return value + _SHARD_BASE.pack(s.base, s.base_shard)


def decode_shard_info(data: bytes, version: int, index: int, config: Config) -> ShardInfo:
    """Decode shard ``index``'s descriptor; validated against ``config`` (its version's rules)."""
    if version < 3:
        if len(data) != _SHARD_INFO.size:
            raise FormatError(f"shard value of {len(data)} bytes, expected {_SHARD_INFO.size}")
        size, stream, records = _SHARD_INFO.unpack(data)
        info = ShardInfo(size, stream, records, config.record_codec, version, index)
    else:
        based = version >= FIRST_BASES_VERSION
        expected = _SHARD_ENTRY.size + (_SHARD_BASE.size if based else 0)
        if len(data) != expected:
            raise FormatError(f"shard value of {len(data)} bytes, expected {expected}")
        size, stream, records, codec, header_version, header_index, header_id = (
            _SHARD_ENTRY.unpack_from(data)
        )
        base, base_shard = _SHARD_BASE.unpack_from(data, _SHARD_ENTRY.size) if based else (0, 0)
        if header_version not in SUPPORTED_VERSIONS or header_version > version:
            raise FormatError(f"shard {index}: header version {header_version} is not valid here")
        if codec not in _COMPRESSIONS_OF_VERSION[header_version]:
            raise FormatError(f"shard {index}: unknown compression code {codec}")
        if header_version == 1 and codec != COMPRESSION_LZ4:
            raise FormatError(f"shard {index}: a version 1 shard's records are lz4")
        if header_id == OWN_BUNDLE_ID and (header_version, header_index) != (version, index):
            raise FormatError(f"shard {index}: this bundle's own shard must carry its index")
        if base and header_id == OWN_BUNDLE_ID:
            raise FormatError(f"shard {index}: a shard in a base cannot carry this bundle's id")
        if not base and base_shard:
            raise FormatError(f"shard {index}: a base_shard without a base")
        info = ShardInfo(
            size, stream, records, codec, header_version, header_index, header_id, base, base_shard
        )
    if info.uncompressed_size > MAX_SHARD_STREAM:
        raise FormatError("shard stream size out of range")
    return info


def encode_shard_header(index: int, bundle_id: bytes, version: int = FORMAT_VERSION) -> bytes:
    return _SHARD_HEADER.pack(SHARD_MAGIC, version, index, bundle_id)


def check_shard_header(data: bytes, index: int, bundle_id: bytes, info: ShardInfo) -> None:
    """A shard's header must say what the bundle's descriptor of shard ``index`` says: the
    version, position and bundle id it was written with (this bundle's, unless the shard table
    names another bundle's)."""
    if len(data) < SHARD_HEADER_SIZE:
        raise FormatError(f"shard {index} is too short to hold its header")
    magic, got_version, got_index, got_id = _SHARD_HEADER.unpack_from(data)
    if magic != SHARD_MAGIC:
        raise FormatError(f"shard {index} has the wrong magic")
    if got_version != info.header_version:
        raise UnsupportedVersionError(
            f"shard {index}'s header says format version {got_version}, the index "
            f"{info.header_version}"
        )
    want_index = index if info.header_index is None else info.header_index
    want_id = bundle_id if info.header_id == OWN_BUNDLE_ID else info.header_id
    if got_index != want_index or got_id != want_id:
        raise FormatError(f"shard {index} belongs to another bundle or position")


def pad_to(n: int, block: int) -> int:
    """``n`` rounded up to a multiple of ``block`` (a power of two)."""
    return (n + block - 1) & ~(block - 1)
