"""The bundlefs on-disk format, version 3 (versions 1 and 2 still read): layouts and keys.

This module is docs/format.md in code. It is pure: it does no I/O and imports neither lmdb nor lz4.
Every decoder validates what it decodes and raises ``FormatError`` for anything the document does
not allow, so the layers above can trust a decoded value's ranges.

May import: the standard library, ``bundlefs.errors``; no storage or compression library.
"""

from __future__ import annotations

import re
import stat as statmod
import struct
from dataclasses import dataclass

from bundlefs.errors import FormatError, NotABundleError, UnsupportedVersionError

FORMAT_VERSION = 3  # what the packer writes
SUPPORTED_VERSIONS = (1, 2, 3)  # what readers read (docs/format.md §7 lists what each one added)

MARKER_NAME = "COMPLETE"

# Extended attributes a mount serves (docs/format.md, "Extended attributes").
XATTR_CRC = b"user.bundlefs.crc32c"
XATTR_USER_DATA = b"user.bundlefs.user_data"
XATTR_STATS = b"user.bundlefs.stats"  # on the root only: the daemon's counters as JSON
XATTR_BUNDLE = b"user.bundlefs.bundle"  # on the root only: the served bundle (info --json)
XATTR_CONTENT_TYPE = b"user.bundlefs.content_type"  # files with a content type (version 2)
INDEX_DIR = "index"
INDEX_FILE = "data.mdb"
SHARD_PREFIX = "shard-"

MARKER_MAGIC = b"BNDLDONE"
CONFIG_MAGIC = b"BUNDLEFS"
SHARD_MAGIC = b"BNDLSHRD"

DB_CONFIG = b"config"
DB_ENTRIES = b"entries"
DB_RECORDS = b"records"
DB_SHARDS = b"shards"
DB_OWNERS = b"owners"
DB_TYPES = b"types"  # version 2
DB_META = b"meta"  # version 2
V1_DBS = (DB_CONFIG, DB_ENTRIES, DB_RECORDS, DB_SHARDS, DB_OWNERS)
ALL_DBS = (*V1_DBS, DB_TYPES, DB_META)


def databases(version: int) -> tuple[bytes, ...]:
    """The named databases a bundle of ``version`` has."""
    return V1_DBS if version == 1 else ALL_DBS


CONFIG_KEY = b"config"

ROOT_INO = 1

DEFAULT_BLOCK_SIZE = 4096
DEFAULT_RECORD_SIZE = 256 * 1024
DEFAULT_LARGE_FILE_THRESHOLD = 1024 * 1024
MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 512, 1024 * 1024
MIN_RECORD_SIZE, MAX_RECORD_SIZE = 4096, 16 * 1024 * 1024

COMPRESSION_NONE = 0
COMPRESSION_LZ4 = 1
COMPRESSION_ZSTD = 2  # version 2
COMPRESSION_NAMES = {"none": COMPRESSION_NONE, "lz4": COMPRESSION_LZ4, "zstd": COMPRESSION_ZSTD}
_COMPRESSIONS_OF_VERSION = {
    1: (COMPRESSION_NONE, COMPRESSION_LZ4),
    2: tuple(COMPRESSION_NAMES.values()),
    3: tuple(COMPRESSION_NAMES.values()),
}
_COMPRESSION_BY_CODE = {code: name for name, code in COMPRESSION_NAMES.items()}

MAX_ENTRIES = 2**32 - 1
MAX_SHARDS = 2**16
MAX_SHARD_STREAM = 2**48 - 1
MAX_NAME = 255
MAX_SYMLINK_TARGET = 4095
MAX_USER_DATA = 4096
MAX_OWNERS = 2**16
MAX_CONTENT_TYPES = 2**16 - 1  # the config counts them in a u16
MAX_CONTENT_TYPE = 127
MAX_META_KEYS = 1024
MAX_META_KEY = 255
MAX_META_VALUE = 65536

# Entry flags.
FLAG_LINK = 0x01
FLAG_USER_DATA = 0x02
FLAG_NLINK = 0x04
FLAG_CONTENT_TYPE = 0x08  # version 2
_KNOWN_ENTRY_FLAGS = FLAG_LINK | FLAG_USER_DATA | FLAG_NLINK | FLAG_CONTENT_TYPE
NO_CONTENT_TYPE = -1

