"""``BundleMapping``: a bundle as a read-only ``collections.abc.Mapping`` of paths to file contents.

``Bundle`` inherits it (read/bundle.py). The keys are the regular files' paths (``str``, relative,
no leading ``/``; every name of a hard-linked file), yielded in the order the content is stored
(``stream.stored_names``), so ``items()`` and ``values()`` stream the bundle as ``iter_files``
does, each record read once. ``b[path]`` looks one path up (O(depth)) as ``open`` does: ``str``,
``bytes`` or path-like, a leading ``/`` allowed, symlinks followed; the value is the file's bytes,
CRC-checked. ``len`` comes from the index's counts, without a scan.

Two bundles compare by identity and a bundle stays hashable (``Mapping`` would compare every
file's bytes and drop ``__hash__``).

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.read.tree``,
``bundlefs.read.content``, ``bundlefs.read.paths``, ``bundlefs.read.stream``.
"""

from __future__ import annotations

import os
from collections.abc import ItemsView, Iterator, Mapping, ValuesView

from bundlefs.core import format as fmt
from bundlefs.errors import EntryNotFound, IsADirectory, NotADirectory, NotARegularFile
from bundlefs.read import stream
from bundlefs.read.content import ContentReader
from bundlefs.read.paths import as_bytes, shown
from bundlefs.read.tree import TreeModel


class _StoredItems(ItemsView[str, bytes]):
    """``items()``: (path, bytes) in stored order, each record read once (``iter_files``)."""

    _mapping: BundleMapping

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        return stream.iter_files(self._mapping._tree, self._mapping._content)


class _StoredValues(ValuesView[bytes]):
    """``values()``: the files' bytes in stored order, each record read once."""

    _mapping: BundleMapping

    def __iter__(self) -> Iterator[bytes]:
        for _path, data in stream.iter_files(self._mapping._tree, self._mapping._content):
            yield data


class BundleMapping(Mapping[str, bytes]):
    """The regular files of a bundle as a read-only mapping of path → bytes (docs/python.md)."""

    __slots__ = ()
    _tree: TreeModel
    _content: ContentReader
    config: fmt.Config

    def _file_entry(self, path: object) -> tuple[fmt.Entry, bytes]:
        """The regular file ``path`` names (symlinks followed) and its path as bytes; ``KeyError``
        where it names nothing, ``IsADirectory``/``NotARegularFile`` where it names no file."""
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise KeyError(path)
        raw, _ = as_bytes(path)
        try:
            entry = self._tree.resolve(raw)
        except (EntryNotFound, NotADirectory) as e:
            raise KeyError(path) from e
        if entry.is_dir:
            raise IsADirectory(f"{os.fsdecode(raw)!r} is a directory", shown(path))
        if not entry.is_file:
            raise NotARegularFile(f"{os.fsdecode(raw)!r} is not a regular file", shown(path))
        return entry, raw

    def __getitem__(self, path: object) -> bytes:
        """The content of the regular file at ``path``, checked against its CRC32C."""
        entry, raw = self._file_entry(path)
        return bytes(self._content.read_at(entry, 0, entry.size, path=os.fsdecode(raw)))

    def __contains__(self, path: object) -> bool:
        """Whether ``path`` names a regular file (symlinks followed): ``b[path]`` would read it.
        Anything but a path is simply not in it."""
        try:
            self._file_entry(path)
        except (KeyError, IsADirectory, NotARegularFile):
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        """The regular files' paths, every name of a hard link, in stored order (one index scan,
        24 bytes a file held; read/stream.py)."""
        for path, _ino in stream.stored_names(self._tree):
            yield path

    def __len__(self) -> int:
        """The number of regular files' names (a hard link's every name): the index's counts."""
        return self.config.file_count + self.config.hardlink_count

    def items(self) -> ItemsView[str, bytes]:
        """(path, bytes) of every regular file, streamed in stored order as ``iter_files``."""
        return _StoredItems(self)

    def values(self) -> ValuesView[bytes]:
        """Every regular file's bytes, streamed in stored order."""
        return _StoredValues(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__
