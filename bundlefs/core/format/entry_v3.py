"""The compact entry layout of versions 3 to 6 (docs/format.md §3.3.1): mode, flags and a layout
byte, then each field only as wide as its value needs. A small file's entry is 19 bytes before its
name, not the 34 of versions 1 and 2 (index bytes per file: docs/scale.md). Version 4 adds the
special files (§3.3.2), version 5 the 16-byte ``DIGEST`` part of a regular file (§3.3: 35 bytes
before the name); nothing else changed (version 6 neither).

May import: the standard library, ``bundlefs.errors``, ``bundlefs.core.format.constants``,
``bundlefs.core.format.keys``, ``bundlefs.core.format.entry``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator

from bundlefs.core.format.constants import (
    _KNOWN_ENTRY_FLAGS,
    DEVICE_KINDS,
    DIGEST_SIZE,
    FIRST_SPECIAL_VERSION,
    FLAG_CONTENT_TYPE,
    FLAG_DIGEST,
    FLAG_LINK,
    FLAG_NLINK,
    FLAG_USER_DATA,
    KIND_DIR,
    KIND_FILE,
    KIND_SYMLINK,
    MAX_SHARD_STREAM,
    MAX_SHARDS,
    NO_CONTENT_TYPE,
    SPECIAL_KINDS,
)
from bundlefs.core.format.entry import (
    _LOCATION_MASK,
    _PART_DEVICE,
    _PART_DIR,
    _PART_FILE,
    _PART_LINK,
    _PART_SPECIAL,
    _PART_SYMLINK,
    Entry,
    _check_location,
    _check_mtime,
    _decode_rest,
    _device_numbers,
    _digest_part,
    _file_tail,
    _part,
)
from bundlefs.core.format.keys import _U16
from bundlefs.errors import FormatError

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
            code += ("I", "III", "", "", "II")[part - 1]
        fixed = _V3_FIXED[part << 8 | layout] = struct.Struct(code)
    return fixed


def _width_code(n: int) -> int:
    return 0 if n < 0x100 else 1 if n < 0x10000 else 2 if n < 2**32 else 3


def _encode_entry_v3(e: Entry, version: int) -> bytes:
    flags = e.flags & FLAG_LINK
    kind = e.kind
    seconds, nanos = divmod(e.mtime_ns, 1_000_000_000)
    if not nanos and 0 <= seconds < 2**32:
        layout, mtime = 0, seconds
    else:
        _check_mtime(e)
        layout, mtime = LAYOUT_MTIME_NS, e.mtime_ns
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
        _check_location(e)
        layout |= LAYOUT_WIDE_SHARD if e.shard > 0xFF else 0
        layout |= LAYOUT_WIDE_OFFSET if e.offset > 0xFFFFFFFF else 0
        fields += (e.shard, e.offset, e.crc32c)
        file_flags, tail = _file_tail(e)
        flags |= file_flags
    elif kind == KIND_DIR:
        part = _PART_DIR
        fields += (e.parent, e.first_child, e.nlink)
    elif kind == KIND_SYMLINK:
        part = _PART_SYMLINK
        tail = e.symlink
    elif kind in SPECIAL_KINDS and version >= FIRST_SPECIAL_VERSION:
        part = _PART_DEVICE if kind in DEVICE_KINDS else _PART_SPECIAL
        if e.size:
            raise FormatError(f"special file {e.name.decode(errors='replace')!r} has a size")
        fields += _device_numbers(e)
    else:
        raise FormatError(f"format version {version} cannot encode file type 0o{kind:o}")
    # The packer writes a directory before it has counted its children and rewrites it after;
    # a fixed-width count keeps the value's length, so the rewrite never splits a full page.
    layout |= _DIR_LAYOUT if part == _PART_DIR else _width_code(e.size)
    if e.user_data:
        flags |= FLAG_USER_DATA
        tail += _U16.pack(len(e.user_data)) + e.user_data
    digest_flag, digest = _digest_part(e, version)
    flags |= digest_flag
    return (
        _V3_PREFIX.pack(e.mode, flags, layout)
        + _v3_fixed(part, layout).pack(*fields)
        + tail
        + digest
        + e.name
    )


def _decode_entry_v3(ino: int, data: bytes, version: int) -> Entry:
    mode, flags, layout = _V3_PREFIX.unpack_from(data)
    part = _part(ino, mode, flags, version)
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


_COPYABLE_FLAGS = FLAG_CONTENT_TYPE | FLAG_DIGEST
_SIZE_RANGES = ((0, 0x100), (0x100, 0x10000), (0x10000, 2**32), (2**32, 2**64))
_WHOLE_SECONDS_END = 2**32 * 1_000_000_000  # an mtime in whole seconds below this is a u32
# What reusable_file needs to know of a (flags, layout): the fixed fields, the owner's place in
# them (0: none), the narrowest size width's range, the content type's place (0: none), where
# the name starts, and whether the mtime is in nanoseconds and the location wide. None: no.
_REUSABLE: dict[int, tuple | None] = {}


def _reusable_spec(flags: int, layout: int) -> tuple | None:
    if flags & ~_COPYABLE_FLAGS or layout & ~_KNOWN_LAYOUT:
        return None
    fixed = _v3_fixed(_PART_FILE, layout)
    pos = _V3_PREFIX.size + fixed.size
    content_type_at = pos if flags & FLAG_CONTENT_TYPE else 0
    name_at = pos + (2 if flags & FLAG_CONTENT_TYPE else 0)
    name_at += DIGEST_SIZE if flags & FLAG_DIGEST else 0
    low, high = _SIZE_RANGES[layout & LAYOUT_SIZE_WIDTH]
    return (
        fixed,
        2 if layout & LAYOUT_OWNER else 0,
        low,
        high,
        content_type_at,
        name_at,
        bool(layout & LAYOUT_MTIME_NS),
        bool(layout & LAYOUT_WIDE_SHARD),
        bool(layout & LAYOUT_WIDE_OFFSET),
    )


def reusable_file(data: bytes) -> tuple[int, int, int, int, int, int, bytes] | None:
    """(mode, size, mtime_ns, owner, shard, content_type, name) of a plain regular file's value
    in the layout of versions 3 to 6 that ``_encode_entry_v3`` would write back byte for byte
    from its fields (widths the narrowest, flags only CONTENT_TYPE and DIGEST, content and a
    name): what a pack on a base copies for a file that did not change instead of decoding and
    encoding it (``packing.delta``, which takes the name from here too: one parse per entry of
    its base). None for any other value: decode that in full."""
    if len(data) < _V3_PREFIX.size or data[0] & 0xF0 != KIND_FILE >> 8:
        return None
    key = data[2] << 8 | data[3]
    try:
        spec = _REUSABLE[key]
    except KeyError:
        spec = _REUSABLE[key] = _reusable_spec(data[2], data[3])
    if spec is None:
        return None
    fixed, owner_at, low, high, content_type_at, name_at, in_ns, wide_shard, wide_offset = spec
    if len(data) <= name_at:
        return None  # truncated, or no name
    values = fixed.unpack_from(data, _V3_PREFIX.size)
    size, mtime, shard, offset = values[0], values[1], values[-3], values[-2]
    if in_ns:
        if not mtime % 1_000_000_000 and 0 <= mtime < _WHOLE_SECONDS_END:
            return None  # whole seconds in range: the encoder writes a u32
    else:
        mtime *= 1_000_000_000
    owner = values[owner_at] if owner_at else 0
    if (
        not low <= size < high
        or (owner_at and not owner)
        or (wide_shard and shard <= 0xFF)
        or (wide_offset and offset <= 0xFFFFFFFF)
        or offset + size > MAX_SHARD_STREAM
    ):
        return None
    content_type = NO_CONTENT_TYPE
    if content_type_at:
        content_type = data[content_type_at] << 8 | data[content_type_at + 1]
    return data[0] << 8 | data[1], size, mtime, owner, shard, content_type, data[name_at:]


# Where the name starts, by (file type, flags, layout), for values whose name offset those fix
# (neither a symlink nor user data): a binary search reads ~17 names per lookup in a
# 100,000-entry directory, and the table takes entry_name from ~1.2 µs to ~0.4 µs (measured).
# Only valid flag and layout bits are kept, so it holds at most 7 x 32 x 64 items.
_NAME_AT: dict[int, int] = {}
_PART_OF_KIND = {
    KIND_DIR: _PART_DIR,
    **{kind: _PART_DEVICE if kind in DEVICE_KINDS else _PART_SPECIAL for kind in SPECIAL_KINDS},
}


def _file_location_v3(data: bytes) -> tuple[int, int] | None:
    """(shard, offset) of a plain file's value, nothing else decoded or checked; None for any
    other entry (a LINK entry too) or a value this cannot read: decode those in full."""
    if len(data) < _V3_PREFIX.size:
        return None
    mode, flags, layout = _V3_PREFIX.unpack_from(data)
    if mode & 0o170000 != KIND_FILE or flags & FLAG_LINK or layout & ~_KNOWN_LAYOUT:
        return None
    fixed = _v3_fixed(_PART_FILE, layout)
    if len(data) < _V3_PREFIX.size + fixed.size:
        return None
    values = fixed.unpack_from(data, _V3_PREFIX.size)
    at = 3 if layout & LAYOUT_OWNER else 2  # after size, mtime and the owner
    return values[at], values[at + 1]


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
        part = _PART_OF_KIND.get(kind, _PART_SYMLINK)
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
    if flags & FLAG_DIGEST:  # after the user data, right before the name
        pos += DIGEST_SIZE
    if (
        not flags & FLAG_USER_DATA
        and part != _PART_SYMLINK
        and not flags & ~_KNOWN_ENTRY_FLAGS
        and not layout & ~_KNOWN_LAYOUT
        and (kind in (KIND_FILE, KIND_DIR) or kind in SPECIAL_KINDS)
    ):
        _NAME_AT[key] = pos
    return data[pos:]


# Where a file's location (shard, offset) lies, by layout: (start, end), after the prefix, size,
# mtime and owner. At most 64 layouts.
_LOCATION_AT: dict[int, tuple[int, int]] = {}


def _location_span_v3(data: bytes) -> tuple[int, int] | None:
    if len(data) < _V3_PREFIX.size or data[0] & 0xF0 != KIND_FILE >> 8 or data[2] & FLAG_LINK:
        return None
    layout = data[3]
    span = _LOCATION_AT.get(layout)
    if span is None:
        if layout & ~_KNOWN_LAYOUT:
            return None
        start = _V3_PREFIX.size + (1, 2, 4, 8)[layout & LAYOUT_SIZE_WIDTH]
        start += (8 if layout & LAYOUT_MTIME_NS else 4) + (2 if layout & LAYOUT_OWNER else 0)
        end = start + (2 if layout & LAYOUT_WIDE_SHARD else 1)
        end += 8 if layout & LAYOUT_WIDE_OFFSET else 4
        span = _LOCATION_AT[layout] = (start, end)
    return span


def _file_fixed(layout: int) -> struct.Struct:
    """A regular file's fixed fields of ``layout`` (``_v3_fixed`` caches them), for the scans
    below that read them straight from the value; ``FormatError`` for an unknown layout bit."""
    if layout & ~_KNOWN_LAYOUT:
        raise FormatError(f"entry has an invalid layout 0x{layout:x}")
    return _v3_fixed(_PART_FILE, layout)


def _file_extents_v3(values: Iterable[bytes]) -> Iterator[tuple[int, int, int]]:
    """(shard, offset, size) of every value that is a regular file holding its content (not a
    ``LINK``), the others skipped; only the fixed fields are read, in one loop (a full decode
    is several times slower)."""
    for data in values:
        if data[0] & 0xF0 != KIND_FILE >> 8 or data[2] & FLAG_LINK:
            continue
        found = _file_fixed(data[3]).unpack_from(data, _V3_PREFIX.size)
        yield found[-3], found[-2], found[0]


def _relocate_files_v3(
    values: Iterable[bytes], where: Callable[[int, int, int], tuple[int, int]]
) -> Iterator[bytes]:
    """Each value as it is, but a regular file holding content (not a ``LINK``) whose (shard,
    offset, size) ``where`` moves to (shard, offset): its location rewritten, the widths following
    the new values, every other byte unchanged (compaction moves content, nothing else)."""
    for data in values:
        if data[0] & 0xF0 != KIND_FILE >> 8 or data[2] & FLAG_LINK:
            yield data
            continue
        layout = data[3]
        unpack = _file_fixed(layout)
        found = list(unpack.unpack_from(data, _V3_PREFIX.size))
        shard, offset = found[-3], found[-2] = where(found[-3], found[-2], found[0])
        if not 0 <= shard < MAX_SHARDS or not 0 <= offset <= _LOCATION_MASK:
            raise FormatError("file location out of range")
        new = layout & ~_LAYOUT_FILE_ONLY
        new |= (LAYOUT_WIDE_SHARD if shard > 0xFF else 0) | (
            LAYOUT_WIDE_OFFSET if offset > 0xFFFFFFFF else 0
        )
        pack = _v3_fixed(_PART_FILE, new)
        yield b"".join(
            (
                data[:2],
                bytes((data[2], new)),
                pack.pack(*found),
                data[_V3_PREFIX.size + unpack.size :],
            )
        )