# Record flags.
RECORD_ZEROS = 0x01
RECORD_RAW = 0x02

# --- keys ----------------------------------------------------------------------------------------

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_RECORD_KEY = struct.Struct(">IQ")


def entry_key(ino: int) -> bytes:
    return _U32.pack(ino)


def decode_entry_key(key: bytes) -> int:
    if len(key) != 4:
        raise FormatError(f"entry key of {len(key)} bytes, expected 4")
    return _U32.unpack(key)[0]


def record_key(shard: int, offset: int) -> bytes:
    return _RECORD_KEY.pack(shard, offset)


def decode_record_key(key: bytes) -> tuple[int, int]:
    if len(key) != _RECORD_KEY.size:
        raise FormatError(f"record key of {len(key)} bytes, expected {_RECORD_KEY.size}")
    return _RECORD_KEY.unpack(key)


def shard_key(index: int) -> bytes:
    return _U32.pack(index)


def owner_key(index: int) -> bytes:
    return _U16.pack(index)


def shard_filename(index: int, version: int = FORMAT_VERSION) -> str:
    """``shard-`` and the index as eight decimal digits; version 1 used lowercase hex."""
    if version == 1:
        return f"{SHARD_PREFIX}{index:08x}"
    return f"{SHARD_PREFIX}{index:08d}"


def check_version(version: int, what: str) -> None:
    if version not in SUPPORTED_VERSIONS:
        newest = SUPPORTED_VERSIONS[-1]
        raise UnsupportedVersionError(
            f"{what} format version {version} is not supported (this bundlefs reads versions "
            f"1 to {newest})"
        )


def meta_key(key: str) -> bytes:
    data = _utf8(key, "metadata key")
    _check_meta_key(data)
    return data


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # lone surrogates: bytes from the command line that are not UTF-8
        raise FormatError(f"{what} {text[:40]!r} is not UTF-8 text") from None


def _check_meta_key(data: bytes) -> None:
    if not 1 <= len(data) <= MAX_META_KEY or b"\0" in data:
        raise FormatError(f"metadata key {data[:40]!r} is empty, too long or holds NUL")


def encode_meta_value(value: str) -> bytes:
    data = _utf8(value, "metadata value")
    if len(data) > MAX_META_VALUE:
        raise FormatError(f"metadata value of {len(data)} bytes is over {MAX_META_VALUE}")
    return data


def decode_meta(key: bytes, value: bytes) -> tuple[str, str]:
    """A metadata item; keys and values are UTF-8 text."""
    _check_meta_key(key)
    if len(value) > MAX_META_VALUE:
        raise FormatError(f"metadata value of {len(value)} bytes is over {MAX_META_VALUE}")
    try:
        return key.decode(), value.decode()
    except UnicodeDecodeError:
        raise FormatError(f"metadata item {key[:40]!r} is not UTF-8") from None


def content_type_key(index: int) -> bytes:
    return _U16.pack(index)


def encode_content_type(media_type: str) -> bytes:
    try:
        data = media_type.encode("ascii")
    except UnicodeEncodeError:
        raise FormatError(f"content type {media_type[:40]!r} is not a media type (ASCII)") from None
    _check_content_type(data)
    return data


def decode_content_type(data: bytes) -> str:
    _check_content_type(data)
    return data.decode("ascii")


# type "/" subtype (RFC 6838 restricted names), then optional parameters in printable ASCII.
_MEDIA_TYPE = re.compile(
    rb"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*(;[ -~]*)?"
)


def _check_content_type(data: bytes) -> None:
    if not 3 <= len(data) <= MAX_CONTENT_TYPE or not _MEDIA_TYPE.fullmatch(data):
        raise FormatError(f"content type {data[:40]!r} is not a media type")


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
    return c


# --- owners --------------------------------------------------------------------------------------

_OWNER = struct.Struct(">II")


def encode_owner(uid: int, gid: int) -> bytes:
    return _OWNER.pack(uid, gid)


def decode_owner(data: bytes) -> tuple[int, int]:
    if len(data) != _OWNER.size:
        raise FormatError(f"owner value of {len(data)} bytes, expected {_OWNER.size}")
    return _OWNER.unpack(data)


# --- entries -------------------------------------------------------------------------------------

