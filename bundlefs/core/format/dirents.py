"""Name and mode of entry values without decoding them whole (versions 3 and later): what a
plain directory listing (FUSE READDIR) needs of a directory's children. A full decode costs
~4–5 µs an entry in Python; a directory whose children share one mode and layout (the usual
case) is read here with one slice an entry.

May import: the standard library, ``bundlefs.errors``, ``bundlefs.core.format.constants``,
``bundlefs.core.format.entry_v3``.
"""

from __future__ import annotations

import contextlib
import operator

from bundlefs.core.format.constants import FLAG_LINK, KIND_DIR
from bundlefs.core.format.entry_v3 import _NAME_AT, _entry_name_v3
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
