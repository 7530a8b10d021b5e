"""``BundleFile``: one file inside a bundle as a Python file object, and ``open``'s modes.

A ``BundleFile`` is built from the content reader, the file's entry and its path (for messages):
it reads through the record cache and knows nothing of the ``Bundle`` that opened it. ``opened``
turns one into what the built-in ``open`` would give for a mode (binary, or text over a buffered
reader), refusing every writing mode.

May import: ``bundlefs.core``, ``bundlefs.read.content``.
"""

from __future__ import annotations

import io

from bundlefs.core import format as fmt
from bundlefs.read.content import ContentReader

TEXT_MODES = ("r", "rt", "tr")
BINARY_MODES = ("rb", "br")


class BundleFile(io.RawIOBase):
    """A seekable, read-only binary file inside a bundle."""

    def __init__(self, content: ContentReader, entry: fmt.Entry, path: str) -> None:
        super().__init__()
        self._content = content
        self._entry = entry
        self._pos = 0
        self.name = path

    def readable(self) -> bool:
        """True: a bundle file is read-only and readable."""
        return True

    def seekable(self) -> bool:
        """True: any offset can be read (only the records it touches are loaded)."""
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to ``offset`` from the start, the current position or the end (``whence``);
        returns the new position."""
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._entry.size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise OSError(22, "negative seek position")
        self._pos = pos
        return pos

    def tell(self) -> int:
        """The current position."""
        return self._pos

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes from the current position (all the rest if negative)."""
        if self.closed:
            raise ValueError("read of a closed file")
        if size is None or size < 0:
            size = max(0, self._entry.size - self._pos)
        data = bytes(self._content.read_at(self._entry, self._pos, size, path=self.name))
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        """The rest of the file."""
        return self.read(-1)

    def readinto(self, buffer) -> int:
        """Read into ``buffer``; returns the number of bytes read (0 at the end)."""
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    @property
    def size(self) -> int:
        """The file's size in bytes."""
        return self._entry.size

    def fileno(self) -> int:
        """Raises ``io.UnsupportedOperation``: a file inside a bundle has no descriptor."""
        raise io.UnsupportedOperation("a bundle file has no file descriptor")


def check_mode(mode: str, encoding: str | None, errors: str | None, newline: str | None) -> None:
    """``ValueError`` unless ``open`` can honour ``mode`` (and its text arguments) on a bundle."""
    if mode not in TEXT_MODES and mode not in BINARY_MODES:
        raise ValueError(f"bundles are read-only: open() takes 'r', 'rt' or 'rb', not {mode!r}")
    if "b" in mode and (encoding is not None or errors is not None or newline is not None):
        raise ValueError("binary mode doesn't take an encoding, errors or newline argument")


def opened(
    file: BundleFile,
    mode: str,
    encoding: str | None,
    errors: str | None,
    newline: str | None,
) -> BundleFile | io.TextIOWrapper:
    """``file`` as ``open`` gives it in ``mode`` (checked by ``check_mode``): itself in binary,
    else an ``io.TextIOWrapper`` over a buffered reader of it, as the built-in does."""
    if "b" in mode:
        return file
    return io.TextIOWrapper(
        io.BufferedReader(file),
        encoding=io.text_encoding(encoding),
        errors=errors,
        newline=newline,
    )
