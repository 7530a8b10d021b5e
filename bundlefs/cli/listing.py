"""Listings for programs: ``bundlefs ls --json`` (JSON Lines) and ``ls --csv``.

One row per entry, with what the index knows of it: the stat fields, the content type, and where a
file's bytes are stored (shard, offset in the shard's uncompressed stream, the stored offset of the
record holding its first byte in the shard file, CRC32C), so a script can plan a transfer or check
a copy without reading content. Paths are the entry's path below the root; a name that is not
UTF-8 is decoded as ``os.fsdecode`` does (surrogate escapes): JSON shows each such byte as
``\\udcXX`` (``os.fsencode`` gives the bytes back), CSV writes the bytes as they are.

May import: the library layers, ``bundlefs.cli.output``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import stat
from collections.abc import Callable
from typing import TYPE_CHECKING

from bundlefs.cli.output import out
from bundlefs.errors import BundleError

if TYPE_CHECKING:
    from bundlefs.core.format import Entry
    from bundlefs.read.bundle import Bundle

FIELDS = (
    "path",
    "type",
    "size",
    "mode",
    "nlink",
    "mtime_ns",
    "uid",
    "gid",
    "content_type",
    "shard",
    "offset",
    "stored_offset",
    "crc32c",
    "target",
    "digest",
)

_TYPES = {
    stat.S_IFREG: "file",
    stat.S_IFDIR: "dir",
    stat.S_IFLNK: "symlink",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "char",
    stat.S_IFBLK: "block",
}


def listing_row(bundle: Bundle, entry: Entry, path: bytes) -> dict[str, object]:
    """The fields of one entry; ``None`` where a field does not apply (a directory's shard)."""
    st = bundle.stat_entry(entry)
    row: dict[str, object] = {
        "path": os.fsdecode(path),
        "type": _TYPES.get(stat.S_IFMT(st.st_mode), "other"),
        "size": st.st_size,
        "mode": st.st_mode,
        "nlink": st.st_nlink,
        "mtime_ns": st.st_mtime_ns,
        "uid": st.st_uid,
        "gid": st.st_gid,
        "content_type": st.content_type,
        "shard": None,
        "offset": None,
        "stored_offset": None,
        "crc32c": None,
        "target": os.fsdecode(entry.symlink) if entry.is_symlink else None,
        "digest": st.digest.hex() if st.digest else None,  # format version 5
    }
    if entry.is_file:
        row.update(shard=entry.shard, offset=entry.offset, crc32c=entry.crc32c)
        if entry.size:  # an empty file has no record
            # A damaged record table: the listing still says the rest.
            with contextlib.suppress(BundleError):
                record = bundle.content.record_at(entry.shard, entry.offset)
                row["stored_offset"] = record.stored_offset
    return row


def listing_writer(bundle: Bundle, form: str) -> Callable[[Entry, bytes], None]:
    """A function writing one entry's row to stdout as ``form`` (``json`` or ``csv``); CSV's
    header row is written now."""
    if form == "json":

        def write_json(entry: Entry, path: bytes) -> None:
            out(json.dumps(listing_row(bundle, entry, path), separators=(",", ":")))

        return write_json

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")

    def write_csv_line(cells: list[object]) -> None:
        writer.writerow(cells)
        out(os.fsencode(buffer.getvalue()), end=b"")  # surrogate escapes back to their bytes
        buffer.seek(0)
        buffer.truncate()

    write_csv_line(list(FIELDS))

    def write_csv(entry: Entry, path: bytes) -> None:
        row = listing_row(bundle, entry, path)
        write_csv_line(["" if row[f] is None else row[f] for f in FIELDS])

    return write_csv
