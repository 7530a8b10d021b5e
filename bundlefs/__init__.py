"""bundlefs: millions of small files as one immutable, compressed, randomly seekable bundle.

``Bundle`` reads a bundle without FUSE; ``pack`` writes one. The FUSE mount lives in
``bundlefs.mount`` and is imported only when used; so is the packer, which a
mount never needs (every millisecond of import is a millisecond before a mount is ready).

May import: ``bundlefs.errors``, ``bundlefs.read`` (and ``bundlefs.packing``, lazily).
"""

from bundlefs.errors import (
    BundleError,
    CorruptDataError,
    EntryNotFound,
    FormatError,
    IncompleteBundleError,
    IsADirectory,
    NotABundleError,
    NotADirectory,
    PackError,
    UnsupportedVersionError,
)
from bundlefs.read.bundle import Bundle, BundleFile, BundleStat

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    if name in ("pack", "PackOptions"):
        from bundlefs.packing import packer

        return getattr(packer, name)
    raise AttributeError(f"module 'bundlefs' has no attribute {name!r}")


__all__ = [
    "Bundle",
    "BundleError",
    "BundleFile",
    "BundleStat",
    "CorruptDataError",
    "EntryNotFound",
    "FormatError",
    "IncompleteBundleError",
    "IsADirectory",
    "NotABundleError",
    "NotADirectory",
    "PackError",
    "PackOptions",
    "UnsupportedVersionError",
    "pack",
    "__version__",
]
