"""The write half of shard files: ``ShardWriter`` (append records, pad to blocks, header last),
``write_shard_header`` and ``start_writeback``. The read half is ``ShardSet`` (storage/shards.py).

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage.codec``.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections import deque
from concurrent.futures import Executor, Future

from bundlefs.core import format as fmt
from bundlefs.core import libc
from bundlefs.core.checksum import crc32c
from bundlefs.errors import naming
from bundlefs.storage.codec import encode_record_payload


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

    def write_stored(self, length: int, stored: bytes, flags: int, crc: int) -> None:
        """Append one record already encoded: its ``stored`` bytes, ``flags`` and ``crc`` as
        another shard holds them, for ``length`` bytes of stream (``compact`` moves records this
        way, never decompressing them). It starts a record: what ``write`` left pending ends
        first. The caller answers for the codec: this shard's (``config.compression``)."""
        self.cut()
        while self._encoding:  # records still compressing go first: stream order
            self._store_oldest()
        self._store(self.stream_size, length, (stored, flags, crc))
        self.stream_size += length
        self._pending_start = self.stream_size

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
