"""Shard files: the record codec, ``ShardWriter`` (append, pad, header) and ``ShardSet`` (reads).

``ShardSet`` reads stored bytes through a ``ShardStore`` (storage/store.py: local files today,
an object store tomorrow) and owns what a record means: every record read checks the record's
CRC32C before decompressing, and decompression is bounded by the length the index promises: a
forged length cannot make a reader allocate more than ``record_size``.
May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage.store``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future

import lz4.block

from bundlefs.core import format as fmt
from bundlefs.core import libc
from bundlefs.core.checksum import crc32c
from bundlefs.errors import (
    BundleError,
    CorruptDataError,
    FormatError,
    ShardUnavailable,
    UnsupportedVersionError,
    WouldBlock,
    naming,
)
from bundlefs.storage.store import ShardStore

DEFAULT_ZSTD_LEVEL = 3  # zstd's own default: most of its ratio at several hundred MB/s per core

# zstd (de)compressor objects must not be shared between threads; the pool and the mount's read
# threads each get their own.
_zstd_local = threading.local()


def zstd_module():
    """The ``zstandard`` binding, or ``BundleError`` naming the extra that installs it."""
    try:
        import zstandard
    except ImportError:
        raise BundleError(
            "zstd compression needs the zstandard package: pip install 'bundlefs[zstd]'"
        ) from None
    return zstandard


def _zstd_compress(data: bytes, level: int) -> bytes:
    compressors = getattr(_zstd_local, "compressors", None)
    if compressors is None:
        compressors = _zstd_local.compressors = {}
    compressor = compressors.get(level)
    if compressor is None:
        # No checksum of its own (the record CRC covers the stored bytes); the content size is
        # in the frame, which the reader checks against the index's length.
        compressor = compressors[level] = zstd_module().ZstdCompressor(
            level=level, write_checksum=False, write_content_size=True
        )
    return compressor.compress(data)


def _zstd_decompress(stored: bytes, length: int) -> bytes:
    """Exactly one frame that records ``length`` as its content size (docs/format.md §3.4).

    zstandard sizes its output from the frame's own header and ignores ``max_output_size`` when
    the header has one: a 17-byte frame claiming 1 TiB made it allocate that (found by a second
    read of this change). So the declared size is checked first, and nothing may follow the frame.
    """
    zstd = zstd_module()
    declared = zstd.frame_content_size(stored)  # -1: not recorded; ZstdError: not a frame
    if declared != length:
        raise zstd.ZstdError(f"the frame declares {declared} bytes, the record {length}")
    decompressor = getattr(_zstd_local, "decompressor", None)
    if decompressor is None:
        decompressor = _zstd_local.decompressor = zstd.ZstdDecompressor()
    return decompressor.decompress(stored, max_output_size=length, allow_extra_data=False)


def encode_record_payload(
    data: bytes, compression: int, level: int | None = None
) -> tuple[bytes, int]:
    """Choose how to store one record: (stored bytes, record flags)."""
    # An edge byte decides almost every record at once; only then compare the whole record.
    if not data[0] and not data[-1] and data == bytes(len(data)):
        return b"", fmt.RECORD_ZEROS
    packed = None
    if compression == fmt.COMPRESSION_LZ4:
        packed = lz4.block.compress(data, store_size=False)
    elif compression == fmt.COMPRESSION_ZSTD:
        packed = _zstd_compress(data, DEFAULT_ZSTD_LEVEL if level is None else level)
    if packed is not None and len(packed) < len(data):
        return packed, 0
    return bytes(data), fmt.RECORD_RAW


def decode_record_payload(
    record: fmt.Record, stored: bytes, codec: int = fmt.COMPRESSION_LZ4
) -> bytes:
    """Expand the stored bytes of a record whose CRC has been checked.

    ``codec`` is how the record's shard stores a record without ZEROS or RAW (its shard table
    entry's, or the bundle's ``Config.record_codec`` before version 3).
    """
    if record.flags & fmt.RECORD_ZEROS:
        return bytes(record.length)
    if record.flags & fmt.RECORD_RAW:
        return stored
    if codec == fmt.COMPRESSION_ZSTD:
        undecodable: tuple[type[Exception], ...] = (zstd_module().ZstdError,)
    else:
        undecodable = (lz4.block.LZ4BlockError,)
    try:
        if codec == fmt.COMPRESSION_ZSTD:
            data = _zstd_decompress(stored, record.length)
        else:
            data = lz4.block.decompress(stored, uncompressed_size=record.length)
    except undecodable:
        raise CorruptDataError(
            "record does not decompress", shard=record.shard, record=record.offset
        ) from None
    if len(data) != record.length:
        raise CorruptDataError(
            f"record decompressed to {len(data)} bytes, expected {record.length}",
            shard=record.shard,
            record=record.offset,
        )
    return data


def _encode_record(data: bytes, compression: int, level: int | None) -> tuple[bytes, int, int]:
    stored, flags = encode_record_payload(data, compression, level)
    return stored, flags, crc32c(stored)


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` bytes at ``offset`` to disk, without waiting.

    An optimisation only (where it is missing or refused, the final fsync does all the work): the
    disk writes while the packer reads and compresses, so the fsync before sealing has little
    left to wait for (it took ~15% of a pack of small files when all the writeback waited on it).
    """
    with contextlib.suppress(OSError):
        libc.sync_file_range(fd, offset, length, libc.SYNC_FILE_RANGE_WRITE)


