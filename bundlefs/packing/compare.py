"""Comparing a file of a pack's source with a base bundle's stored bytes of it (``delta``):
``same_bytes`` (content read whole) and ``same_stream`` (an open file, read to its end or to the
first difference). OLD's records are read through its ``ShardSet`` (CRC-checked, decompressed) a
record at a time, and compared as SRC is read; a small file is compared by CRC32C first.

May import: ``bundlefs.core``, ``bundlefs.storage``, ``bundlefs.packing.sources``.
"""

from __future__ import annotations

from collections.abc import Iterator

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.packing.sources.base import READ_CHUNK, Content, Stat
from bundlefs.storage.index import IndexReader
from bundlefs.storage.shards import ShardSet


def stored_chunks(shards: ShardSet, reader: IndexReader, entry: fmt.Entry) -> Iterator[bytes]:
    """OLD's bytes of the file ``entry``, record by record (each record CRC-checked)."""
    offset, end = entry.offset, entry.offset + entry.size
    while offset < end:
        record = reader.record_at(entry.shard, offset)
        data = shards.load(record)
        yield data[offset - record.offset : min(end, record.end) - record.offset]
        offset = record.end


def same_bytes(shards: ShardSet, reader: IndexReader, entry: fmt.Entry, data: bytes) -> bool:
    """Whether ``data`` (read whole) is OLD's content of ``entry``."""
    if len(data) != entry.size or crc32c(data) != entry.crc32c:
        return False
    return _Comparer(stored_chunks(shards, reader, entry)).matches(data)


def same_stream(
    shards: ShardSet, reader: IndexReader, entry: fmt.Entry, content: Content, before: Stat
) -> bool:
    """Whether the open file ``content`` holds OLD's content of ``entry`` (read to its end,
    or to the first difference) and did not change while it was read."""
    if before.st_size != entry.size:
        return False
    comparer = _Comparer(stored_chunks(shards, reader, entry))
    crc = size = 0
    while chunk := content.read(READ_CHUNK):
        if not comparer.matches(chunk):
            return False
        crc = crc32c(chunk, crc)
        size += len(chunk)
    after = content.stat()
    unchanged = (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    return unchanged and size == entry.size and crc == entry.crc32c and comparer.done()


class _Comparer:
    """Compares a stream, chunk by chunk, with OLD's chunks of the same bytes."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._pending = memoryview(b"")

    def matches(self, chunk: bytes) -> bool:
        want = len(chunk)
        pos = 0
        while pos < want:
            if not self._pending:
                nxt = next(self._chunks, None)
                if nxt is None:
                    return False  # SRC is longer
                self._pending = memoryview(nxt)
            take = min(want - pos, len(self._pending))
            if self._pending[:take] != chunk[pos : pos + take]:
                return False
            self._pending = self._pending[take:]
            pos += take
        return True

    def done(self) -> bool:
        return not self._pending and next(self._chunks, None) is None
