"""What a mount checks before it mounts, each failure one sentence: the FUSE bindings,
``/dev/fuse``, a usable, empty mount point, the open path asked for; how many processes will
serve; the options handed to the kernel.

These are what a first attempt most often lacks; nothing here mounts, opens the bundle or forks.

May import: the standard library, ``bundlefs.errors``, ``bundlefs.storage``,
``bundlefs.mount.bindings``, ``bundlefs.mount.kernel``, ``bundlefs.mount.options``,
``bundlefs.mount.table``.
"""

from __future__ import annotations

import errno
import os
import stat
from types import ModuleType

from bundlefs.errors import MountError
from bundlefs.mount.bindings import WITHOUT_FUSE, stock_reason
from bundlefs.mount.bindings import load as load_fuse_bindings
from bundlefs.mount.kernel import FUSE_DEVICE, no_open_unavailable
from bundlefs.mount.options import MountOptions, default_workers
from bundlefs.mount.table import mount_info
from bundlefs.storage.location import parse_location

_FUSE_DEVICE_NUMBER = os.makedev(10, 229)  # the misc device the kernel's fuse module registers


def check(options: MountOptions) -> ModuleType:
    """The FUSE binding, once this process can mount ``options`` with it; else a ``MountError``."""
    pyfuse3 = load_fuse_bindings()  # or a one-sentence MountError
    check_mountpoint(options.mountpoint, allow_nonempty=options.allow_nonempty)
    check_fuse_device()
    if options.open_mode == "no-open" and (reason := no_open_unavailable()) is not None:
        raise MountError(f"--open-mode no-open is not available: {reason}")
    return pyfuse3


def check_mountpoint(path: str, *, allow_nonempty: bool = False) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MountError(f"mountpoint {path} does not exist") from None
    except NotADirectoryError:
        raise MountError(f"mountpoint {path} is not a directory") from None
    except OSError as e:
        raise MountError(f"mountpoint {path} is not usable: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise MountError(f"mountpoint {path} is not a directory")
    covering = mount_info(path)
    if covering is not None and covering.fstype == "autofs":
        return  # a systemd automount point: we are the mount it triggered, on top of it
    if covering is not None:
        raise MountError(f"mountpoint {path} is busy: something is already mounted there")
    if not allow_nonempty and _has_entries(path):
        raise MountError(
            f"mountpoint {path} is not empty and the mount would hide what it holds; "
            "use --allow-nonempty (-o nonempty) to mount over it anyway"
        )


def _has_entries(path: str) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is not None
    except OSError:
        return False  # cannot be listed by us: nothing we could hide from ourselves


def check_fuse_device() -> None:
    """That this process can reach FUSE: ``/dev/fuse`` opens and is the FUSE device.

    Opening it without mounting creates nothing (the connection goes with the descriptor). A
    user who may not open it can still mount through the setuid ``fusermount3``.
    """
    try:
        fd = os.open(FUSE_DEVICE, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        raise MountError(
            f"{FUSE_DEVICE} does not exist, so FUSE is not available here (load the module "
            f"with modprobe fuse, or give a container the device); {WITHOUT_FUSE}"
        ) from None
    except OSError as e:
        if e.errno == errno.EACCES and os.getuid() != 0 and _installed("fusermount3"):
            return
        raise MountError(
            f"cannot open {FUSE_DEVICE} ({e.strerror}), so FUSE is not available here; "
            f"{WITHOUT_FUSE}"
        ) from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISCHR(st.st_mode) or st.st_rdev != _FUSE_DEVICE_NUMBER:
        raise MountError(
            f"{FUSE_DEVICE} is not the FUSE device, so FUSE is not available here; {WITHOUT_FUSE}"
        )
    if os.getuid() != 0 and not _installed("fusermount3"):
        raise MountError("not permitted: fusermount3 is not installed (apt-get install fuse3)")


def _installed(tool: str) -> bool:
    import shutil  # here: its ~5 ms of imports (bz2, lzma) are not root's mount's start

    return shutil.which(tool) is not None


def choose_workers(options: MountOptions, pyfuse3: ModuleType) -> tuple[int, str]:
    """How many processes serve the mount, and why only one where that is so ("" if chosen)."""
    if options.workers is not None and options.workers < 1:
        raise MountError(f"--workers must be at least 1, not {options.workers}")
    if options.workers is None and not parse_location(options.bundle).is_local:
        # Reads of a bundle at a URL wait on the network, not on this process's CPU, and one
        # process keeps the store's outage state, single-flight GETs and read-ahead together:
        # with several, each would wait out an outage's first timeout on its own.
        return 1, "a bundle at a URL (--workers N to choose several)"
    wanted = options.workers if options.workers is not None else default_workers()
    if options.workers == 1:
        return 1, ""
    if not hasattr(pyfuse3, "get_session_fd"):
        # The daemon's first log line: on a stock binding, what it costs and the fix (bindings).
        why = stock_reason() or "the patched build can: make install; third_party/pyfuse3"
        return 1, f"this pyfuse3 cannot share a mount between processes ({why})"
    if options.open_mode == "open":
        return 1, "--open-mode open"
    return wanted, ""


def fuse_options(options: MountOptions) -> set[str]:
    """The options ``pyfuse3.init`` hands the kernel (and fusermount3) for ``options``."""
    fsname = options.bundle.replace("\\", "\\\\").replace(",", "\\,")
    opts = {
        f"fsname={fsname}",
        "subtype=bundlefs",
        "ro",
        "nosuid",
        "nodev",
        "default_permissions",
    }
    if options.auto_unmount:
        opts.add("auto_unmount")  # a killed daemon's mount disappears instead of going stale
    if options.allow_other:
        opts.add("allow_other")
    return opts
