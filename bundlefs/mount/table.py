"""The kernel's mount table: what is mounted where, read from /proc/self/mountinfo.

One parser for the CLI (``info MNT``, ``umount``), the daemon (busy mount points), the tests and
the benchmarks. Reading the table never touches the mount itself, so it cannot hang on a dead or
busy daemon, and it imports no FUSE binding. The daemon's own answers (its counters, the bundle it
serves) are xattrs of the mount root, read here too.
May import: the standard library, ``bundlefs.errors``, ``bundlefs.core``.
"""

from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import dataclass

from bundlefs.core.format import XATTR_BUNDLE, XATTR_STATS
from bundlefs.errors import MountError

BUNDLEFS_FSTYPE = "fuse.bundlefs"
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class MountInfo:
    device: str  # major:minor
    fstype: str  # "fuse.bundlefs", "ext4", …
    source: str  # for bundlefs, the bundle served
    mountpoint: str  # as the kernel lists it: absolute, symlinks resolved


def mounts() -> list[MountInfo]:
    """Every mount this process can see, in table order (a later mount covers an earlier one).

    A FUSE mount whose daemon died is listed too, as long as the kernel keeps it.
    """
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            fields, rest = head.split(), tail.split()
            if len(fields) > 4 and len(rest) > 1:
                found.append(
                    MountInfo(
                        device=fields[2],
                        fstype=rest[0],
                        source=unescape_mount_field(rest[1]),
                        mountpoint=unescape_mount_field(fields[4]),
                    )
                )
    return found


def mount_info(path: str | os.PathLike[str]) -> MountInfo | None:
    """What is mounted on ``path`` (the topmost mount), from /proc/self/mountinfo, or None.

    The table, not ``stat``: touching a dead FUSE daemon's mount fails with ENOTCONN, and a
    request to a live one could race an unmount and make it fail with EBUSY.
    """
    target = resolved_mount_path(path)
    found = None
    for info in mounts():
        if info.mountpoint == target:
            found = info
    return found


def is_mountpoint(path: str | os.PathLike[str]) -> bool:
    """Whether something is mounted on ``path`` (a dead FUSE daemon's mount included)."""
    return mount_info(path) is not None


def mounted_bundle(path: str | os.PathLike[str]) -> str | None:
    """The bundle served on ``path`` if it is a bundlefs mount point, else None."""
    info = mount_info(path)
    return info.source if info is not None and info.fstype == BUNDLEFS_FSTYPE else None


def daemon_stats(mountpoint: str | os.PathLike[str]) -> dict[str, object]:
    """The serving daemon's counters (cache hits, misses, evictions, bytes decompressed, EIOs).

    An xattr of the mount root: reading it needs no FUSE binding in this process.
    """
    try:
        return json.loads(os.getxattr(mountpoint, XATTR_STATS))
    except (OSError, ValueError) as e:
        raise MountError(f"cannot read the daemon statistics of {mountpoint}: {e}") from None


def served_bundle(mountpoint: str | os.PathLike[str]) -> dict[str, object] | None:
    """The facts of the bundle the daemon serves (``Bundle.info().to_dict()``, as it opened it).

    The daemon's answer, not the directory's: ``pack --force`` may have put a new bundle at the
    path since, while the daemon serves the one it opened. None from a daemon too old to say.
    """
    try:
        facts = json.loads(os.getxattr(mountpoint, XATTR_BUNDLE))
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.EOPNOTSUPP):
            return None
        raise MountError(f"cannot ask the daemon of {mountpoint} what it serves: {e}") from None
    except ValueError as e:
        raise MountError(f"the daemon of {mountpoint} answered nonsense: {e}") from None
    if not isinstance(facts, dict):
        raise MountError(f"the daemon of {mountpoint} answered nonsense: {facts!r}")
    return facts


def resolved_mount_path(path: str | os.PathLike[str]) -> str:
    """``path`` with its directory's symlinks resolved, as the kernel lists mount points.

    The last component is not looked up: it may be this daemon's own mount root, and a lookup
    from the event loop would wait for an answer only the event loop can give.
    """
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def unescape_mount_field(field: str) -> str:
    """A path field of the table as it is: the kernel writes space, tab, newline and backslash
    as octal escapes (``\\040``, ``\\011``, ``\\012``, ``\\134``)."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m[1], 8)), field)
