"""Salvage: a damaged file's good bytes, record by record, and the ranges that were lost.

The default read of a file fails loudly on the first bad byte (``CorruptDataError``). Salvage is
the opt-in other way, for ``extract --salvage`` and ``cat --salvage`` (docs/reliability.md): a file
is read in pieces, each record checked by its own CRC, so damage costs the damaged records only.
``salvage_content`` yields the good bytes and a ``LostRange`` for each run of bad ones, in file
order; a writer leaves each lost range as a hole (``extract``) or writes zeros (``cat``).
``write_map`` writes what was lost as a ddrescue-style map.

An undamaged file costs one whole-file read (or one read per chunk for a large one), as the default
read does; only a chunk that fails is read again record by record.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.read.content``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.errors import CorruptDataError, FormatError, naming
from bundlefs.read.content import WHOLE_READ_LIMIT, ContentReader

_CHUNK = 4 * 1024 * 1024  # a large file is read (and held) this much at a time


@dataclass(frozen=True)
class LostRange:
    """Bytes ``offset … offset+length`` of the file at ``path`` could not be read: ``reason``."""

    path: str
    offset: int
    length: int
    reason: str

    def __str__(self) -> str:
        return (
            f"{self.path}: lost {self.length} bytes at offset {self.offset} "
            f"(through {self.offset + self.length - 1}): {self.reason}"
        )


def salvage_content(
    content: ContentReader, entry: fmt.Entry, path: str
) -> Iterator[bytes | LostRange]:
    """The file's good bytes (``bytes``) and its lost ranges (``LostRange``), in file order; their
    lengths add up to the file's size. A file that reads whole yields its bytes and nothing lost.

    Good bytes are those of records that pass their own CRC. If every record passes but the whole
    file fails its CRC (an index forged to disagree with its shards), no range can be named: then,
    after the bytes, ``CorruptDataError`` is raised, as a plain read of a large file does.
    """
    tried_whole = entry.size <= WHOLE_READ_LIMIT
    if tried_whole:
        try:
            yield bytes(content.read_at(entry, 0, entry.size, path=path))
            return
        except CorruptDataError:
            pass
    lost = False
    value = 0
    for pos in range(0, entry.size, _CHUNK):
        take = min(_CHUNK, entry.size - pos)
        piece = None
        if take < entry.size or not tried_whole:  # else this read just failed
            with contextlib.suppress(CorruptDataError):
                # not a whole-file read: each record is checked by its own CRC
                piece = bytes(content.read_at(entry, pos, take, path=path))
        if piece is not None:
            value = crc32c(piece, value)
            yield piece
            continue
        for part in _by_record(content, entry, path, pos, pos + take):
            if isinstance(part, LostRange):
                lost = True
            elif not lost:
                value = crc32c(part, value)
            yield part
    if not lost and entry.size and value != entry.crc32c:
        raise CorruptDataError(
            "file content fails its checksum, though each of its records passes its own",
            path=path,
            shard=entry.shard,
        )


def _by_record(
    content: ContentReader, entry: fmt.Entry, path: str, start: int, stop: int
) -> Iterator[bytes | LostRange]:
    """Bytes ``start … stop`` of the file record by record; neighbouring bad records are joined
    into one ``LostRange``."""
    pos = start
    bad_from, bad_reason = -1, ""
    while pos < stop:
        try:
            record = content.record_at(entry.shard, entry.offset + pos)
            take = min(stop - pos, record.end - entry.offset - pos)
        except FormatError as e:  # no record backs this byte: the rest of the range is lost
            record, take, error = None, stop - pos, str(e)
        if record is not None:
            try:
                piece = bytes(content.read_at(entry, pos, take, path=path))
            except CorruptDataError as e:
                error = _reason(e)
            else:
                if bad_from >= 0:
                    yield LostRange(path, bad_from, pos - bad_from, bad_reason)
                    bad_from = -1
                yield piece
                pos += take
                continue
        if bad_from < 0:
            bad_from, bad_reason = pos, error
        pos += take
    if bad_from >= 0:
        yield LostRange(path, bad_from, stop - bad_from, bad_reason)


def _reason(error: CorruptDataError) -> str:
    """What is wrong and where in the shards, without the bundle and file (the map names those)."""
    where = [f"shard {error.shard}"] if error.shard is not None else []
    if error.record is not None:
        where.append(f"record at stream offset {error.record}")
    return error.detail + (f" ({', '.join(where)})" if where else "")


def write_content(
    fd: int,
    content: ContentReader,
    entry: fmt.Entry,
    path: str,
    lost: list[LostRange] | None,
    dest: str,
) -> None:
    """Write the file's content at ``fd``. With ``lost`` (a list), salvage: good bytes written, a
    lost range stepped over (a hole, read as zeros) and added to ``lost``; without, the first bad
    byte raises ``CorruptDataError``. A write that fails without a file name (ENOSPC) is said with
    the file's name under ``dest``."""
    pieces: Iterable[bytes | LostRange] = (
        content.iter_content(entry, path) if lost is None else salvage_content(content, entry, path)
    )
    for piece in pieces:
        if isinstance(piece, LostRange):
            os.lseek(fd, piece.length, os.SEEK_CUR)
            assert lost is not None  # only salvage_content yields lost ranges
            lost.append(piece)
            continue
        view = memoryview(piece)
        with naming(os.path.join(dest, path)):
            while view:
                view = view[os.write(fd, view) :]
    os.ftruncate(fd, entry.size)  # a hole at the end too


MAP_HEADER = "# bundlefs salvage map: bytes that could not be read (offset and length in hex)\n"


def _escaped(path: str) -> bytes:
    r"""A path on one map line: ``\``, tab and newline escaped as ``\\``, ``\t``, ``\n``."""
    raw = os.fsencode(path)
    return raw.replace(b"\\", b"\\\\").replace(b"\t", b"\\t").replace(b"\n", b"\\n")


def write_map(target: str | os.PathLike, bundle: str, lost: Iterable[LostRange]) -> None:
    """Write ``lost`` as a ddrescue-style map, a line a range: ``0xOFFSET<TAB>0xLENGTH<TAB>PATH``
    (the path escaped, ``_escaped``), after comment lines naming the bundle."""
    lines = [MAP_HEADER.encode(), f"# bundle: {bundle}\n".encode(), b"# offset\tlength\tpath\n"]
    for r in lost:
        lines.append(b"0x%08X\t0x%08X\t%s\n" % (r.offset, r.length, _escaped(r.path)))
    with open(target, "wb") as f:
        f.writelines(lines)


def summary_line(lost: list[LostRange], files: int) -> str:
    """One line for a person: how much of how many files was lost."""
    if not lost:
        return "salvage: nothing was lost"
    damaged = len({r.path for r in lost})
    total = sum(r.length for r in lost)
    return (
        f"salvage: lost {total} bytes in {len(lost)} range{'s' * (len(lost) != 1)} of "
        f"{damaged} of {files} file{'s' * (files != 1)}"
    )
