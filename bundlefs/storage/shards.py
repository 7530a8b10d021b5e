"""The read half of shard files: ``ShardSet`` (records through a ``ShardStore``).

``ShardSet`` reads stored bytes through a ``ShardStore`` (storage/store.py: local files today,
an object store tomorrow) and owns what a record means: every record read checks the record's
CRC32C before decompressing, and decompression is bounded by the length the index promises: a
forged length cannot make a reader allocate more than ``record_size`` (storage/codec.py). The write
half is storage/shard_writer.py.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage.native``,
``bundlefs.storage.codec``, ``bundlefs.storage.store``.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable
from typing import Literal

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.errors import (
    BundleError,
    CorruptDataError,
    FormatError,
    ShardUnavailable,
    UnsupportedVersionError,
    WouldBlock,
)
from bundlefs.storage import native
from bundlefs.storage.codec import decode_record_payload
from bundlefs.storage.store import ShardStore


class _read_errors:  # noqa: N801 - used as ``with _read_errors(record):``, like a function
    """Turn a failed shard read into the CorruptDataError of the record it was for.

    A class rather than a ``contextlib.contextmanager`` generator: it is entered for every read
    the mount serves, and costs ~1 µs where the generator cost ~3.5 (measured on this machine).
    """

    __slots__ = ("_record",)

    def __init__(self, record: fmt.Record) -> None:
        self._record = record

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: object
    ) -> Literal[False]:
        record = self._record
        if isinstance(error, OSError):
            # EIO: the bytes did not arrive (a disk error, an object store that gave up); a
            # missing object or a refusal is not an outage.
            raise CorruptDataError(
                f"read error: {error.strerror}",
                shard=record.shard,
                record=record.offset,
                unreadable=error.errno == errno.EIO,
            ) from None
        if isinstance(error, OverflowError):  # an offset past what off_t holds: a forged index
            raise CorruptDataError(
                "record lies past any file offset", shard=record.shard, record=record.offset
            ) from None
        return False


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
        # The store's capabilities (storage/store.py), for the readers above: ContentReader
        # reads raw slices only where they are cheap, and the mount never reads inline on its
        # event loop from a store whose reads may stall.
        self.partial_reads_cheap: bool = store.partial_reads_cheap
        self.reads_may_stall: bool = store.reads_may_stall
        # A store that keeps copies (an object store's caches) can drop a damaged one.
        self._holds_copies: bool = store.holds_copies

    def _name(self, shard: int, nowait: bool = False) -> str:
        """The shard's file name, its header checked on first use."""
        name = self._names.get(shard)
        if name is not None:
            return name
        if not 0 <= shard < self._marker.shard_count:
            raise FormatError(f"shard {shard} does not exist")
        info = self._shard_info(shard)
        # A shard in a base (version 6) is named for the store that routes it there.
        name = fmt.store_name(shard, self._marker.format_version, info)
        problem = self._header_problem(name, shard, info, nowait)
        if problem is not None and self._holds_copies and not nowait:
            # Perhaps only the store's copy is damaged (a cache file): drop it, read it again.
            self._store.discard(name, 0, fmt.SHARD_HEADER_SIZE)
            problem = self._header_problem(name, shard, info, nowait)
        if problem is not None:
            # The bundle opened, so a header that disagrees with it is damage to this shard
            # (found by make fuzz: a flipped version byte aborted extract mid-file).
            raise CorruptDataError(problem, shard=shard)
        self._codecs[shard] = info.codec
        self._names[shard] = name
        return name

    def _header_problem(
        self, name: str, shard: int, info: fmt.ShardInfo, nowait: bool
    ) -> str | None:
        """What is wrong with the shard's header as the store reads it now (None: nothing)."""
        try:
            header = self._store.read(name, 0, fmt.SHARD_HEADER_SIZE, nowait=nowait)
        except ShardUnavailable as e:
            raise CorruptDataError(f"cannot open shard file: {e.strerror}", shard=shard) from None
        # Any other OSError is a read error: the caller's _read_errors names its record.
        try:
            fmt.check_shard_header(header, shard, self._marker.bundle_id, info)
        except (FormatError, UnsupportedVersionError) as e:
            return str(e)
        return None

    def _pread(self, record: fmt.Record, length: int, offset: int, nowait: bool = False) -> bytes:
        with _read_errors(record):
            name = self._name(record.shard, nowait)
            data = self._store.read(name, offset, length, nowait=nowait)
        if len(data) != length:
            raise _truncated(record)
        return data

    def _stored(self, record: fmt.Record, nowait: bool) -> bytes:
        """The record's stored bytes, its CRC verified (b"" for a ZEROS record)."""
        stored = b""
        if not record.flags & fmt.RECORD_ZEROS:
            stored = self._pread(record, record.stored_length, record.stored_offset, nowait)
        if crc32c(stored) != record.crc32c and self._holds_copies and not nowait:
            # Perhaps only the store's copy is damaged: drop it and read the record once more.
            self._store.discard(
                self._name(record.shard), record.stored_offset, record.stored_length
            )
            stored = self._pread(record, record.stored_length, record.stored_offset)
        if crc32c(stored) != record.crc32c:
            raise CorruptDataError(
                "record fails its checksum", shard=record.shard, record=record.offset
            )
        return stored

    def _codec(self, record: fmt.Record) -> int:
        codec = self._codecs.get(record.shard)
        if codec is None:  # a ZEROS record needs no read, so its shard may not be named yet
            self._name(record.shard)
            codec = self._codecs[record.shard]
        return codec

    def load(self, record: fmt.Record, *, nowait: bool = False, upto: int | None = None) -> bytes:
        """The record's uncompressed bytes, checksum verified; with ``upto``, perhaps only the
        first ``upto`` of them (an lz4 record decompressed no further: codec.py).

        With ``nowait``, raise ``WouldBlock`` instead of waiting for the disk.
        """
        stored = self._stored(record, nowait)
        if record.flags & (fmt.RECORD_ZEROS | fmt.RECORD_RAW):
            return decode_record_payload(record, stored)
        return decode_record_payload(record, stored, self._codec(record), upto)

    def load_into(self, record: fmt.Record, view: memoryview, *, nowait: bool = False) -> None:
        """The record's uncompressed bytes, checksum verified, written into ``view`` (exactly
        the record's length): an lz4 record is decompressed straight into it where the compiled
        step is built, sparing the copy out of a bytes object."""
        stored = self._stored(record, nowait)
        if record.flags & (fmt.RECORD_ZEROS | fmt.RECORD_RAW):
            view[:] = decode_record_payload(record, stored)
            return
        codec = self._codec(record)
        if codec == fmt.COMPRESSION_LZ4 and native.lz4_decompress_into(stored, view):
            return
        view[:] = decode_record_payload(record, stored, codec)  # which reports a bad block

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
        if check_record and crc32c(view) != record.crc32c and self._holds_copies and not nowait:
            self._store.discard(name, offset, len(view))  # as in load: the store's copy, once more
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