_HEADER = struct.Struct(">HBxHqQ")  # mode, flags, owner, mtime_ns, size: 22 bytes
_FILE = struct.Struct(">QI")  # location, crc32c
_DIR = struct.Struct(">III")  # parent, first_child, nlink
_LINK = struct.Struct(">I")  # target
_LOCATION_SHIFT = 48
_LOCATION_MASK = (1 << 48) - 1

KIND_FILE = statmod.S_IFREG
KIND_DIR = statmod.S_IFDIR
KIND_SYMLINK = statmod.S_IFLNK


@dataclass(slots=True)
class Entry:
    """One decoded entry. Fields that do not apply to the entry's kind are zero or empty.

    Treat it as read-only. It is not frozen because a frozen dataclass of this size costs ~6 µs
    to construct against ~1.3 µs, and every lookup, getattr and read builds one.
    """

    ino: int
    mode: int
    owner: int
    mtime_ns: int
    size: int
    name: bytes
    flags: int = 0
    shard: int = 0  # file
    offset: int = 0  # file: first byte in the shard's uncompressed stream
    crc32c: int = 0  # file
    nlink: int = 1  # file or directory
    target: int = 0  # LINK entry: the inode holding content and attributes
    parent: int = 0  # directory
    first_child: int = 0  # directory
    symlink: bytes = b""  # symlink target
    user_data: bytes = b""
    content_type: int = NO_CONTENT_TYPE  # file: index into ``types`` (version 2)

    @property
    def kind(self) -> int:
        return statmod.S_IFMT(self.mode)

    @property
    def is_dir(self) -> bool:
        return statmod.S_IFMT(self.mode) == KIND_DIR

    @property
    def is_file(self) -> bool:
        return statmod.S_IFMT(self.mode) == KIND_FILE

    @property
    def is_symlink(self) -> bool:
        return statmod.S_IFMT(self.mode) == KIND_SYMLINK

    @property
    def is_link(self) -> bool:
        return bool(self.flags & FLAG_LINK)

    @property
    def blocks(self) -> int:
        """``st_blocks``: 512-byte units of a file's content (nothing is allocated for others)."""
        return (self.size + 511) // 512 if self.is_file else 0

    @property
    def child_count(self) -> int:
        return self.size if self.is_dir else 0


_DOTS = (b".", b"..")


def validate_name(name: bytes) -> None:
    if not name or len(name) > MAX_NAME or b"/" in name or b"\0" in name or name in _DOTS:
        raise FormatError(f"invalid entry name {name!r}")


def encode_entry(e: Entry, version: int = FORMAT_VERSION) -> bytes:
    """Encode an entry value (the key is ``entry_key(e.ino)``) in ``version``'s layout."""
    if version >= 3:
        return _encode_entry_v3(e)
    return _encode_entry_v2(e)


def _encode_entry_v2(e: Entry) -> bytes:
    flags = e.flags & FLAG_LINK
    kind = e.kind
    if kind == KIND_FILE:
        if e.is_link:
            middle = _LINK.pack(e.target)
        else:
            if not 0 <= e.shard < MAX_SHARDS or not 0 <= e.offset <= _LOCATION_MASK:
                raise FormatError("file location out of range")
            middle = _FILE.pack(e.shard << _LOCATION_SHIFT | e.offset, e.crc32c)
            if e.flags & FLAG_NLINK:
                flags |= FLAG_NLINK
                middle += _U32.pack(e.nlink)
            if e.content_type != NO_CONTENT_TYPE:
                if not 0 <= e.content_type < MAX_CONTENT_TYPES:
                    raise FormatError("content type index out of range")
                flags |= FLAG_CONTENT_TYPE
                middle += _U16.pack(e.content_type)
    elif kind == KIND_DIR:
        middle = _DIR.pack(e.parent, e.first_child, e.nlink)
    elif kind == KIND_SYMLINK:
        middle = e.symlink
    else:
        raise FormatError(f"cannot encode file type 0o{kind:o}")
    if e.user_data:
        flags |= FLAG_USER_DATA
        middle += _U16.pack(len(e.user_data)) + e.user_data
    if not -(2**63) <= e.mtime_ns < 2**63:
        raise FormatError(
            f"the mtime of {e.name.decode(errors='replace')!r} is outside what a bundle stores "
            "(nanoseconds in 64 bits: the years 1678 to 2262)"
        )
    return _HEADER.pack(e.mode, flags, e.owner, e.mtime_ns, e.size) + middle + e.name


