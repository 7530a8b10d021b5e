"""bundlefs: millions of small files as one immutable, compressed, randomly seekable bundle.

``Bundle`` reads a bundle without FUSE; ``pack`` writes one. The FUSE mount lives in
``bundlefs.fs``/``bundlefs.mount`` and is imported only when used; so is the packer, which a
mount never needs (every millisecond of import is a millisecond before a mount is ready).
"""

from typing import Any

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

__version__ = "0.1.0"

_LAZY = {"pack": "packer", "PackOptions": "packer"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bundlefs' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


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
