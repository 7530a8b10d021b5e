"""The extended attributes an entry shows through the mount: what the bundle stores of it (file
CRC, digest, user data, media type, a directory's stored totals) and, on the root, the daemon's
figures and the bundle it serves. Computed per request; nothing is held.

Names in namespaces a bundle never stores are "not supported" (``unsupported``) rather than
"no such attribute".

May import: the standard library, ``bundlefs.core``, ``bundlefs.read``.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from bundlefs.core import format as fmt
from bundlefs.read.bundle import Bundle

# ``ls -l`` asks every entry for ``security.selinux`` and ``system.posix_acl_access`` (two
# requests per entry, each a trip through the daemon, none cached by the kernel). Answered "not
# supported" rather than "no such attribute", GNU ls remembers that per file system and stops
# asking after the first entry.
_UNSUPPORTED_NAMESPACES = (b"security.", b"system.", b"trusted.")


def unsupported(name: bytes) -> bool:
    """Whether ``name`` lies in a namespace no bundle stores (answer ``EOPNOTSUPP``)."""
    return name.startswith(_UNSUPPORTED_NAMESPACES)


def values(
    bundle: Bundle, entry: fmt.Entry, figures: Callable[[], dict[str, object]]
) -> dict[bytes, bytes]:
    """Every attribute of ``entry`` by name; ``figures`` gives the root's stats attribute."""
    found: dict[bytes, bytes] = {}
    if entry.is_file:
        found[fmt.XATTR_CRC] = f"{entry.crc32c:08x}".encode()
        if entry.digest:
            found[fmt.XATTR_DIGEST] = entry.digest.hex().encode()
    elif entry.is_dir and (totals := bundle.tree.stored_totals(entry.ino)) is not None:
        # Only stored totals (version 5): a walk of an older bundle's subtree would make one
        # getxattr as slow as ``du`` of the whole tree.
        found[fmt.XATTR_TREE] = json.dumps(totals.to_dict(), sort_keys=True).encode()
    if entry.user_data:
        found[fmt.XATTR_USER_DATA] = entry.user_data
    content_type = bundle.tree.content_type(entry)
    if content_type is not None:
        found[fmt.XATTR_CONTENT_TYPE] = content_type.encode()
    if entry.ino == fmt.ROOT_INO:
        # The counters (what SIGUSR1 logs), and the daemon's own facts for info MNT.
        found[fmt.XATTR_STATS] = json.dumps(figures(), sort_keys=True).encode()
        # What this daemon serves, which a later pack --force may have replaced on disk.
        found[fmt.XATTR_BUNDLE] = json.dumps(bundle.info().to_dict()).encode()
    return found