class ShardWriter:
    """Appends records to one shard file; the header is written last, with the bundle id.

    With a ``pool``, records are compressed and checksummed on its threads (lz4 and CRC32C release
    the GIL) up to ``COMPRESS_AHEAD`` records ahead, and still written strictly in stream order, so
    the file is the same as without one. Every ``WRITEBACK_BYTES`` written, writeback of them is
    started, so the disk works while the packer does and the final fsync is short.
    """

    COMPRESS_AHEAD = 8
    WRITEBACK_BYTES = 8 * 1024 * 1024

    def __init__(
        self,
        path: str,
        index: int,
        config: fmt.Config,
        pool: Executor | None = None,
        *,
        level: int | None = None,
    ) -> None:
        self.path = path
        self.index = index
        self._config = config
        self._level = level  # the compressor's level (zstd); not part of the format
        self._pool = pool
        # "x": a new file, never one already there (a merged bundle's shards are links of
        # other bundles' files, which nothing may truncate).
        self._file = open(path, "xb")  # noqa: SIM115 - closed in finish()/abort()
        with naming(path):
            self._file.write(bytes(config.block_size))  # header block, filled in by write_header()
        self._file_size = config.block_size
        self._written_back = 0  # file offset up to which writeback has been started
        self._pending = bytearray()  # the record being filled
        self._pending_start = 0  # its offset in the uncompressed stream
        self._encoding: deque[tuple[int, int, Future]] = deque()  # (offset, length, encoding)
        self.stream_size = 0  # bytes written to the uncompressed stream so far
        self.records: list[fmt.Record] = []  # records written to the file, drained by the packer
        self.record_count = 0

    def write(self, data: bytes | memoryview) -> None:
        """Append bytes to the uncompressed stream, emitting full records."""
        view = memoryview(data)
        record_size = self._config.record_size
        while view:
            room = record_size - len(self._pending)
            self._pending += view[:room]
            view = view[room:]
            if len(self._pending) == record_size:
                self._emit()
        self.stream_size += len(data)

    def cut(self) -> None:
        """End the current record early, so the next byte starts a record."""
        if self._pending:
            self._emit()

    def _emit(self) -> None:
        data = bytes(self._pending)
        offset = self._pending_start
        self._pending_start += len(data)
        self._pending.clear()
        if self._pool is None:
            self._store(
                offset, len(data), _encode_record(data, self._config.compression, self._level)
            )
            return
        encoding = self._pool.submit(_encode_record, data, self._config.compression, self._level)
        self._encoding.append((offset, len(data), encoding))
        if len(self._encoding) >= self.COMPRESS_AHEAD:
            self._store_oldest()

    def _store_oldest(self) -> None:
        offset, length, encoding = self._encoding.popleft()
        self._store(offset, length, encoding.result())

    def _store(self, offset: int, length: int, encoded: tuple[bytes, int, int]) -> None:
        stored, flags, crc = encoded
        record = fmt.Record(
            shard=self.index,
            offset=offset,
            stored_offset=self._file_size,
            stored_length=len(stored),
            length=length,
            crc32c=crc,
            flags=flags,
        )
        if stored:
            padded = fmt.pad_to(len(stored), self._config.block_size)
            with naming(self.path):  # a full disk is said with the shard's name
                self._file.write(stored)
                self._file.write(bytes(padded - len(stored)))
                self._file_size += padded
                if self._file_size - self._written_back >= self.WRITEBACK_BYTES:
                    self._file.flush()
                    written = self._file_size - self._written_back
                    start_writeback(self._file.fileno(), self._written_back, written)
                    self._written_back = self._file_size
        self.records.append(record)
        self.record_count += 1

    def finish(self) -> fmt.ShardInfo:
        self.cut()
        while self._encoding:
            self._store_oldest()
        with naming(self.path):
            self._file.flush()
            os.fsync(self._file.fileno())
        self._file.close()
        return fmt.ShardInfo(
            self._file_size, self.stream_size, self.record_count, self._config.record_codec
        )

    def abort(self) -> None:
        for _offset, _length, encoding in self._encoding:
            encoding.cancel()
        self._encoding.clear()
        self._file.close()