_NAME_OFFSET = {KIND_DIR: _HEADER.size + _DIR.size}


def is_directory_value(data: bytes) -> bool:
    """Whether an (undecoded) entry value is a directory's: for scans that skip everything else."""
    return len(data) >= 2 and (data[0] << 8) & 0o170000 == KIND_DIR


def entry_name(data: bytes, version: int = FORMAT_VERSION) -> bytes:
    """Just the name of an entry value, without decoding or validating the rest.

    For binary search only: the entry finally chosen is decoded in full by ``decode_entry``.
    """
    if version >= 3:
        return _entry_name_v3(data)
    if len(data) < _HEADER.size:
        raise FormatError("entry is truncated")
    kind, flags = (data[0] << 8 | data[1]) & 0o170000, data[2]
    if kind == KIND_FILE:
        if flags & FLAG_LINK:
            pos = _HEADER.size + _LINK.size
        else:
            pos = (
                _HEADER.size
                + _FILE.size
                + (4 if flags & FLAG_NLINK else 0)
                + (2 if flags & FLAG_CONTENT_TYPE else 0)
            )
    elif kind == KIND_SYMLINK:
        pos = _HEADER.size + int.from_bytes(data[14:22], "big")
    else:
        pos = _NAME_OFFSET.get(kind, _HEADER.size)
    if flags & FLAG_USER_DATA:
        pos += 2 + int.from_bytes(data[pos : pos + 2], "big")
    return data[pos:]


def decode_entry(ino: int, data: bytes, version: int = FORMAT_VERSION) -> Entry:
    """Decode and validate an entry value of ``version``'s layout. The root (``ino == 1``) alone
    has an empty name."""
    try:
        if version >= 3:
            return _decode_entry_v3(ino, data)
        return _decode_entry_v2(ino, data, version)
    except struct.error:
        raise FormatError(f"entry {ino} is truncated") from None


# What follows an entry's common fields, by its kind: a file with content, a LINK entry, a
# directory, a symlink (whose target and the optional parts are not fixed-size).
_PART_FILE, _PART_LINK, _PART_DIR, _PART_SYMLINK = range(4)


def _part(ino: int, mode: int, flags: int) -> int:
    if flags & ~_KNOWN_ENTRY_FLAGS:
        raise FormatError(f"entry {ino} has unknown flags 0x{flags:x}")
    kind = mode & 0o170000
    if kind == KIND_FILE:
        return _PART_LINK if flags & FLAG_LINK else _PART_FILE
    if kind == KIND_DIR:
        part = _PART_DIR
    elif kind == KIND_SYMLINK:
        part = _PART_SYMLINK
    else:
        raise FormatError(f"entry {ino} has unsupported file type 0o{kind:o}")
    if flags & (FLAG_LINK | FLAG_NLINK):
        what = "directory" if part == _PART_DIR else "symlink"
        raise FormatError(f"entry {ino}: {what} with file-only flags")
    return part


def _decode_entry_v2(ino: int, data: bytes, version: int) -> Entry:
    mode, flags, owner, mtime_ns, size = _HEADER.unpack_from(data)
    if version == 1 and flags & FLAG_CONTENT_TYPE:
        raise FormatError(f"entry {ino} has a content type, which version 1 does not define")
    part = _part(ino, mode, flags)
    pos = _HEADER.size
    fixed: tuple[int, ...] = ()
    if part == _PART_FILE:
        location, crc = _FILE.unpack_from(data, pos)
        fixed = (location >> _LOCATION_SHIFT, location & _LOCATION_MASK, crc)
        pos += _FILE.size
    elif part == _PART_LINK:
        fixed = _LINK.unpack_from(data, pos)
        pos += _LINK.size
    elif part == _PART_DIR:
        fixed = _DIR.unpack_from(data, pos)
        pos += _DIR.size
    return _decode_rest(ino, data, pos, part, mode, flags, owner, mtime_ns, size, fixed)


