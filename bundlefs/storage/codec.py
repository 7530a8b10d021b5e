"""Record payload codecs: how one record's bytes are stored (none/ZEROS/RAW, lz4, zstd) and the
``zstandard`` binding check. A new codec is one function pair here plus a constant in
``core/format``. The decoder is bounded by the length the index promises: a forged length cannot
make a reader allocate more than ``record_size``. lz4 records decompress through the compiled
step (storage/native.py) where it is built: straight into the bytes returned, or only a prefix.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage.native``.
"""

from __future__ import annotations

import threading
from types import ModuleType

import lz4.block

from bundlefs.core import format as fmt
from bundlefs.errors import BundleError, CorruptDataError
from bundlefs.storage import native

DEFAULT_ZSTD_LEVEL = 3  # zstd's own default: most of its ratio at several hundred MB/s per core

# zstd (de)compressor objects must not be shared between threads; the pool and the mount's read
# threads each get their own.
_zstd_local = threading.local()


def zstd_module() -> ModuleType:
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
    record: fmt.Record, stored: bytes, codec: int = fmt.COMPRESSION_LZ4, upto: int | None = None
) -> bytes:
    """Expand the stored bytes of a record whose CRC has been checked.

    ``codec`` is how the record's shard stores a record without ZEROS or RAW (its shard table
    entry's, or the bundle's ``Config.record_codec`` before version 3). With ``upto``, the
    caller needs only the record's first ``upto`` bytes: an lz4 record may then come back as
    just that prefix (lz4 stops decoding there), any other as the whole record.
    """
    if record.flags & fmt.RECORD_ZEROS:
        return bytes(record.length)
    if record.flags & fmt.RECORD_RAW:
        return stored
    if codec == fmt.COMPRESSION_LZ4:
        # python-lz4 decompresses into a scratch buffer and copies it into the bytes it returns:
        # a 256 KiB record of the small-file dataset 29-31 µs, into our own bytes 19-21 µs, its
        # first half 5 µs (this machine). Anything the compiled step declines (not built, a
        # malformed block) goes the python-lz4 way below, which reports it.
        data = native.lz4_decompress(stored, record.length, upto or record.length)
        if data is not None:
            return data
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
