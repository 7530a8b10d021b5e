"""Keys and small values: the LMDB keys of every database, shard file names, the version check,
metadata items, content types, directory totals and source records (docs/format.md §3).

May import: the standard library, ``bundlefs.errors``, ``bundlefs.core.format.constants``.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from bundlefs.core.format.constants import (
    FORMAT_VERSION,
    MAX_CONTENT_TYPE,
    MAX_META_KEY,
    MAX_META_VALUE,
    SHARD_PREFIX,
    SUPPORTED_VERSIONS,
)
from bundlefs.errors import FormatError, UnsupportedVersionError

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_RECORD_KEY = struct.Struct(">IQ")
_TOTALS = struct.Struct(">QQQQ")  # files, dirs, bytes, entries
TOTALS_SIZE = _TOTALS.size
_SOURCE = struct.Struct(">qQ")  # ctime_ns, st_ino


def entry_key(ino: int) -> bytes:
    return _U32.pack(ino)


def entry_keys(first: int, count: int) -> list[bytes]:
    """``entry_key`` of ``count`` inodes from ``first`` on, in one call."""
    return list(map(_U32.pack, range(first, first + count)))


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


# -- directory totals (version 5, docs/format.md §3.8) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class TreeTotals:
    """What lies below a directory: regular files (each inode once: ``LINK`` entries are not
    files), directories (itself excluded), the files' bytes, and entries of every kind."""

    files: int = 0
    dirs: int = 0
    bytes: int = 0
    entries: int = 0

    def __add__(self, other: TreeTotals) -> TreeTotals:
        return TreeTotals(
            self.files + other.files,
            self.dirs + other.dirs,
            self.bytes + other.bytes,
            self.entries + other.entries,
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "files": self.files,
            "dirs": self.dirs,
            "bytes": self.bytes,
            "entries": self.entries,
        }


def totals_key(ino: int) -> bytes:
    """A directory's key in ``totals``: its inode number, as in ``entries``."""
    return _U32.pack(ino)


def encode_totals(t: TreeTotals) -> bytes:
    try:
        return _TOTALS.pack(t.files, t.dirs, t.bytes, t.entries)
    except struct.error:
        raise FormatError(f"directory totals out of range: {t}") from None


def decode_totals(ino: int, data: bytes) -> TreeTotals:
    if len(data) != TOTALS_SIZE:
        raise FormatError(f"the totals of directory {ino} are {len(data)} bytes, not {TOTALS_SIZE}")
    return TreeTotals(*_TOTALS.unpack(data))


def encode_source(ctime_ns: int, st_ino: int) -> bytes:
    """A file's value in ``sources`` (version 6; its key is ``entry_key``): what its source's
    stat said when it was packed."""
    try:
        return _SOURCE.pack(ctime_ns, st_ino)
    except struct.error:
        raise FormatError(f"source stat out of range: ctime {ctime_ns}, inode {st_ino}") from None


def encode_sources(ctimes: list[int], inos: list[int]) -> list[bytes]:
    """``encode_source`` of each (ctime, inode) pair of ``ctimes`` and ``inos``, in one call."""
    try:
        return list(map(_SOURCE.pack, ctimes, inos))
    except struct.error:
        for ctime_ns, st_ino in zip(ctimes, inos, strict=True):
            encode_source(ctime_ns, st_ino)  # raises for the first out of range
        raise


def decode_source(ino: int, data: bytes) -> tuple[int, int]:
    """(ctime_ns, st_ino) of file ``ino``'s value in ``sources``."""
    if len(data) != _SOURCE.size:
        raise FormatError(f"the source record of inode {ino} is {len(data)} bytes, not 16")
    ctime_ns, st_ino = _SOURCE.unpack(data)
    return ctime_ns, st_ino
