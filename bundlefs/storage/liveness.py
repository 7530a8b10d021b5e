"""Which stored records a bundle's files still use: ``shard_liveness`` and its sum, ``Liveness``.

A record is **live** when at least one regular file of the bundle has a byte in it (its range
``offset … offset+size−1`` of the shard's stream overlaps the record's); every other record is
**dead**: bytes a bundle carries because it reuses shard files other bundles wrote (a ``merge``
whose clash rule hid files, a pack on a base whose files changed). Liveness is per record: a
record shared by a live file and a removed one is live, and so are all of its stored bytes.

Computed from the index alone, in one pass over the records (their stream offsets and stored
sizes, a few bytes per record) and one over the entries (each file's location, read without
decoding the rest, ``fmt.file_extents``): memory is O(records), never O(files), and no shard is
read. A shard's **live bytes** are the block-padded stored bytes of its live records plus its
header block when any record is live, so a shard every record of which is live has no dead byte
and one with none is dead whole. ``info --dead`` shows the sum, ``compact`` plans by the shards.

``SharedContent``, filled in the same pass when asked (``info --dead``): the files whose bytes an
earlier file has (same shard and offset: whole-file dedup, docs/format.md §3.3), and their bytes,
what dedup saved. It keeps one int per non-empty file (~70 bytes each): O(files), opt-in.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage.index``.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from bundlefs.core import format as fmt
from bundlefs.errors import FormatError
from bundlefs.storage.index import IndexReader

DEFAULT_MIN_LIVE = 0.5  # a shard less live than this is "sparse": compact rewrites it


@dataclass(slots=True)
class ShardLiveness:
    """One shard's records in stream order (their stream offsets and block-padded stored sizes)
    and, per record, whether a file uses it (``live``) and whether a file runs into it from the
    record before (``joined``: the two must stay adjacent in any stream they are copied to)."""

    shard: int
    file_size: int
    stream_size: int  # its uncompressed stream's length (the unit of ``pack --shard-size``)
    codec: int
    starts: array  # "Q": each record's offset in the shard's uncompressed stream
    stored: array  # "Q": each record's stored bytes, padded to the block size
    live: bytearray
    joined: bytearray

    @property
    def live_bytes(self) -> int:
        """The header block and the live records' stored blocks; 0 if no record is live."""
        used = sum(size for size, live in zip(self.stored, self.live, strict=True) if live)
        return self.file_size - sum(self.stored) + used if any(self.live) else 0

    @property
    def live_fraction(self) -> float:
        return self.live_bytes / self.file_size if self.file_size else 1.0

    @property
    def live_records(self) -> int:
        return sum(self.live)


@dataclass(slots=True)
class SharedContent:
    """Files at the same bytes as an earlier file (inode order), counted with their sizes."""

    files: int = 0
    bytes: int = 0
    seen: set[int] = field(default_factory=set)  # shard << 48 | offset of each file met

    def add(self, shard: int, offset: int, size: int) -> None:
        key = shard << 48 | offset
        if key in self.seen:
            self.files += 1
            self.bytes += size
        else:
            self.seen.add(key)


def shard_liveness(index: IndexReader, shared: SharedContent | None = None) -> list[ShardLiveness]:
    """Every shard of the bundle ``index`` with its records' liveness (and ``shared`` filled,
    when given); ``FormatError`` for a file that names a shard the bundle does not have."""
    block = index.config.block_size
    shards = []
    for shard in range(index.config.shard_count):
        info = index.shard_info(shard)
        starts, stored = array("Q"), array("Q")
        for record in index.iter_records(shard):
            starts.append(record.offset)
            stored.append(fmt.pad_to(record.stored_length, block))
        count = len(starts)
        shards.append(
            ShardLiveness(
                shard,
                info.file_size,
                info.uncompressed_size,
                info.codec,
                starts,
                stored,
                bytearray(count),
                bytearray(count),
            )
        )
    # Files are in inode order, which is mostly stream order: a file inside the record the last
    # one ended in is skipped without a search.
    last, low, high = -1, 0, 0
    for shard, offset, size in fmt.file_extents(index.iter_values(), index.marker.format_version):
        if shared is not None and size:
            shared.add(shard, offset, size)
        if not size or (shard == last and low <= offset and offset + size <= high):
            continue  # an empty file has no byte in any record
        if shard >= len(shards):
            raise FormatError(f"a file names shard {shard}, which the bundle does not have")
        last, (low, high) = shard, _mark(shards[shard], offset, offset + size)
    return shards


def _mark(shard: ShardLiveness, start: int, end: int) -> tuple[int, int]:
    """Mark the records overlapping stream bytes ``start … end−1`` live, and joined after the
    first; returns the stream range of the last one (the whole stream past the last record)."""
    starts = shard.starts
    first = i = max(bisect.bisect_right(starts, start) - 1, 0)
    while i < len(starts) and starts[i] < end:
        shard.live[i] = 1
        if i > first:
            shard.joined[i] = 1
        i += 1
    if not starts:
        return 0, 0
    return starts[i - 1], starts[i] if i < len(starts) else fmt.MAX_SHARD_STREAM + 1


@dataclass(frozen=True, slots=True)
class Liveness:
    """A bundle's stored bytes split into live and dead (``info --dead``, docs/cli.md)."""

    stored_bytes: int  # the shard files' sizes, added up
    live_bytes: int
    records: int
    live_records: int
    shards: int
    sparse_shards: int  # shards whose live fraction is below ``min_live``
    dead_shards: int  # shards with no live record at all
    min_live: float
    shared_files: int = 0  # files at an earlier file's bytes (dedup), when counted
    shared_bytes: int = 0

    @property
    def dead_bytes(self) -> int:
        return self.stored_bytes - self.live_bytes

    @classmethod
    def of(
        cls,
        shards: Sequence[ShardLiveness],
        min_live: float = DEFAULT_MIN_LIVE,
        shared: SharedContent | None = None,
    ) -> Liveness:
        return cls(
            stored_bytes=sum(s.file_size for s in shards),
            live_bytes=sum(s.live_bytes for s in shards),
            records=sum(len(s.starts) for s in shards),
            live_records=sum(s.live_records for s in shards),
            shards=len(shards),
            sparse_shards=sum(1 for s in shards if s.live_fraction < min_live),
            dead_shards=sum(1 for s in shards if not any(s.live)),
            min_live=min_live,
            shared_files=shared.files if shared is not None else 0,
            shared_bytes=shared.bytes if shared is not None else 0,
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "live_bytes": self.live_bytes,
            "dead_bytes": self.dead_bytes,
            "live_records": self.live_records,
            "dead_records": self.records - self.live_records,
            "sparse_shards": self.sparse_shards,
            "dead_shards": self.dead_shards,
            "min_live": self.min_live,
            "shared_files": self.shared_files,
            "shared_bytes": self.shared_bytes,
        }