def write_shard_header(path: str, index: int, bundle_id: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_nlink > 1:  # a shard linked from another bundle keeps its header
            raise OSError(errno.EMLINK, "refusing to stamp a shard file with other names", path)
        with naming(path):
            os.pwrite(fd, fmt.encode_shard_header(index, bundle_id, fmt.FORMAT_VERSION), 0)
            os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _read_errors(record: fmt.Record) -> Iterator[None]:
    """Turn a failed shard read into the CorruptDataError of the record it was for."""
    try:
        yield
    except OSError as e:
        # EIO: the bytes did not arrive (a disk error, an object store that gave up); a missing
        # object or a refusal is not an outage.
        raise CorruptDataError(
            f"read error: {e.strerror}",
            shard=record.shard,
            record=record.offset,
            unreadable=e.errno == errno.EIO,
        ) from None
    except OverflowError:  # an offset past what off_t holds: only a forged index says that
        raise CorruptDataError(
            "record lies past any file offset", shard=record.shard, record=record.offset
        ) from None


def _truncated(record: fmt.Record) -> CorruptDataError:
    return CorruptDataError(
        "shard is shorter than its index says (truncated?)",
        shard=record.shard,
        record=record.offset,
    )


class ShardSet:
    """The records of one bundle's shards: read through a ``ShardStore``, CRC-checked, decoded.

    Each shard's header is checked against the bundle on first use. Thread-safe.
    """

    def __init__(
        self,
        store: ShardStore,
        marker: fmt.Marker,
        shard_info: Callable[[int], fmt.ShardInfo],
    ) -> None:
        self._store = store
        self._marker = marker
        # The index's descriptor of a shard: what its header must say and how its records are
        # compressed (from version 3 on a bundle may hold shards other bundles wrote).
        self._shard_info = shard_info
        self._names: dict[int, str] = {}  # shard -> file name, once its header matched
        self._codecs: dict[int, int] = {}  # shard -> codec, set with its name
        # Whether reading a slice of a record costs less than the whole record (a local file:
        # yes; an object store: one round trip either way, and only a whole record can be
        # CRC-checked). ContentReader reads raw slices only where this is true.
        self.partial_reads_cheap: bool = getattr(store, "partial_reads_cheap", True)
        # Whether a read that is not served from a cache may wait long (a network round trip,
        # retries): then the mount never reads inline on its event loop.
        self.reads_may_stall: bool = getattr(store, "reads_may_stall", False)
        # A store that keeps copies (an object store's disk cache) can drop a damaged one.
        self._discard = getattr(store, "discard", None)

    def _name(self, shard: int, nowait: bool = False) -> str:
        """The shard's file name, its header checked on first use."""
        name = self._names.get(shard)
        if name is not None:
            return name
        if not 0 <= shard < self._marker.shard_count:
            raise FormatError(f"shard {shard} does not exist")
        name = fmt.shard_filename(shard, self._marker.format_version)
        info = self._shard_info(shard)
        try:
            header = self._store.read(name, 0, fmt.SHARD_HEADER_SIZE, nowait=nowait)
        except ShardUnavailable as e:
            raise CorruptDataError(f"cannot open shard file: {e.strerror}", shard=shard) from None
        # Any other OSError is a read error: the caller's _read_errors names its record.
        try:
            fmt.check_shard_header(header, shard, self._marker.bundle_id, info)
        except (FormatError, UnsupportedVersionError) as e:
            # The bundle opened, so a header that disagrees with it is damage to this shard
            # (found by make fuzz: a flipped version byte aborted extract mid-file).
            raise CorruptDataError(str(e), shard=shard) from None
        self._codecs[shard] = info.codec
        self._names[shard] = name
        return name

    def _pread(self, record: fmt.Record, length: int, offset: int, nowait: bool = False) -> bytes:
        with _read_errors(record):
            name = self._name(record.shard, nowait)
            data = self._store.read(name, offset, length, nowait=nowait)
        if len(data) != length:
            raise _truncated(record)
        return data

    def load(self, record: fmt.Record, *, nowait: bool = False) -> bytes:
        """The record's uncompressed bytes, checksum verified.

        With ``nowait``, raise ``WouldBlock`` instead of waiting for the disk.
        """
        stored = b""
        if not record.flags & fmt.RECORD_ZEROS:
            stored = self._pread(record, record.stored_length, record.stored_offset, nowait)
        if crc32c(stored) != record.crc32c and self._discard is not None and not nowait:
            # Perhaps only the store's copy is damaged: drop it and read the record once more.
            self._discard(self._name(record.shard), record.stored_offset, record.stored_length)
            stored = self._pread(record, record.stored_length, record.stored_offset)
        if crc32c(stored) != record.crc32c:
            raise CorruptDataError(
                "record fails its checksum", shard=record.shard, record=record.offset
            )
        if record.flags & (fmt.RECORD_ZEROS | fmt.RECORD_RAW):
            return decode_record_payload(record, stored)
        codec = self._codecs.get(record.shard)
        if codec is None:  # a ZEROS record needs no read, so its shard may not be named yet
            self._name(record.shard)
            codec = self._codecs[record.shard]
        return decode_record_payload(record, stored, codec)

    def read_raw(
        self, record: fmt.Record, start: int, length: int, *, nowait: bool = False
    ) -> bytes:
        """Bytes ``start … start+length`` of the stream from a RAW record, *without* a record CRC.

        Only for callers that verify the bytes themselves (a whole-file read checks the file CRC).
        """
        assert record.flags & fmt.RECORD_RAW and record.offset <= start
        assert start + length <= record.end
        return self._pread(record, length, record.stored_offset + start - record.offset, nowait)

    def prefetch(self, shard: int, offset: int, length: int) -> None:
        """Ask the kernel to start reading these stored bytes into the page cache; never waits.

        Advice only: a shard that cannot be opened or advised is left to the read that follows.
        """
        # nowait: the first use of a shard checks its header, which on an object store is a
        # GET; advice must never wait for one (it runs on the mount's event loop, in lookup).
        with contextlib.suppress(OSError, BundleError, WouldBlock):
            self._store.prefetch(self._name(shard, nowait=self.reads_may_stall), offset, length)

    def read_raw_into(
        self,
        record: fmt.Record,
        start: int,
        view: memoryview,
        *,
        nowait: bool = False,
        check_record: bool = True,
    ) -> None:
        """Read stream bytes ``start … start+len(view)`` of a RAW record into ``view``.

        With ``check_record`` the view must hold the whole record, and its CRC is checked;
        without, the caller verifies the bytes itself (a whole-file read checks the file CRC).
        """
        assert record.flags & fmt.RECORD_RAW and record.offset <= start
        assert start + len(view) <= record.end
        assert not check_record or (start == record.offset and len(view) == record.length)
        offset = record.stored_offset + start - record.offset
        with _read_errors(record):
            name = self._name(record.shard, nowait)
            got = self._store.read_into(name, offset, view, nowait=nowait)
        if got != len(view):
            raise _truncated(record)
        if check_record and crc32c(view) != record.crc32c and self._discard and not nowait:
            self._discard(name, offset, len(view))  # as in load: the store's copy, once more
            with _read_errors(record):
                got = self._store.read_into(name, offset, view)
            if got != len(view):
                raise _truncated(record)
        if check_record and crc32c(view) != record.crc32c:
            raise CorruptDataError(
                "record fails its checksum", shard=record.shard, record=record.offset
            )

    def close(self) -> None:
        """Close the store. Must not race reads in other threads."""
        self._store.close()
