"""The completion marker ``COMPLETE`` on local disk: ``write_marker`` (last step of a seal) and
``read_marker`` (what every reader checks first), and what a directory is when it has none
(``is_bundle``, a partial's name). Below both the LMDB reader and the publisher, so the reader
need not import the publisher to read the marker.

May import: ``bundlefs.core``, ``bundlefs.errors``.
"""

from __future__ import annotations

import os
import re
import stat as statmod

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.errors import IncompleteBundleError, NotABundleError, PackError, naming

# A bundle is built in ``.NAME.partial-PID`` beside its destination (storage/publish.py).
PARTIAL_TAG = ".partial-"
ANY_PARTIAL = re.compile(r"\..+" + re.escape(PARTIAL_TAG) + r"[0-9]+")


def not_a_bundle(dest: str) -> PackError:
    """The refusal to replace something at ``dest`` that is not a bundle (with ``force``)."""
    return PackError(f"{dest} exists and is not a bundle; refusing to replace it")


def read_marker(bundle_dir: str) -> fmt.Marker:
    """Read and validate ``COMPLETE``; explains what is wrong when it is absent."""
    path = os.path.join(bundle_dir, fmt.MARKER_NAME)
    try:
        with open(path, "rb") as f:
            data = f.read(fmt.MARKER_SIZE + 1)
    except FileNotFoundError:
        if not os.path.isdir(bundle_dir):
            raise NotABundleError(f"{bundle_dir} does not exist or is not a directory") from None
        if os.path.isdir(os.path.join(bundle_dir, fmt.INDEX_DIR)):
            parent, name = os.path.split(os.path.abspath(bundle_dir))
            if ANY_PARTIAL.fullmatch(name):
                raise IncompleteBundleError(
                    f"{bundle_dir} is a partial bundle (no completion marker): a pack under way, "
                    f"or what a killed one left, which 'bundlefs gc {parent}' removes"
                ) from None
            raise IncompleteBundleError(
                f"{bundle_dir} is an incomplete bundle (no completion marker: was pack killed?)"
            ) from None
        raise NotABundleError(f"{bundle_dir} is not a bundle (no completion marker)") from None
    except (IsADirectoryError, NotADirectoryError):
        raise NotABundleError(f"{bundle_dir} is not a bundle") from None
    return fmt.decode_marker(data, crc32c)


def write_marker(bundle_dir: str, marker: fmt.Marker) -> None:
    """Write ``COMPLETE`` and fsync it (its directory is the caller's to sync)."""
    path = os.path.join(bundle_dir, fmt.MARKER_NAME)
    with open(path, "wb") as f, naming(path):
        f.write(fmt.encode_marker(marker, crc32c))
        f.flush()
        os.fsync(f.fileno())


def is_bundle(path: str) -> bool:
    """Whether ``path`` is a bundle, complete or not, that ``force`` may replace.

    A real directory (not a symlink) with an ``index/`` directory and either ``COMPLETE`` or
    ``index/data.mdb``: every bundle has these, and a directory of anything else is not replaced.
    """
    try:
        if not statmod.S_ISDIR(os.lstat(path).st_mode):
            return False
        if not statmod.S_ISDIR(os.lstat(os.path.join(path, fmt.INDEX_DIR)).st_mode):
            return False
    except OSError:
        return False
    return any(
        os.path.isfile(os.path.join(path, p))
        for p in (fmt.MARKER_NAME, os.path.join(fmt.INDEX_DIR, fmt.INDEX_FILE))
    )