def _decode_rest(
    ino: int,
    data: bytes,
    pos: int,
    part: int,
    mode: int,
    flags: int,
    owner: int,
    mtime_ns: int,
    size: int,
    fixed: tuple[int, ...],
) -> Entry:
    """Validate the kind-specific ``fixed`` fields, then read the optional parts and the name
    (the same in every version)."""
    n = len(data)
    shard = offset = crc = target = parent = first_child = 0
    nlink = 1
    symlink = user_data = b""
    content_type = NO_CONTENT_TYPE
    if flags & FLAG_CONTENT_TYPE and part != _PART_FILE:
        raise FormatError(f"entry {ino}: only a regular file (not a LINK) has a content type")
    if part == _PART_FILE:
        shard, offset, crc = fixed
        if offset + size > MAX_SHARD_STREAM:
            raise FormatError(f"entry {ino}: file extends past the shard stream limit")
        if flags & FLAG_NLINK:
            (nlink,) = _U32.unpack_from(data, pos)
            pos += 4
            if nlink < 1:
                raise FormatError(f"entry {ino}: nlink 0")
        if flags & FLAG_CONTENT_TYPE:
            (content_type,) = _U16.unpack_from(data, pos)
            pos += 2
    elif part == _PART_LINK:
        if flags & FLAG_NLINK:
            raise FormatError(f"entry {ino}: a LINK entry cannot carry NLINK")
        (target,) = fixed
    elif part == _PART_DIR:
        parent, first_child, nlink = fixed
        if size and first_child <= ino:
            raise FormatError(f"directory entry {ino}: children must follow their directory")
        if not size and first_child:
            raise FormatError(f"directory entry {ino}: first child without children")
        if size > MAX_ENTRIES or first_child + size - 1 > MAX_ENTRIES:
            raise FormatError(f"directory entry {ino}: child range out of bounds")
    else:
        if not 1 <= size <= MAX_SYMLINK_TARGET or pos + size > n:
            raise FormatError(f"symlink entry {ino}: target length {size} is invalid")
        symlink = data[pos : pos + size]
        if b"\0" in symlink:
            raise FormatError(f"symlink entry {ino}: target contains NUL")
        pos += size
    if flags & FLAG_USER_DATA:
        (length,) = _U16.unpack_from(data, pos)
        pos += 2
        if not 1 <= length <= MAX_USER_DATA or pos + length > n:
            raise FormatError(f"entry {ino}: user data length {length} is invalid")
        user_data = data[pos : pos + length]
        pos += length
    name = data[pos:]
    if ino == ROOT_INO:
        if name or part != _PART_DIR:
            raise FormatError("the root entry must be a nameless directory")
    else:
        validate_name(name)
    return Entry(
        ino, mode, owner, mtime_ns, size, name, flags, shard, offset, crc, nlink, target,
        parent, first_child, symlink, user_data, content_type,
    )  # fmt: skip


# -- version 3: the compact entry (docs/format.md §3.3) ------------------------------------------
# Mode, flags and a layout byte, then each field only as wide as its value needs: a small file's
# entry is 19 bytes before its name, not the 34 of versions 1 and 2 (index bytes per file:
# docs/scale.md).

LAYOUT_SIZE_WIDTH = 0x03  # size: u8, u16, u32 or u64
LAYOUT_MTIME_NS = 0x04  # mtime: i64 nanoseconds; clear: u32 whole seconds since the epoch
LAYOUT_OWNER = 0x08  # a u16 owner follows; clear: owner 0
LAYOUT_WIDE_SHARD = 0x10  # file location: u16 shard index; clear: u8
LAYOUT_WIDE_OFFSET = 0x20  # file location: u64 offset; clear: u32
_LAYOUT_FILE_ONLY = LAYOUT_WIDE_SHARD | LAYOUT_WIDE_OFFSET
_KNOWN_LAYOUT = LAYOUT_SIZE_WIDTH | LAYOUT_MTIME_NS | LAYOUT_OWNER | _LAYOUT_FILE_ONLY
_V3_PREFIX = struct.Struct(">HBB")  # mode, flags, layout
_V3_FIXED: dict[int, struct.Struct] = {}  # part << 8 | layout: at most 4 parts x 64 layouts
_DIR_LAYOUT = 2  # a directory's size (child count) is always u32: see _encode_entry_v3


