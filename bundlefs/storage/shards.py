"""Shard file I/O: the record codec, ``ShardWriter`` (append, pad, header) and ``ShardSet`` (reads).

Reads use ``os.pread`` so no file position is shared between threads or forked processes. Every
record read checks the record's CRC32C before decompressing, and decompression is bounded by the
length the index promises: a forged length cannot make a reader allocate more than ``record_size``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor, Future

import lz4.block

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.errors import (
    BundleClosedError,
    BundleError,
    CorruptDataError,
    FormatError,
    UnsupportedVersionError,
    WouldBlock,
)


def encode_record_payload(data: bytes, compression: int) -> tuple[bytes, int]:
    """Choose how to store one record: (stored bytes, record flags)."""
    # An edge byte decides almost every record at once; only then compare the whole record.
    if not data[0] and not data[-1] and data == bytes(len(data)):
        return b"", fmt.RECORD_ZEROS
    if compression == fmt.COMPRESSION_LZ4:
        packed = lz4.block.compress(data, store_size=False)
        if len(packed) < len(data):
            return packed, 0
    return bytes(data), fmt.RECORD_RAW


def decode_record_payload(record: fmt.Record, stored: bytes) -> bytes:
    """Expand the stored bytes of a record whose CRC has been checked."""
    if record.flags & fmt.RECORD_ZEROS:
        return bytes(record.length)
    if record.flags & fmt.RECORD_RAW:
        return stored
    try:
        data = lz4.block.decompress(stored, uncompressed_size=record.length)
    except lz4.block.LZ4BlockError:
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


def _encode_record(data: bytes, compression: int) -> tuple[bytes, int, int]:
    stored, flags = encode_record_payload(data, compression)
    return stored, flags, crc32c(stored)


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, no waiting


@functools.cache
def _libc_sync_file_range():
    func = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
    if func is not None:
        func.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
        func.restype = ctypes.c_int
    return func


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` bytes at ``offset`` to disk, without waiting.

    An optimisation only (where it is missing or refused, the final fsync does all the work): the
    disk writes while the packer reads and compresses, so the fsync before sealing has little
    left to wait for (it took ~15% of a pack of small files when all the writeback waited on it).
    """
    func = _libc_sync_file_range()
    if func is not None:
        func(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


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
        self, path: str, index: int, config: fmt.Config, pool: Executor | None = None
    ) -> None:
        self.path = path
        self.index = index
        self._config = config
        self._pool = pool
        self._file = open(path, "wb")  # noqa: SIM115 - closed in finish()/abort()
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
            self._store(offset, len(data), _encode_record(data, self._config.compression))
            return
        encoding = self._pool.submit(_encode_record, data, self._config.compression)
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
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return fmt.ShardInfo(self._file_size, self.stream_size, self.record_count)

    def abort(self) -> None:
        for _offset, _length, encoding in self._encoding:
            encoding.cancel()
        self._encoding.clear()
        self._file.close()


def write_shard_header(path: str, index: int, bundle_id: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.pwrite(fd, fmt.encode_shard_header(index, bundle_id), 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def _preadv(fd: int, buffer: bytearray | memoryview, offset: int, nowait: bool) -> int:
    """preadv into ``buffer``; with ``nowait``, only from the page cache (RWF_NOWAIT): a read
    that would wait for the disk raises WouldBlock instead.

    The mount's event loop reads cached data inline (~10 µs) and sends only real disk reads to a
    worker thread (a thread hop alone costs ~200 µs).
    """
    if not nowait:
        return os.preadv(fd, [buffer], offset)
    try:
        got = os.preadv(fd, [buffer], offset, os.RWF_NOWAIT)
    except BlockingIOError:
        raise WouldBlock from None
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without RWF_NOWAIT
            raise WouldBlock from None
        raise
    if got != len(buffer):
        raise WouldBlock  # partly cached, or short: the blocking read decides which
    return got


@contextlib.contextmanager
def _read_errors(record: fmt.Record) -> Iterator[None]:
    """Turn a failed shard read into the CorruptDataError of the record it was for."""
    try:
        yield
    except OSError as e:
        raise CorruptDataError(
            f"read error: {e.strerror}", shard=record.shard, record=record.offset
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
    """The shard files of one bundle, opened lazily, read with pread. Thread-safe."""

    def __init__(self, bundle_dir: str, marker: fmt.Marker) -> None:
        self._marker = marker
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()
        # Shards are opened lazily, relative to the directory opened now: a bundle replaced at
        # the same path later (pack --force) cannot lend this one its shards.
        try:
            self._dir_fd: int | None = os.open(
                bundle_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
            )
        except OSError as e:
            raise FormatError(f"cannot open the bundle directory: {e.strerror}") from None

    def _fd(self, shard: int) -> int:
        fd = self._fds.get(shard)
        if fd is not None:
            return fd
        with self._lock:
            fd = self._fds.get(shard)
            if fd is None:
                fd = self._open(shard)
                self._fds[shard] = fd
        return fd

    def _open(self, shard: int) -> int:
        if not 0 <= shard < self._marker.shard_count:
            raise FormatError(f"shard {shard} does not exist")
        if self._dir_fd is None:
            raise BundleClosedError("the bundle is closed")
        try:
            fd = os.open(fmt.shard_filename(shard), os.O_RDONLY | os.O_CLOEXEC, dir_fd=self._dir_fd)
        except OSError as e:
            raise CorruptDataError(f"cannot open shard file: {e.strerror}", shard=shard) from None
        try:
            fmt.check_shard_header(
                os.pread(fd, fmt.SHARD_HEADER_SIZE, 0), shard, self._marker.bundle_id
            )
        except (FormatError, UnsupportedVersionError) as e:
            # The bundle opened, so a header that disagrees with it is damage to this shard
            # (found by make fuzz: a flipped version byte aborted extract mid-file).
            os.close(fd)
            raise CorruptDataError(str(e), shard=shard) from None
        return fd

    def _pread(self, record: fmt.Record, length: int, offset: int, nowait: bool = False) -> bytes:
        with _read_errors(record):
            fd = self._fd(record.shard)
            if nowait:
                buffer = bytearray(length)
                _preadv(fd, buffer, offset, nowait=True)
                data = bytes(buffer)
            else:
                data = os.pread(fd, length, offset)
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
        if crc32c(stored) != record.crc32c:
            raise CorruptDataError(
                "record fails its checksum", shard=record.shard, record=record.offset
            )
        return decode_record_payload(record, stored)

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
        with contextlib.suppress(OSError, BundleError):
            os.posix_fadvise(self._fd(shard), offset, length, os.POSIX_FADV_WILLNEED)

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
            got = _preadv(self._fd(record.shard), view, offset, nowait)
        if got != len(view):
            raise _truncated(record)
        if check_record and crc32c(view) != record.crc32c:
            raise CorruptDataError(
                "record fails its checksum", shard=record.shard, record=record.offset
            )

    def close(self) -> None:
        """Close every shard. Must not race reads in other threads."""
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            if self._dir_fd is not None:
                os.close(self._dir_fd)
                self._dir_fd = None
