"""bundlefs: millions of small files as one immutable, compressed, randomly seekable bundle.

``Bundle`` reads a bundle without FUSE; ``pack`` writes one from a tree, ``Writer`` from Python
objects, ``compact`` rewrites one without the stored bytes no file uses; ``diff`` lists what
changed between two, from their indexes. The FUSE mount lives in
``bundlefs.mount`` and is imported only when used; so is the packer, which a
mount never needs (every millisecond of import is a millisecond before a mount is ready); and
so is the reader, which the CLI's parser and ``bundlefs --help`` never need.

May import: ``bundlefs.errors``, lazily ``bundlefs.read`` and ``bundlefs.packing``.
"""

from typing import TYPE_CHECKING

from bundlefs.errors import (
    BaseBundleError,
    BundleError,
    CorruptDataError,
    DuplicatePathError,
    EntryNotFound,
    FormatError,
    IncompleteBundleError,
    InvalidEntryError,
    IsADirectory,
    NotABundleError,
    NotADirectory,
    NotARegularFile,
    PackError,
    UnsupportedVersionError,
)

if TYPE_CHECKING:
    # What type checkers and IDEs see (the real signatures); at run time __getattr__ imports each
    # on first use instead: ``import bundlefs`` (which every ``bundlefs.*`` import runs first)
    # loads no reader, so the CLI's parser, a mount and a pack each import only what they use.
    from bundlefs.packing.compact import CompactOptions, compact
    from bundlefs.packing.options import PackOptions
    from bundlefs.packing.packer import pack
    from bundlefs.packing.writer import Writer
    from bundlefs.read.bundle import Bundle
    from bundlefs.read.diff import diff
    from bundlefs.read.fileobj import BundleFile
    from bundlefs.read.options import ReadOptions, RemoteOptions
    from bundlefs.read.paths import BundleStat

__version__ = "0.1.0"

# Public name → the module that defines it, imported on first use.
_LAZY = {
    "Bundle": "bundlefs.read.bundle",
    "BundleFile": "bundlefs.read.fileobj",
    "BundleStat": "bundlefs.read.paths",
    "CompactOptions": "bundlefs.packing.compact",
    "PackOptions": "bundlefs.packing.options",
    "ReadOptions": "bundlefs.read.options",
    "RemoteOptions": "bundlefs.read.options",
    "Writer": "bundlefs.packing.writer",
    "compact": "bundlefs.packing.compact",
    "diff": "bundlefs.read.diff",
    "pack": "bundlefs.packing.packer",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bundlefs' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found once: later uses are plain attribute lookups
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BaseBundleError",
    "Bundle",
    "BundleError",
    "BundleFile",
    "BundleStat",
    "CompactOptions",
    "CorruptDataError",
    "DuplicatePathError",
    "EntryNotFound",
    "FormatError",
    "IncompleteBundleError",
    "InvalidEntryError",
    "IsADirectory",
    "NotABundleError",
    "NotADirectory",
    "NotARegularFile",
    "PackError",
    "ReadOptions",
    "RemoteOptions",
    "PackOptions",
    "UnsupportedVersionError",
    "Writer",
    "compact",
    "pack",
    "diff",
    "__version__",
]