def _v3_fixed(part: int, layout: int) -> struct.Struct:
    """The fields after the prefix: size, mtime, [owner], then the part's fixed fields."""
    fixed = _V3_FIXED.get(part << 8 | layout)  # an int key: ~0.1 µs less than a tuple
    if fixed is None:
        code = ">" + "BHIQ"[layout & LAYOUT_SIZE_WIDTH]
        code += "q" if layout & LAYOUT_MTIME_NS else "I"
        code += "H" if layout & LAYOUT_OWNER else ""
        if part == _PART_FILE:
            code += "H" if layout & LAYOUT_WIDE_SHARD else "B"
            code += "QI" if layout & LAYOUT_WIDE_OFFSET else "II"
        else:
            code += ("I", "III", "")[part - 1]
        fixed = _V3_FIXED[part << 8 | layout] = struct.Struct(code)
    return fixed


def _width_code(n: int) -> int:
    return 0 if n < 0x100 else 1 if n < 0x10000 else 2 if n < 2**32 else 3


def _encode_entry_v3(e: Entry) -> bytes:
    flags = e.flags & FLAG_LINK
    kind = e.kind
    seconds, nanos = divmod(e.mtime_ns, 1_000_000_000)
    if not nanos and 0 <= seconds < 2**32:
        layout, mtime = 0, seconds
    elif -(2**63) <= e.mtime_ns < 2**63:
        layout, mtime = LAYOUT_MTIME_NS, e.mtime_ns
    else:
        raise FormatError(
            f"the mtime of {e.name.decode(errors='replace')!r} is outside what a bundle stores "
            "(nanoseconds in 64 bits: the years 1678 to 2262)"
        )
    if not 0 <= e.size < 2**64:
        raise FormatError("entry size out of range")
    fields = [e.size, mtime]
    if e.owner:
        layout |= LAYOUT_OWNER
        fields.append(e.owner)
    tail = b""
    if kind == KIND_FILE and e.is_link:
        part = _PART_LINK
        fields.append(e.target)
    elif kind == KIND_FILE:
        part = _PART_FILE
        if not 0 <= e.shard < MAX_SHARDS or not 0 <= e.offset <= _LOCATION_MASK:
            raise FormatError("file location out of range")
        layout |= LAYOUT_WIDE_SHARD if e.shard > 0xFF else 0
        layout |= LAYOUT_WIDE_OFFSET if e.offset > 0xFFFFFFFF else 0
        fields += (e.shard, e.offset, e.crc32c)
        if e.flags & FLAG_NLINK:
            flags |= FLAG_NLINK
            tail += _U32.pack(e.nlink)
        if e.content_type != NO_CONTENT_TYPE:
            if not 0 <= e.content_type < MAX_CONTENT_TYPES:
                raise FormatError("content type index out of range")
            flags |= FLAG_CONTENT_TYPE
            tail += _U16.pack(e.content_type)
    elif kind == KIND_DIR:
        part = _PART_DIR
        fields += (e.parent, e.first_child, e.nlink)
    elif kind == KIND_SYMLINK:
        part = _PART_SYMLINK
        tail = e.symlink
    else:
        raise FormatError(f"cannot encode file type 0o{kind:o}")
    # The packer writes a directory before it has counted its children and rewrites it after;
    # a fixed-width count keeps the value's length, so the rewrite never splits a full page.
    layout |= _DIR_LAYOUT if part == _PART_DIR else _width_code(e.size)
    if e.user_data:
        flags |= FLAG_USER_DATA
        tail += _U16.pack(len(e.user_data)) + e.user_data
    return (
        _V3_PREFIX.pack(e.mode, flags, layout)
        + _v3_fixed(part, layout).pack(*fields)
        + tail
        + e.name
    )


def _decode_entry_v3(ino: int, data: bytes) -> Entry:
    mode, flags, layout = _V3_PREFIX.unpack_from(data)
    part = _part(ino, mode, flags)
    if layout & ~_KNOWN_LAYOUT or (layout & _LAYOUT_FILE_ONLY and part != _PART_FILE):
        raise FormatError(f"entry {ino} has an invalid layout 0x{layout:x}")
    fixed = _v3_fixed(part, layout)
    values = fixed.unpack_from(data, _V3_PREFIX.size)
    size, mtime = values[0], values[1]
    if not layout & LAYOUT_MTIME_NS:
        mtime *= 1_000_000_000
    owner = values[2] if layout & LAYOUT_OWNER else 0
    rest = values[3:] if layout & LAYOUT_OWNER else values[2:]
    pos = _V3_PREFIX.size + fixed.size
    return _decode_rest(ino, data, pos, part, mode, flags, owner, mtime, size, rest)


