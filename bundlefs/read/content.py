"""``ContentReader``: file bytes — ``read_at``, streamed content, the record cache, single-flight.

It owns everything between "bytes ``offset … offset+size`` of this file entry" and the records
that hold them: finding the records (index), loading each once even when several threads ask
(single-flight), keeping decoded records in the byte-bounded ``RecordCache``, the whole-file CRC
check, the no-wait path for an event loop, and read-ahead advice. Stored bytes come from a
``ShardSet``, which reads through the storage interface (storage/store.py).

Synchronous and thread-safe. May import: ``bundlefs.core``, ``bundlefs.errors``,
``bundlefs.storage``, ``bundlefs.read.cache``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.errors import (
    CorruptDataError,
    FormatError,
    IsADirectory,
    NotARegularFile,
    WouldBlock,
)
from bundlefs.read.cache import RecordCache
from bundlefs.storage.index import IndexReader
from bundlefs.storage.shards import ShardSet

# Files up to this size are streamed in one piece (read_at checks their CRC itself); larger ones
# in chunks, their CRC computed as they go, so memory stays bounded.
WHOLE_READ_LIMIT = 16 * 1024 * 1024
_CHUNK = 4 * 1024 * 1024


class ContentReader:
    """The content of one open bundle's files."""

    def __init__(
        self,
        index: IndexReader,
        shards: ShardSet,
        cache: RecordCache,
        *,
        bundle_path: str,
        path_of: Callable[[int], str],
    ) -> None:
        self._index = index
        self._shards = shards
        self.cache = cache
        self._bundle_path = bundle_path
        self._path_of = path_of  # names a file in an error when the caller did not
        self._record_size = index.config.record_size
        # Whole-file reads may take a raw record's slice unchecked (format §5) only where a slice
        # is cheaper than the record: not on an object store, where every record is fetched and
        # CRC-checked whole (storage/objectstore/shard_store.py).
        self._raw_slices = shards.partial_reads_cheap
        self.reads_may_stall = shards.reads_may_stall  # a miss may wait on a network
        self._inflight: dict[tuple[int, int], threading.Event] = {}
        self._inflight_lock = threading.Lock()
        # (shard, stream offset) where the last whole-file read ended: a read from the start
        # of the stream counts as in order.
        self._last_whole_read = (0, 0)

    def forked(self) -> None:
        """In a child after ``fork()`` (data-loader workers): the loads other threads had in
        flight never finish here, so a reader of one of those records would wait forever."""
        self._inflight = {}
        self._inflight_lock = threading.Lock()
        self.cache.forked()

    # -- where file bytes are stored ------------------------------------------------------------

    def record_at(self, shard: int, offset: int) -> fmt.Record:
        """The record of ``shard`` holding stream byte ``offset``."""
        return self._index.record_at(shard, offset)

    def records(self, shard: int) -> Iterator[fmt.Record]:
        """Every record of ``shard`` in stream order, as the index lists them."""
        return self._index.iter_records(shard)

    def shard_info(self, shard: int) -> fmt.ShardInfo:
        """The index's descriptor of ``shard`` (sizes, record count)."""
        return self._index.shard_info(shard)

    # -- reading -----------------------------------------------------------------------------------

    def _load(self, record: fmt.Record, nowait: bool = False, need: int | None = None) -> bytes:
        """A record's bytes from the cache, or loaded once even when several threads ask.

        With ``need``, only the record's first ``need`` bytes are wanted: a record not cached
        may be decompressed only that far, and that prefix is what the cache then holds. A
        cached prefix too short for a later read is replaced by the whole record, so a record is
        decompressed at most once more than before (``need``: only whole-file reads, below).
        """
        key = (record.shard, record.offset)
        want = record.length if need is None else need
        upto = need
        while True:
            data = self.cache.get(key, want)
            if data is not None:
                return data
            if key in self.cache:
                upto = None  # a prefix is cached but too short: the whole record this time
            with self._inflight_lock:
                waiter = self._inflight.get(key)
                if waiter is None:
                    done = self._inflight[key] = threading.Event()
            if waiter is not None:
                if nowait:
                    raise WouldBlock  # another thread is loading it: do not wait here
                waiter.wait()
                continue  # the loader has cached it (or failed: then we try ourselves)
            try:
                data = self._shards.load(record, nowait=nowait, upto=upto)
                self.cache.put(key, data)  # which keeps a whole record another thread cached
                return data
            finally:
                with self._inflight_lock:
                    del self._inflight[key]
                done.set()

    def prefetch(self, entry: fmt.Entry) -> None:
        """Start reading a small file's stored bytes from disk in the background, if not cached.

        For the mount: a LOOKUP of a file is almost always followed by its READ, a request round
        trip later. Advised at the lookup, the disk read overlaps that round trip, and the READ
        then finds its bytes in the page cache and is served inline instead of in a thread.
        Only files within one record: a lookup must not start a large read nobody asked for.
        """
        if not entry.is_file or not 0 < entry.size <= self._record_size:
            return
        try:
            record = self._index.record_at(entry.shard, entry.offset)
        except FormatError:
            return  # the read will report it
        if record.flags & fmt.RECORD_ZEROS or entry.offset + entry.size > record.end:
            return
        if (record.shard, record.offset) in self.cache:
            return
        if record.flags & fmt.RECORD_RAW and self._raw_slices:  # whole-file reads take a slice
            start = record.stored_offset + entry.offset - record.offset
            self._shards.prefetch(record.shard, start, entry.size)
        else:
            self._shards.prefetch(record.shard, record.stored_offset, record.stored_length)

    def read_at(
        self,
        entry: fmt.Entry,
        offset: int,
        size: int,
        *,
        path: str | None = None,
        nowait: bool = False,
        as_buffer: bool = False,
    ) -> bytes | bytearray:
        """Up to ``size`` bytes of a file from ``offset``; a whole-file read checks the file CRC.

        With ``nowait``, raise ``WouldBlock`` rather than wait for the disk (for an event loop).
        With ``as_buffer``, a read that spans records may come back as the bytearray it was
        assembled in (the FUSE reply takes any buffer; ``bytes`` would copy it once more).
        """
        if entry.is_dir:
            raise IsADirectory(f"{path or entry.name!r} is a directory", path or entry.name)
        if entry.is_special:
            raise NotARegularFile(
                f"{path or entry.name!r} is not a regular file", path or entry.name
            )
        if not entry.is_file:
            raise FormatError(f"{path or entry.name!r} is not a regular file")
        end = min(entry.size, offset + size)
        if offset >= end:
            if not entry.size and entry.crc32c:  # the CRC32C of no bytes is 0
                raise CorruptDataError(
                    "empty file fails its checksum", path=path, bundle=self._bundle_path
                )
            return b""
        try:
            out = self._read_range(entry, offset, end, nowait)
            return out if as_buffer or isinstance(out, bytes) else bytes(out)
        except CorruptDataError as e:
            where = path or self._path_of(entry.ino)
            raise e.with_context(bundle=self._bundle_path, path=where) from None
        except FormatError as e:
            # A location or record the index cannot back (no record, no shard) damages this file
            # only: report it like bad bytes, so callers treat it as one damaged file.
            raise CorruptDataError(
                str(e),
                bundle=self._bundle_path,
                path=path or self._path_of(entry.ino),
                shard=entry.shard,
            ) from None

    def iter_content(self, entry: fmt.Entry, path: str) -> Iterator[bytes]:
        """The content of a regular file in pieces; raises ``CorruptDataError`` if it fails its CRC.

        A small file is checked before its bytes are yielded; a large one only at the end (after
        its records were each checked), so a caller that writes as it reads must undo on the error.
        """
        if entry.size <= WHOLE_READ_LIMIT:
            yield bytes(self.read_at(entry, 0, entry.size, path=path))
            return
        value, pos = 0, 0
        while pos < entry.size:
            piece = bytes(self.read_at(entry, pos, _CHUNK, path=path))
            if not piece:
                raise CorruptDataError("file is shorter than its entry says", path=path)
            value = crc32c(piece, value)
            pos += len(piece)
            yield piece
        if value != entry.crc32c:
            raise CorruptDataError(
                "file content fails its checksum",
                bundle=self._bundle_path,
                path=path,
                shard=entry.shard,
            )

    def _read_range(
        self, entry: fmt.Entry, offset: int, end: int, nowait: bool
    ) -> bytes | bytearray:
        """The file's bytes ``offset … end``: bytes within one record, else a bytearray filled in
        place, record by record (no pieces to join, and whole raw records read straight in)."""
        whole = offset == 0 and end == entry.size
        pos, stop = entry.offset + offset, entry.offset + end
        record = self._index.record_at(entry.shard, pos)
        if stop <= record.end:
            out: bytes | bytearray = self._record_slice(record, pos, stop - pos, whole, nowait)
        else:
            # The last byte must be backed by a record before its buffer is allocated: a forged
            # size would otherwise ask for a terabyte.
            self._index.record_at(entry.shard, stop - 1)
            out = bytearray(stop - pos)
            view = memoryview(out)
            at = 0
            while True:
                take = min(stop, record.end) - pos
                self._fill(view[at : at + take], record, pos, whole, nowait)
                pos += take
                at += take
                if pos >= stop:
                    break
                record = self._index.record_at(entry.shard, pos)
        if whole and crc32c(out) != entry.crc32c:
            raise CorruptDataError("file content fails its checksum", shard=entry.shard)
        return out

    def _record_slice(
        self, record: fmt.Record, pos: int, take: int, whole: bool, nowait: bool
    ) -> bytes:
        """``take`` stream bytes from ``pos``, all inside ``record``."""
        if whole and record.flags & fmt.RECORD_RAW and self._raw_slices:
            data = self.cache.get((record.shard, record.offset))
            if data is None:
                # A whole-file read is checked by the file CRC, so a raw record's slice can be
                # read directly instead of the whole record (4.6 KB: ~9 µs, not ~124 µs).
                return self._shards.read_raw(record, pos, take, nowait=nowait)
        else:
            if whole:
                data = self._load(record, nowait, self._prefix_needed(record, pos, take))
                # Only once loaded: a nowait attempt that raised WouldBlock is tried again, and
                # must then decide the same.
                self._last_whole_read = (record.shard, pos + take)
            else:
                data = self._load(record, nowait)
        start = pos - record.offset
        return data[start : start + take]  # the record itself when it is all of it: no copy

    def _prefix_needed(self, record: fmt.Record, pos: int, take: int) -> int | None:
        """How much of ``record`` a whole-file read of stream bytes ``pos … pos+take`` needs
        decompressed: up to the file's end, or None (all of it) where whole-file reads go
        through the stream in order (cp -r, tar, iter_files), whose next file wants the rest.

        A small file lies on average halfway into its 256 KiB record, and where reads jump about
        a dataset larger than the cache (a training epoch), the rest of the record is rarely
        read before it is evicted. In order is told by where the previous whole-file read ended:
        at most a record before this file, or inside it (the same read again, or one read by
        another worker in between). Shared by threads without a lock: a lost update only
        decompresses one record more or less than it might.
        """
        shard, end = self._last_whole_read
        if shard == record.shard and pos - self._record_size <= end <= pos + take:
            return None
        return pos - record.offset + take

    def _fill(
        self, view: memoryview, record: fmt.Record, pos: int, whole: bool, nowait: bool
    ) -> None:
        """Fill ``view`` with the stream bytes from ``pos``, all inside ``record``."""
        covered = pos == record.offset and len(view) == record.length
        unchecked = whole and self._raw_slices  # the file CRC alone may vouch for the bytes
        if (record.shard, record.offset) not in self.cache:
            if record.flags & fmt.RECORD_RAW and (unchecked or covered):
                # Straight into the reply, checked by the file's CRC (whole) or the record's own,
                # and not cached: a read that covers whole records is a large sequential one,
                # which the kernel's page cache keeps. Measured on a cold 64 MiB file through the
                # mount (dd, 1 MiB READs): 45,000 -> 23,000 page faults in the daemon, 249-268 ->
                # 491 MB/s.
                self._shards.read_raw_into(
                    record, pos, view, nowait=nowait, check_record=not unchecked
                )
                return
            if covered:
                # The same for a compressed record: decompressed straight into the reply, not
                # copied out of a bytes object, and not cached (docs/performance.md, "lz4 into
                # buffers of ours": a cold 512 MiB text file, 1 worker, 306 -> 632 MB/s).
                self._shards.load_into(record, view, nowait=nowait)
                self.cache.count_loaded(record.length)  # decompressed, if not cached
                return
        view[:] = self._record_slice(record, pos, len(view), whole, nowait)
