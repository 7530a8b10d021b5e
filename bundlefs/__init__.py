"""bundlefs: millions of small files as one immutable, compressed, randomly seekable bundle.

``Bundle`` reads a bundle without FUSE; ``pack`` writes one from a tree, ``Writer`` from Python
objects, ``compact`` rewrites one without the stored bytes no file uses; ``diff`` lists what
changed between two, from their indexes. The FUSE mount lives in
``bundlefs.mount`` and is imported only when used; so is the packer, which a
mount never needs (every millisecond of import is a millisecond before a mount is ready).

May import: ``bundlefs.errors``, ``bundlefs.read`` (and ``bundlefs.packing``, lazily).
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
from bundlefs.read.bundle import Bundle
from bundlefs.read.diff import diff
from bundlefs.read.fileobj import BundleFile
from bundlefs.read.options import ReadOptions, RemoteOptions
from bundlefs.read.paths import BundleStat

if TYPE_CHECKING:
    # What type checkers and IDEs see (the real signatures); at run time __getattr__ imports the
    # packer on first use instead, so a mount or a reader never loads it.
    from bundlefs.packing.compact import CompactOptions, compact
    from bundlefs.packing.options import PackOptions
    from bundlefs.packing.packer import pack
    from bundlefs.packing.writer import Writer

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    if name == "pack":
        from bundlefs.packing.packer import pack

        return pack
    if name == "PackOptions":
        from bundlefs.packing.options import PackOptions

        return PackOptions
    if name == "Writer":
        from bundlefs.packing.writer import Writer

        return Writer
    if name in ("compact", "CompactOptions"):
        from bundlefs.packing import compact as compacting

        return getattr(compacting, name)
    raise AttributeError(f"module 'bundlefs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"pack", "PackOptions", "Writer", "compact", "CompactOptions"})


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
