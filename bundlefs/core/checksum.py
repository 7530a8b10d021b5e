"""CRC32C, the one checksum of the format: of records, files, the index and the marker.

May import: the standard library, the ``crc32c`` binding.
"""

from __future__ import annotations

import crc32c as _crc32c

_CHUNK = 4 * 1024 * 1024


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value`` (the CRC of what came before)."""
    return _crc32c.crc32c(data, value)


def file_checksum(path: str) -> tuple[int, int]:
    """CRC32C and size of a whole file, read in chunks."""
    value, size = 0, 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            value = crc32c(chunk, value)
            size += len(chunk)
    return value, size
