"""Reading archive streams: stdin, sniffing the compression by magic bytes, decompressing (gzip,
bzip2, xz through the standard library; zstd through the optional ``zstandard`` package), and
telling a failure of reading the archive (``ReadFailed``) from one of writing the bundle.

A new archive format reads its bytes through these and places its members with
``sources.synthetic``.

May import: ``bundlefs.errors``, ``bundlefs.packing.sources.base``.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar

from bundlefs.errors import PackError
from bundlefs.packing.sources.base import READ_CHUNK

STDIN = "-"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header; an empty zip's end record
_T = TypeVar("_T")


# What reading an archive raises when it is damaged: tarfile's and zipfile's own errors, and the
# decompressors' (gzip, bz2, lzma and zstandard say OSError, EOFError, ValueError or zlib.error);
# zipfile says RuntimeError for an encrypted member, NotImplementedError for a method it lacks.
READ_ERRORS = (
    tarfile.TarError,
    zipfile.BadZipFile,
    EOFError,
    zlib.error,
    OSError,
    ValueError,
    RuntimeError,
    NotImplementedError,
)


class ReadFailed(Exception):
    """Reading the archive failed (``cause``); never a failure of writing the bundle."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def reading(function: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``function(*args, **kwargs)``, a call that reads the archive: its errors are ReadFailed."""
    try:
        return function(*args, **kwargs)
    except READ_ERRORS as e:
        raise ReadFailed(e) from e


def chunks(reader: IO[bytes]) -> Iterator[bytes]:
    while chunk := reading(reader.read, READ_CHUNK):
        yield chunk


def read_exactly(f: IO[bytes], size: int) -> bytes:
    """Up to ``size`` bytes (fewer only at the end): a pipe may hand them over in pieces."""
    data = b""
    while len(data) < size:
        chunk = f.read(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


class Prefixed(io.RawIOBase):
    """A stream whose first bytes were already read (to sniff the format): they come first."""

    def __init__(self, prefix: bytes, rest: IO[bytes]) -> None:
        self._prefix = prefix
        self._rest = rest

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._prefix:
            if size < 0:
                data, self._prefix = self._prefix + self._rest.read(), b""
                return data
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            return data
        return self._rest.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class Unclosable(io.RawIOBase):
    """stdin, which the pack reads but does not close."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        return self._f.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self._f.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def decompressed(stream: IO[bytes], magic: bytes) -> IO[bytes]:
    """The tar inside ``stream``, by its magic bytes. Not tarfile's own "r|*": it never checks a
    gzip stream's length and CRC, so a truncated .tar.gz could pass for a shorter archive."""
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[return-value]
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(stream)
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(stream)
    if magic.startswith(ZSTD_MAGIC):
        return _zstd_reader(stream)
    return stream


def compression_of(magic: bytes) -> str | None:
    """The compressed format ``decompressed`` recognises by ``magic``, or None (plain)."""
    for prefix, name in (
        (b"\x1f\x8b", "gzip"),
        (b"BZh", "bzip2"),
        (b"\xfd7zXZ\x00", "xz"),
        (ZSTD_MAGIC, "zstd"),
    ):
        if magic.startswith(prefix):
            return name
    return None


def _zstd_reader(stream: IO[bytes]) -> IO[bytes]:
    try:
        import zstandard
    except ImportError:
        raise PackError(
            "reading a zstd archive needs the zstandard package: pip install 'bundlefs[zstd]'"
        ) from None
    return io.BufferedReader(_ZstdStream(stream, zstandard), READ_CHUNK)


class _ZstdStream(io.RawIOBase):
    """The frames of a zstd stream, decompressed one after the other (pzstd and appended streams
    are one tar). A stream that ends inside a frame is an ``EOFError``, and zstandard's
    ``ZstdError`` (damaged data) an ``OSError``, as the other decompressors say."""

    def __init__(self, stream: IO[bytes], zstandard: Any) -> None:
        self._stream = stream
        self._zstd = zstandard
        self._frame = zstandard.ZstdDecompressor().decompressobj()
        self._in_frame = False  # input given to the current frame, which has not ended
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            compressed = self._frame.unused_data if self._frame.eof else b""
            if self._frame.eof:
                self._frame = self._zstd.ZstdDecompressor().decompressobj()
                self._in_frame = False
            if not compressed:
                compressed = self._stream.read(READ_CHUNK)
                if not compressed:
                    if self._in_frame:
                        raise EOFError("the zstd stream ends inside a frame")
                    return 0
            self._in_frame = True
            try:
                self._pending = self._frame.decompress(compressed)
            except self._zstd.ZstdError as e:
                raise OSError(f"zstd: {e}") from e
        data, self._pending = self._pending[: len(buffer)], self._pending[len(buffer) :]
        buffer[: len(data)] = data
        return len(data)


def failure_reason(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if isinstance(e, EOFError) or "unexpected end" in text:
        return "it is truncated"
    return text.rstrip(".")
