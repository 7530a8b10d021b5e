"""bundlefs: millions of small files as one immutable, compressed, randomly seekable bundle.

``Bundle`` reads a bundle without FUSE; ``pack`` writes one. The FUSE mount lives in
``bundlefs.fs``/``bundlefs.mount`` and is imported only when used.
"""

from .bundle import Bundle, BundleFile, BundleStat
from .errors import (
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
from .packer import PackOptions, pack

__version__ = "0.1.0"

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
