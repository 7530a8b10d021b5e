"""Name and mode of entry values without decoding them whole (versions 3 and later): what a
plain directory listing (FUSE READDIR) needs of a directory's children. A full decode costs
~4–5 µs an entry in Python; a directory whose children share one mode and layout (the usual
case) is read here with one slice an entry.

``file_stats`` reads a plain file's attributes the same way (for a listing with attributes).

May import: the standard library, ``bundlefs.errors``, ``bundlefs.core.format.constants``,
``bundlefs.core.format.keys``, ``bundlefs.core.format.entry``, ``bundlefs.core.format.entry_v3``.
"""

from __future__ import annotations

import contextlib
import operator
import struct

from bundlefs.core.format.constants import (
    FIRST_V5_VERSION,
    FLAG_CONTENT_TYPE,
    FLAG_DIGEST,
    FLAG_LINK,
    FLAG_NLINK,
    KIND_DIR,
    KIND_FILE,
    MAX_SHARD_STREAM,
)
from bundlefs.core.format.entry import _PART_FILE
from bundlefs.core.format.entry_v3 import (
    _KNOWN_LAYOUT,
    _NAME_AT,
    _V3_PREFIX,
    LAYOUT_MTIME_NS,
    LAYOUT_OWNER,
    _entry_name_v3,
    _v3_fixed,
)
from bundlefs.core.format.keys import _U32
from bundlefs.errors import FormatError

_HEAD = operator.itemgetter(slice(0, 4))  # mode, flags, layout: what fixes where the name starts


def _dirent_head(head: bytes) -> tuple[int, int] | None:
    """(where the name starts, mode) for values beginning with ``head``, if that is known and
    the value is a plain or special file; None: decode those values in full."""
    if len(head) < 4 or head[2] & FLAG_LINK or head[0] & 0xF0 == KIND_DIR >> 8:
        return None
    pos = _NAME_AT.get((head[0] & 0xF0) << 16 | head[2] << 8 | head[3])
    return None if pos is None else (pos, head[0] << 8 | head[1])


def dirents(values: list[bytes]) -> tuple[list[bytes], list[int], list[int]]:
    """Name and mode of each entry value (versions 3 and later), nothing else decoded: what a
    plain directory listing needs, ~10× cheaper than decoding the entries.

    Only layouts ``_entry_name_v3`` has learnt (a regular or special file without user data,
    not a LINK entry) are read here; every other value (a directory, a LINK entry, a symlink, a
    value with user data or unknown bits) is left for a full decode: its index is in the third
    list, its name ``b""`` and its mode 0. Unvalidated: the caller checks the names.
    """
    heads = {head: _dirent_head(head) for head in set(map(_HEAD, values))}
    if len(heads) == 1:  # the usual directory: every child one mode and layout, read in one pass
        (spec,) = heads.values()
        if spec is not None:
            pos, mode = spec
            return [value[pos:] for value in values], [mode] * len(values), []
    names: list[bytes] = []
    modes: list[int] = []
    rest: list[int] = []
    for i, value in enumerate(values):
        spec = heads[value[:4]]
        if spec is None:
            if len(value) >= 4 and not _NAME_AT.get(
                (value[0] & 0xF0) << 16 | value[2] << 8 | value[3]
            ):
                with contextlib.suppress(FormatError):
                    _entry_name_v3(value)  # learns a file's layout for the next listing
            rest.append(i)
            names.append(b"")
            modes.append(0)
        else:
            names.append(value[spec[0] :])
            modes.append(spec[1])
    return names, modes, rest


def _stat_spec(head: bytes, version: int) -> tuple[struct.Struct, int, bool, int] | None:
    """How to read a plain file's attributes from values beginning with ``head``: (its fixed
    fields, the mtime's scale, whether an owner is stored, where NLINK is or 0); None: decode."""
    if len(head) < 4:
        return None
    mode, flags, layout = _V3_PREFIX.unpack(head)
    allowed = FLAG_NLINK | FLAG_CONTENT_TYPE | (FLAG_DIGEST if version >= FIRST_V5_VERSION else 0)
    if mode & 0o170000 != KIND_FILE or flags & ~allowed or layout & ~_KNOWN_LAYOUT:
        return None
    fixed = _v3_fixed(_PART_FILE, layout)
    scale = 1 if layout & LAYOUT_MTIME_NS else 1_000_000_000
    return fixed, scale, bool(layout & LAYOUT_OWNER), (4 + fixed.size if flags & FLAG_NLINK else 0)


def file_stats(values: list[bytes], version: int) -> list[tuple[int, int, int, int] | None]:
    """(size, mtime_ns, owner, nlink) of each value that is a plain file's (not a LINK entry, no
    user data), checked as its decode checks them but for the name and the owner's range; None
    for every other value (decode those in full). What a listing with attributes (READDIRPLUS)
    needs of a file, ~3× cheaper than its decode."""
    specs = {head: _stat_spec(head, version) for head in set(map(_HEAD, values))}
    out: list[tuple[int, int, int, int] | None] = []
    for value in values:
        spec = specs[value[:4]]
        if spec is None:
            out.append(None)
            continue
        fixed, scale, has_owner, nlink_at = spec
        try:
            fields = fixed.unpack_from(value, 4)
            nlink = _U32.unpack_from(value, nlink_at)[0] if nlink_at else 1
        except struct.error:
            out.append(None)
            continue
        size = fields[0]
        if fields[-2] + size > MAX_SHARD_STREAM or nlink < 1:  # (offset, crc32c) end the fields
            out.append(None)
            continue
        out.append((size, fields[1] * scale, fields[2] if has_owner else 0, nlink))
    return out
