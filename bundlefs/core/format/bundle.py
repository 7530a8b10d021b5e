"""The bundle's own values: the completion marker, the LMDB meta page probe, the config and the
owners table (docs/format.md §2, §3.1, §3.2).

May import: the standard library, ``bundlefs.errors``, ``bundlefs.core.format.constants``,
``bundlefs.core.format.keys``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from bundlefs.core.format.constants import (
    _COMPRESSION_BY_CODE,
    _COMPRESSIONS_OF_VERSION,
    COMPRESSION_LZ4,
    CONFIG_MAGIC,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_LARGE_FILE_THRESHOLD,
    DEFAULT_RECORD_SIZE,
    FIRST_SPECIAL_VERSION,
    FORMAT_VERSION,
    MARKER_MAGIC,
    MAX_BLOCK_SIZE,
    MAX_ENTRIES,
    MAX_OWNERS,
    MAX_RECORD_SIZE,
    MAX_SHARDS,
    MIN_BLOCK_SIZE,
    MIN_RECORD_SIZE,
)
from bundlefs.core.format.keys import _U32, check_version
from bundlefs.errors import FormatError, NotABundleError, UnsupportedVersionError

# --- completion marker ------------------------------------------------------------

_MARKER = struct.Struct(">8sII16sQII")  # everything but the trailing CRC
MARKER_SIZE = _MARKER.size + 4


@dataclass(frozen=True, slots=True)
class Marker:
    bundle_id: bytes
    index_size: int
    index_crc32c: int
    shard_count: int
    format_version: int = FORMAT_VERSION


def encode_marker(marker: Marker, crc32c) -> bytes:
    body = _MARKER.pack(
        MARKER_MAGIC,
        marker.format_version,
        0,
        marker.bundle_id,
        marker.index_size,
        marker.index_crc32c,
        marker.shard_count,
    )
    return body + _U32.pack(crc32c(body))


def decode_marker(data: bytes, crc32c) -> Marker:
    """Decode COMPLETE; ``crc32c`` is the checksum function (this module does not import it)."""
    if len(data) != MARKER_SIZE:
        raise NotABundleError(f"completion marker is {len(data)} bytes, expected {MARKER_SIZE}")
    magic, version, _reserved, bundle_id, index_size, index_crc, shard_count = _MARKER.unpack_from(
        data
    )
    if magic != MARKER_MAGIC:
        raise NotABundleError("completion marker has the wrong magic")
    if _U32.unpack_from(data, _MARKER.size)[0] != crc32c(data[: _MARKER.size]):
        raise NotABundleError("completion marker fails its checksum")
    check_version(version, "bundle")
    if shard_count > MAX_SHARDS:
        raise FormatError(f"completion marker claims {shard_count} shards")
    return Marker(bundle_id, index_size, index_crc, shard_count, version)


# --- LMDB meta page sanity (docs/format.md §3.1) ----------------------------------------

_LMDB_MAGIC = 0xBEEFC0DE
LMDB_META_PROBE = 4096 + 144  # enough bytes to see both meta pages at the smallest page size we map


def check_lmdb_meta(head: bytes, file_size: int) -> None:
    """Refuse an LMDB file whose meta pages point past its end (LMDB would fault with SIGBUS).

    ``head`` is the start of data.mdb: at least ``page_size + 144`` bytes.
    """
    if len(head) < 144:
        raise FormatError("index is too short to hold an LMDB meta page")
    magic, version = struct.unpack_from("<II", head, 16)
    page_size = struct.unpack_from("<I", head, 40)[0]
    if magic != _LMDB_MAGIC or version != 1:
        raise FormatError("index is not an LMDB environment of a supported version")
    if page_size < 512 or page_size > 65536 or page_size & (page_size - 1):
        raise FormatError(f"index has an invalid LMDB page size {page_size}")
    if len(head) < page_size + 144 or file_size < 2 * page_size:
        raise FormatError("index is too short to hold both LMDB meta pages")
    # LMDB takes the page size from the meta it picks (the larger txnid): the second must agree,
    # or LMDB would address every page at another size.
    second = struct.unpack_from("<II", head, page_size + 16)
    if second != (magic, version) or struct.unpack_from("<I", head, page_size + 40)[0] != page_size:
        raise FormatError("the index's two LMDB meta pages disagree")
    for meta in (0, page_size):
        last_pg = struct.unpack_from("<Q", head, meta + 136)[0]
        if (last_pg + 1) * page_size > file_size:
            raise FormatError("index meta page points past the end of the file (truncated index?)")


# --- config --------------------------------------------------------------------------------------

_CONFIG = struct.Struct(">8sHHIIIIB3xIIQQQQQQq")
CONFIG_SIZE = _CONFIG.size  # 96


@dataclass(frozen=True, slots=True)
class Config:
    block_size: int = DEFAULT_BLOCK_SIZE
    record_size: int = DEFAULT_RECORD_SIZE
    large_file_threshold: int = DEFAULT_LARGE_FILE_THRESHOLD
    compression: int = COMPRESSION_LZ4
    shard_count: int = 0
    owner_count: int = 0
    entry_count: int = 0
    file_count: int = 0
    dir_count: int = 0
    symlink_count: int = 0
    hardlink_count: int = 0
    data_bytes: int = 0
    created_ns: int = 0
    content_type_count: int = 0  # version 2: keys in ``types``
    format_version: int = FORMAT_VERSION

    @property
    def compression_name(self) -> str:
        return _COMPRESSION_BY_CODE[self.compression]

    @property
    def special_count(self) -> int:
        """FIFOs, sockets and devices (version 4): the entries no count field counts."""
        counted = self.file_count + self.dir_count + self.symlink_count + self.hardlink_count
        return self.entry_count - counted

    @property
    def record_codec(self) -> int:
        """How a record without ZEROS or RAW is stored: always lz4 in version 1, the bundle's
        compression from version 2 on (none then leaves no valid compressed record)."""
        return COMPRESSION_LZ4 if self.format_version == 1 else self.compression


def validate_layout(block_size: int, record_size: int) -> None:
    if not (MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE) or block_size & (block_size - 1):
        raise FormatError(f"block size {block_size} is not a power of two from 512 to 1 MiB")
    if not MIN_RECORD_SIZE <= record_size <= MAX_RECORD_SIZE:
        raise FormatError(f"record size {record_size} is not between 4 KiB and 16 MiB")


def encode_config(c: Config) -> bytes:
    if not -(2**63) <= c.created_ns < 2**63:
        raise FormatError("the creation time is outside what a bundle stores (years 1678 to 2262)")
    return _CONFIG.pack(
        CONFIG_MAGIC,
        c.format_version,
        c.content_type_count if c.format_version >= 2 else 0,
        0,
        c.block_size,
        c.record_size,
        c.large_file_threshold,
        c.compression,
        c.shard_count,
        c.owner_count,
        c.entry_count,
        c.file_count,
        c.dir_count,
        c.symlink_count,
        c.hardlink_count,
        c.data_bytes,
        c.created_ns,
    )


def decode_config(data: bytes) -> Config:
    if len(data) != CONFIG_SIZE:
        raise FormatError(f"config is {len(data)} bytes, expected {CONFIG_SIZE}")
    (magic, version, types, incompat, block, record, large, comp, *counts) = _CONFIG.unpack(data)
    if magic != CONFIG_MAGIC:
        raise FormatError("config has the wrong magic")
    check_version(version, "config")
    if version == 1:
        types = 0  # reserved in version 1: ignored
    if incompat:
        raise UnsupportedVersionError(f"bundle uses unknown features (0x{incompat:x})")
    validate_layout(block, record)
    if comp not in _COMPRESSIONS_OF_VERSION[version]:
        raise FormatError(f"unknown compression code {comp}")
    shards, owners, entries, files, dirs, symlinks, hardlinks, data_bytes, created_ns = counts
    c = Config(
        block, record, large, comp, shards, owners, entries, files, dirs, symlinks, hardlinks,
        data_bytes, created_ns, types, version,
    )  # fmt: skip
    if c.shard_count > MAX_SHARDS or c.owner_count > MAX_OWNERS or c.entry_count > MAX_ENTRIES:
        raise FormatError("config counts are out of range")
    if c.entry_count < 1:
        raise FormatError("config claims no root directory")
    if version >= FIRST_SPECIAL_VERSION and c.special_count < 0:
        raise FormatError("config counts more entries by kind than it has entries")
    return c


# --- owners --------------------------------------------------------------------------------------

_OWNER = struct.Struct(">II")


def encode_owner(uid: int, gid: int) -> bytes:
    return _OWNER.pack(uid, gid)


def decode_owner(data: bytes) -> tuple[int, int]:
    if len(data) != _OWNER.size:
        raise FormatError(f"owner value of {len(data)} bytes, expected {_OWNER.size}")
    return _OWNER.unpack(data)
