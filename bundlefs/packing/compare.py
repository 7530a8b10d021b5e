"""Comparing a file of a pack's source with a base bundle's content of it (``delta``,
``delta_sink``): ``same_bytes`` (content read whole), ``same_stream`` (an open file, read to its
end or to the first difference) and ``same_chunks`` (a member as a streaming source yields it).
By the entry's digest where it has one (format version 5: OLD's bytes never read), else against
OLD's records, read through its ``ShardSet`` (CRC-checked, decompressed) a record at a time and
compared as SRC is read; a small file is compared by CRC32C first.

May import: ``bundlefs.core``, ``bundlefs.storage``, ``bundlefs.packing.options``,
``bundlefs.packing.sources``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

from bundlefs.core import format as fmt
from bundlefs.core.checksum import ContentDigest, crc32c
from bundlefs.packing.options import BaseReuse
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


def same_bytes(
    shards: ShardSet, reader: IndexReader, counts: BaseReuse, entry: fmt.Entry, data: bytes
) -> bool:
    """Whether ``data`` (read whole) is OLD's content of ``entry``: by its digest where OLD
    has one, else against OLD's bytes."""
    if len(data) != entry.size or crc32c(data) != entry.crc32c:
        return False
    if entry.digest:
        counts.digest_compared += 1
        return ContentDigest(data).digest() == entry.digest
    return _Comparer(stored_chunks(shards, reader, entry)).matches(data)


def same_stream(
    shards: ShardSet,
    reader: IndexReader,
    counts: BaseReuse,
    entry: fmt.Entry,
    content: Content,
    before: Stat,
) -> bool:
    """Whether the open file ``content`` holds OLD's content of ``entry`` (read to its end,
    or to the first difference) and did not change while it was read."""
    if before.st_size != entry.size:
        return False
    read = iter(functools.partial(content.read, READ_CHUNK), b"")
    if not same_chunks(shards, reader, counts, entry, read):
        return False
    after = content.stat()
    return (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def same_chunks(
    shards: ShardSet,
    reader: IndexReader,
    counts: BaseReuse,
    entry: fmt.Entry,
    chunks: Iterable[bytes],
) -> bool:
    """Whether ``chunks`` (taken to their end, or to the first difference) are OLD's content of
    ``entry``: by its digest where OLD has one, else against OLD's bytes as they come."""
    digest = ContentDigest() if entry.digest else None
    comparer = None
    if digest is None:
        comparer = _Comparer(stored_chunks(shards, reader, entry))
    crc = size = 0
    for chunk in chunks:
        if comparer is not None and not comparer.matches(chunk):
            return False
        if digest is not None:
            digest.update(chunk)
        crc = crc32c(chunk, crc)
        size += len(chunk)
        if size > entry.size:
            return False
    if digest is not None:
        counts.digest_compared += 1
        same = digest.digest() == entry.digest
    else:
        same = comparer is not None and comparer.done()
    return size == entry.size and crc == entry.crc32c and same


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
