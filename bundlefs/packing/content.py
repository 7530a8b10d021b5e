"""Writing file content into the shard stream: where shards are cut, and the records they make.

``ContentWriter`` appends each file's bytes to the current shard's uncompressed stream and
returns where they went, with their size, CRC32C and digest (format version 5) as read: a file
that changes while it is read is stored consistently and reported in ``changed``. It opens a new
``ShardWriter`` when the current one is full, and puts each shard's records into the index only
when that shard closes.

With ``dedup`` (``pack --dedup``) a file whose content equals a file stored earlier in the same
pack is not stored again: it gets the first copy's shard, offset, CRC and digest (an entry of its
own, docs/format.md §3.3). The digest is known before the bytes go in: a small file (read ahead
whole, or an archive member of at most ``DEDUP_BUFFER`` bytes) is hashed, then stored or not; a
streamed file is hashed first only when a file of its size was stored before (``DedupTable.sizes``,
the candidate filter), and read a second time to store it only when no copy matches, so a tree
without duplicates reads every byte once. Memory: ``DedupTable`` holds at most ``DEDUP_LIMIT``
digests (~135 bytes each: ~135 MB), the first ones stored; later contents are stored as they come.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``,
``bundlefs.packing.options``, ``bundlefs.packing.sources.base``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat as statmod
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass

from bundlefs.core import format as fmt
from bundlefs.core.checksum import ContentDigest, crc32c
from bundlefs.errors import PackError
from bundlefs.packing.options import PackProgress
from bundlefs.packing.sources.base import (
    EXACT_MTIME,
    HEAD_SIZE,
    READ_CHUNK,
    EntrySource,
    MtimeTick,
    ReadAgain,
    SourceErrors,
    SourceItem,
    Stat,
    StoredContent,
)
from bundlefs.storage.index_writer import IndexWriter
from bundlefs.storage.shard_writer import ShardWriter

log = logging.getLogger(__name__)

DEDUP_LIMIT = 1_000_000  # digests a pack remembers (~135 bytes each: a 16-byte key and an int)
DEDUP_BUFFER = 1024 * 1024  # an archive member up to this size is hashed before it is stored


class DedupTable:
    """Where each content went, by digest: 16-byte digest -> ``shard << 48 | offset``, at most
    ``limit`` of them (then new contents are no longer remembered); ``sizes``: the sizes of the
    streamed files stored, which say whether hashing a streamed file first may pay."""

    def __init__(self, limit: int = DEDUP_LIMIT) -> None:
        self.limit = limit
        self.places: dict[bytes, int] = {}
        self.sizes: set[int] = set()
        self.files = 0  # files that got an earlier file's content
        self.bytes = 0

    def find(self, digest: bytes) -> tuple[int, int] | None:
        place = self.places.get(digest)
        return None if place is None else (place >> 48, place & (1 << 48) - 1)

    def add(self, digest: bytes, shard: int, offset: int, size: int, streamed: bool) -> None:
        if len(self.places) < self.limit and digest not in self.places:
            self.places[digest] = shard << 48 | offset
            if streamed:
                self.sizes.add(size)


@dataclass(slots=True)
class _Written:
    """What has gone into the stream of the file being stored: its size, CRC, digest and first
    bytes."""

    digest: ContentDigest  # core.checksum.ContentDigest(), fed as the bytes go in
    size: int = 0
    crc: int = 0
    head: bytes = b""

    def take(self, chunk: bytes) -> None:
        if len(self.head) < HEAD_SIZE:
            self.head += chunk[: HEAD_SIZE - len(self.head)]
        self.crc = crc32c(chunk, self.crc)
        self.digest.update(chunk)
        self.size += len(chunk)


class ContentWriter:
    """Stores file content in shard order; ``finish`` closes the last shard, ``abort`` drops it."""

    def __init__(
        self,
        work: str,
        config: fmt.Config,
        index: IndexWriter,
        errors: SourceErrors,
        progress: PackProgress,
        *,
        shard_size: int,
        pool: Executor | None = None,
        tick: Callable[[], None] | None = None,
        level: int | None = None,
        first_shard: int = 0,
        dedup: bool = False,
    ) -> None:
        self.work = work
        self.config = config
        self.index = index
        self.errors = errors
        self.progress = progress
        self.shard_size = shard_size
        self.pool = pool  # compresses records; shared with the source's readers
        self.level = level  # the compressor's level, where it has one (zstd)
        self._tick = tick
        # The number of the first shard it writes: those before are a base's (packing/delta.py).
        self.first_shard = first_shard
        self.shards: list[fmt.ShardInfo] = []  # the closed shards
        self.shard: ShardWriter | None = None  # the one being written
        self.changed: list[str] = []  # files that changed while being read
        self.dedup = DedupTable() if dedup else None

    def store(self, item: SourceItem, source: EntrySource) -> StoredContent | None:
        """Copy a regular file's content into the current shard; None if it was skipped."""
        if item.data is not None:
            assert item.before is not None and item.after is not None  # read ahead: both taken
            return self._store_bytes(item.rel, item.data, item.before, item.after)
        if self.dedup is not None and item.st.st_size in self.dedup.sizes:
            earlier = self._earlier_stream(item, source)
            if earlier is not None:
                return earlier
        return self._store_content(item, source)

    def store_stream(
        self,
        rel: bytes,
        chunks: Iterable[bytes],
        st: Stat,
        *,
        sized: bool = True,
        tick: MtimeTick = EXACT_MTIME,
        again: ReadAgain | None = None,
    ) -> StoredContent:
        """Append a file's content as a source streams it (an archive member, in archive order).

        ``st`` is the member's status (its ``st_size`` places large files on record boundaries);
        what is stored is exactly the bytes ``chunks`` yields. Not ``sized``: ``st_size`` is only
        a guess made before reading (a stream the ``Writer`` reads once), not compared with what
        was read. ``tick`` and ``again`` are for a delta pack's sink (``ContentSink``): every
        byte is stored here, read once.
        """
        if self.dedup is not None and sized and st.st_size <= DEDUP_BUFFER:
            return self._store_bytes(rel, b"".join(chunks), st, st)  # hashed before it is stored
        shard = self._shard_for(st.st_size)
        offset = shard.stream_size
        written = _Written(ContentDigest())
        for chunk in chunks:
            self._append(shard, chunk, written)
        if not sized:  # a guess, not compared with what was read
            digest = written.digest.digest()
            return StoredContent(shard.index, offset, written.size, written.crc, st, written.head,
                                 digest=digest)  # fmt: skip
        return self._stored(rel, shard.index, offset, written, st, st, streamed=True)

    def _append(self, shard: ShardWriter, chunk: bytes, written: _Written) -> None:
        """One chunk of a file's content into the shard stream, counted."""
        shard.write(chunk)
        written.take(chunk)
        self._count(len(chunk))

    def _count(self, size: int) -> None:
        self.progress.bytes_read += size
        if self._tick is not None:
            self._tick()

    def _store_content(self, item: SourceItem, source: EntrySource) -> StoredContent | None:
        """What is stored is exactly the bytes read, with their own size and CRC."""
        rel = item.rel
        try:
            content = source.open(item)
        except OSError as e:
            self.errors.report(rel, e)
            return None
        try:
            before = content.stat()
            if not statmod.S_ISREG(before.st_mode):
                self.errors.report(rel, OSError(errno.EINVAL, "no longer a regular file"))
                return None
            shard = self._shard_for(before.st_size)
            offset = shard.stream_size
            written = _Written(ContentDigest())
            while True:
                try:
                    chunk = content.read(READ_CHUNK)
                except OSError as e:
                    # Skipped with skip_errors like any unreadable file; the bytes already in the
                    # shard stream belong to no entry, which readers never notice.
                    self.errors.report(rel, e)
                    return None
                if not chunk:
                    break
                self._append(shard, chunk, written)
            after = content.stat()
        finally:
            content.close()
        return self._stored(rel, shard.index, offset, written, before, after, streamed=True)

    def _earlier_stream(self, item: SourceItem, source: EntrySource) -> StoredContent | None:
        """A streamed file's content where an earlier file stored it, found by hashing the file
        first when a file of its size was stored before. None: no such copy, or it could not be
        read steadily (``_store_content`` then reads it again and reports what it finds)."""
        assert self.dedup is not None
        try:
            content = source.open(item)
        except OSError:
            return None
        try:
            before = content.stat()
            if not statmod.S_ISREG(before.st_mode) or before.st_size not in self.dedup.sizes:
                return None
            written = _Written(ContentDigest())
            while chunk := content.read(READ_CHUNK):
                written.take(chunk)
            after = content.stat()
        except OSError:
            return None
        finally:
            content.close()
        if written.size != before.st_size or after.st_mtime_ns != before.st_mtime_ns:
            return None
        return self._earlier(item.rel, written, before, after)

    def _store_bytes(self, rel: bytes, data: bytes, before: Stat, after: Stat) -> StoredContent:
        """Store content the source already read whole (same result as _store_content)."""
        written = _Written(ContentDigest(data), len(data), crc32c(data), data[:HEAD_SIZE])
        earlier = self._earlier(rel, written, before, after)
        if earlier is not None:
            return earlier
        shard = self._shard_for(len(data))
        offset = shard.stream_size
        shard.write(data)
        self._count(len(data))
        return self._stored(rel, shard.index, offset, written, before, after, streamed=False)

    def _earlier(
        self, rel: bytes, written: _Written, before: Stat, after: Stat
    ) -> StoredContent | None:
        """The content ``written`` describes where a file stored before holds it, if it does."""
        dedup = self.dedup
        if dedup is None or not written.size:
            return None
        place = dedup.find(written.digest.digest())
        if place is None:
            return None
        dedup.files += 1
        dedup.bytes += written.size
        self._count(written.size)
        return self._result(rel, *place, written, before, after)

    def _stored(
        self, rel: bytes, shard: int, offset: int, written: _Written, before, after, *, streamed
    ) -> StoredContent:
        stored = self._result(rel, shard, offset, written, before, after)
        if self.dedup is not None and stored.size:
            self.dedup.add(stored.digest, shard, offset, stored.size, streamed)
        return stored

    def _result(
        self, rel: bytes, shard: int, offset: int, written: _Written, before, after
    ) -> StoredContent:
        size = written.size
        if size != before.st_size or after.st_mtime_ns != before.st_mtime_ns:
            log.warning("%s changed while it was packed; stored the bytes read", os.fsdecode(rel))
            self.changed.append(os.fsdecode(rel))
        return StoredContent(
            shard, offset, size, written.crc, before, written.head,
            digest=written.digest.digest(),
        )  # fmt: skip

    # -- shards and records ------------------------------------------------------------------------

    def _shard_for(self, size: int) -> ShardWriter:
        shard = self.shard
        if (
            shard is not None
            and shard.stream_size
            and (
                # The stream size, not the file size: it does not wait on compression threads,
                # so where shards are cut never depends on timing.
                shard.stream_size >= self.shard_size
                or shard.stream_size + size > fmt.MAX_SHARD_STREAM
            )
        ):
            self._close_shard()
            shard = None
        if shard is None:
            index = self.first_shard + len(self.shards)
            if index >= fmt.MAX_SHARDS:
                raise PackError("the bundle would need more than 65,536 shards")
            path = os.path.join(self.work, fmt.shard_filename(index))
            shard = self.shard = ShardWriter(path, index, self.config, self.pool, level=self.level)
        if size > self.config.large_file_threshold:
            shard.cut()  # large files start on a record boundary
        return shard

    def _close_shard(self) -> None:
        if self.shard is None:
            return
        info = self.shard.finish()
        self._drain_records()
        self.shards.append(info)
        self.shard = None

    def _drain_records(self) -> None:
        # Only when a shard closes: when records become ready depends on compression threads,
        # and putting them between entries at varying points would change the index's bytes.
        shard = self.shard
        if shard is None:
            return
        for record in shard.records:
            self.index.put_record(record)
            self.progress.bytes_stored += record.stored_length
        shard.records.clear()

    def finish(self) -> list[fmt.ShardInfo]:
        """Close the last shard and put every shard's descriptor into the index."""
        if self.shard is None and not self.shards and not self.first_shard:
            self._shard_for(0)  # an empty tree still gets one shard: every bundle has one
        self._close_shard()
        for i, info in enumerate(self.shards):
            self.index.put_shard(self.first_shard + i, info)
        return self.shards

    def abort(self) -> None:
        """Release the open shard without masking the error being raised (closing it would flush
        its buffer, which fails again on a full disk)."""
        if self.shard is not None:
            with contextlib.suppress(OSError):
                self.shard.abort()
