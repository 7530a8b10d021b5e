"""The entry layout of versions 1 and 2 (docs/format.md §3.3, "Versions 1 and 2"): a fixed
22-byte header, the kind's fixed fields, then the optional parts and the name. Read for old
bundles; written only for ``version < 3``.

May import: the standard library, ``bundlefs.errors``, ``bundlefs.core.format.constants``,
``bundlefs.core.format.keys``, ``bundlefs.core.format.entry``.
"""

from __future__ import annotations

import struct

from bundlefs.core.format.constants import (
    FLAG_CONTENT_TYPE,
    FLAG_LINK,
    FLAG_NLINK,
    FLAG_USER_DATA,
    KIND_DIR,
    KIND_FILE,
    KIND_SYMLINK,
)
from bundlefs.core.format.entry import (
    _LOCATION_MASK,
    _LOCATION_SHIFT,
    _PART_DIR,
    _PART_FILE,
    _PART_LINK,
    Entry,
    _check_location,
    _check_mtime,
    _decode_rest,
    _file_tail,
    _part,
)
from bundlefs.core.format.keys import _U16
from bundlefs.errors import FormatError

_HEADER = struct.Struct(">HBxHqQ")  # mode, flags, owner, mtime_ns, size: 22 bytes
_FILE = struct.Struct(">QI")  # location, crc32c
_DIR = struct.Struct(">III")  # parent, first_child, nlink
_LINK = struct.Struct(">I")  # target


def _encode_entry_v2(e: Entry) -> bytes:
    flags = e.flags & FLAG_LINK
    kind = e.kind
    if kind == KIND_FILE:
        if e.is_link:
            middle = _LINK.pack(e.target)
        else:
            _check_location(e)
            file_flags, tail = _file_tail(e)
            flags |= file_flags
            middle = _FILE.pack(e.shard << _LOCATION_SHIFT | e.offset, e.crc32c) + tail
    elif kind == KIND_DIR:
        middle = _DIR.pack(e.parent, e.first_child, e.nlink)
    elif kind == KIND_SYMLINK:
        middle = e.symlink
    else:
        raise FormatError(f"cannot encode file type 0o{kind:o}")
    if e.user_data:
        flags |= FLAG_USER_DATA
        middle += _U16.pack(len(e.user_data)) + e.user_data
    if e.digest:
        raise FormatError("versions 1 and 2 store no digest")
    _check_mtime(e)
    return _HEADER.pack(e.mode, flags, e.owner, e.mtime_ns, e.size) + middle + e.name


_NAME_OFFSET = {KIND_DIR: _HEADER.size + _DIR.size}


def _entry_name_v2(data: bytes) -> bytes:
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


def _decode_entry_v2(ino: int, data: bytes, version: int) -> Entry:
    mode, flags, owner, mtime_ns, size = _HEADER.unpack_from(data)
    if version == 1 and flags & FLAG_CONTENT_TYPE:
        raise FormatError(f"entry {ino} has a content type, which version 1 does not define")
    part = _part(ino, mode, flags, version)
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


_LOCATION_SPAN = (_HEADER.size, _HEADER.size + 8)  # a file's u64 location follows the header


def _location_span_v2(data: bytes) -> tuple[int, int] | None:
    if len(data) < _HEADER.size or data[0] & 0xF0 != KIND_FILE >> 8 or data[2] & FLAG_LINK:
        return None
    return _LOCATION_SPAN


def _file_extent_v2(data: bytes) -> tuple[int, int, int] | None:
    """(shard, offset, size) of a regular file's value that is not a ``LINK``; None otherwise."""
    if len(data) < _HEADER.size or (data[0] << 8) & 0o170000 != KIND_FILE or data[2] & FLAG_LINK:
        return None
    size = _HEADER.unpack_from(data)[4]
    location = _FILE.unpack_from(data, _HEADER.size)[0]
    return location >> _LOCATION_SHIFT, location & _LOCATION_MASK, size