# Where the name starts, by (file type, flags, layout), for values whose name offset those fix
# (neither a symlink nor user data): a binary search reads ~17 names per lookup in a
# 100,000-entry directory, and the table takes entry_name from ~1.2 µs to ~0.4 µs (measured).
# Only valid flag and layout bits are kept, so it holds at most 3 x 16 x 64 items.
_NAME_AT: dict[int, int] = {}


def _entry_name_v3(data: bytes) -> bytes:
    if len(data) < _V3_PREFIX.size:
        raise FormatError("entry is truncated")
    key = (data[0] & 0xF0) << 16 | data[2] << 8 | data[3]
    pos = _NAME_AT.get(key)
    if pos is not None:
        return data[pos:]
    mode, flags, layout = _V3_PREFIX.unpack_from(data)
    kind = mode & 0o170000
    if kind == KIND_FILE:
        part = _PART_LINK if flags & FLAG_LINK else _PART_FILE
    else:
        part = _PART_DIR if kind == KIND_DIR else _PART_SYMLINK
    fixed = _v3_fixed(part, layout & _KNOWN_LAYOUT)
    pos = _V3_PREFIX.size + fixed.size
    if part == _PART_FILE:
        pos += (4 if flags & FLAG_NLINK else 0) + (2 if flags & FLAG_CONTENT_TYPE else 0)
    elif part == _PART_SYMLINK:
        try:
            pos += fixed.unpack_from(data, _V3_PREFIX.size)[0]
        except struct.error:
            raise FormatError("entry is truncated") from None
    if flags & FLAG_USER_DATA:
        pos += 2 + int.from_bytes(data[pos : pos + 2], "big")
    elif (
        part != _PART_SYMLINK
        and not flags & ~_KNOWN_ENTRY_FLAGS
        and not layout & ~_KNOWN_LAYOUT
        and kind in (KIND_FILE, KIND_DIR)
    ):
        _NAME_AT[key] = pos
    return data[pos:]


# --- records -------------------------------------------------------------------------------------

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


def encode_shard_info(s: ShardInfo, version: int = FORMAT_VERSION, index: int = 0) -> bytes:
    """The ``shards`` value of shard ``index``."""
    if version < 3:
        return _SHARD_INFO.pack(s.file_size, s.uncompressed_size, s.record_count)
    header_index = index if s.header_index is None else s.header_index
    return _SHARD_ENTRY.pack(
        s.file_size,
        s.uncompressed_size,
        s.record_count,
        s.codec,
        s.header_version,
        header_index,
        s.header_id,
    )


def decode_shard_info(data: bytes, version: int, index: int, config: Config) -> ShardInfo:
    """Decode shard ``index``'s descriptor; validated against ``config`` (its version's rules)."""
    if version < 3:
        if len(data) != _SHARD_INFO.size:
            raise FormatError(f"shard value of {len(data)} bytes, expected {_SHARD_INFO.size}")
        size, stream, records = _SHARD_INFO.unpack(data)
        info = ShardInfo(size, stream, records, config.record_codec, version, index)
    else:
        if len(data) != _SHARD_ENTRY.size:
            raise FormatError(f"shard value of {len(data)} bytes, expected {_SHARD_ENTRY.size}")
        size, stream, records, codec, header_version, header_index, header_id = _SHARD_ENTRY.unpack(
            data
        )
        if header_version not in SUPPORTED_VERSIONS or header_version > version:
            raise FormatError(f"shard {index}: header version {header_version} is not valid here")
        if codec not in _COMPRESSIONS_OF_VERSION[header_version]:
            raise FormatError(f"shard {index}: unknown compression code {codec}")
        if header_version == 1 and codec != COMPRESSION_LZ4:
            raise FormatError(f"shard {index}: a version 1 shard's records are lz4")
        if header_id == OWN_BUNDLE_ID and (header_version, header_index) != (version, index):
            raise FormatError(f"shard {index}: this bundle's own shard must carry its index")
        info = ShardInfo(size, stream, records, codec, header_version, header_index, header_id)
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
