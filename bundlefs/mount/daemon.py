"""The mount daemon's lifecycle: mounting, daemonizing, signals, systemd notify, unmount.

It takes a ``MountOptions`` (the command line builds one: ``bundlefs.cli.mount``) and parses no
arguments and renders nothing; where its log goes is the caller's choice (``LogSetup``). It defines
no file-system semantics (that is ``operations``). The sequence follows what pyfuse3 allows:
``pyfuse3.init`` mounts without starting threads; in daemon mode we fork after it, the child runs
the trio loop, and the parent exits 0 only once the child reports that the kernel handshake
happened — so a script can use the mount on its very next line. Before any of that, ``mount``
checks what a first attempt most often lacks (the FUSE bindings, ``/dev/fuse``, a usable, empty
mount point) and says so in one sentence.

May import: the library layers, ``bundlefs.mount`` (pyfuse3 and trio only inside ``mount``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from bundlefs.core.libc import set_mmap_threshold
from bundlefs.errors import BundleError, MountError
from bundlefs.mount import worker
from bundlefs.mount.bindings import WITHOUT_FUSE, stock_reason
from bundlefs.mount.bindings import load as load_fuse_bindings
from bundlefs.mount.supervisor import Supervisor
from bundlefs.mount.table import BUNDLEFS_FSTYPE, mount_info, resolved_mount_path
from bundlefs.mount.worker import FUSE_DEVICE
from bundlefs.read.bundle import Bundle
from bundlefs.read.options import DEFAULT_CACHE_SIZE, RemoteOptions
from bundlefs.storage.location import parse_location

if TYPE_CHECKING:
    from bundlefs.mount.operations import BundleOperations

log = logging.getLogger("bundlefs")

READY_TIMEOUT = 60.0
DEFAULT_READ_AHEAD_KB = 1024
DEFAULT_INDEX_RESIDENT = 256 * 1024 * 1024  # ~3.5 million entries at ~70 bytes each
_RECORD_BUFFER_MMAP_THRESHOLD = 128 * 1024

# Called once the mount is up, with True in the foreground (the log goes to stderr unless a log
# file is set) and False in the detached daemon (its stderr is /dev/null: a log file or syslog).
LogSetup = Callable[[bool], None]


@dataclass(frozen=True)
class MountOptions:
    """How to mount and serve one bundle; ``log_file`` and ``debug`` are for the ``LogSetup``."""

    bundle: str
    mountpoint: str
    foreground: bool = False
    cache_size: int = DEFAULT_CACHE_SIZE
    allow_other: bool = False
    uid: int | None = None
    gid: int | None = None
    read_ahead_kb: int = DEFAULT_READ_AHEAD_KB
    load_threads: int | None = None  # None: load_threads_for(...)
    open_mode: str = "auto"
    index_resident: int = DEFAULT_INDEX_RESIDENT
    prefetch: bool = True
    check_index: bool = True
    strict: bool = False  # refuse a bundle with a damaged shard instead of serving the rest
    log_file: str | None = None
    debug: bool = False
    auto_unmount: bool = True
    allow_nonempty: bool = False
    workers: int | None = None  # serving processes; None: default_workers()
    # A bundle at a URL (``bundle`` is then the URL): the store's options, which stay in this
    # process (the daemon forks from it, so they never appear on a command line or in the mount
    # table), and the on-disk record cache (docs/storage.md).
    storage_options: dict[str, Any] | None = None
    disk_cache: str | None = None
    disk_cache_size: int | None = None
    store_timeout: float | None = None

    def remote_options(self) -> dict[str, Any]:
        """The ``Bundle`` keywords of a bundle at a URL that were given (none for a local one)."""
        remote = (self.storage_options, self.disk_cache, self.disk_cache_size, self.store_timeout)
        return RemoteOptions(*remote).given()


def default_workers() -> int:
    """Serving processes when ``--workers`` is not given: one per CPU, at most 8.

    Cold reads scale with processes up to the cores (docs/performance.md); past 8 the kernel's
    single request queue and the disk are the limit, and each worker holds its own cache share.
    """
    return max(1, min(os.cpu_count() or 1, 8))


_FUSE_DEVICE_NUMBER = os.makedev(10, 229)  # the misc device the kernel's fuse module registers


# -- mounting ------------------------------------------------------------------------------------


def _check_mountpoint(path: str, *, allow_nonempty: bool = False) -> None:
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


def _check_fuse_device() -> None:
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
        if e.errno == errno.EACCES and os.getuid() != 0 and shutil.which("fusermount3"):
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
    if os.getuid() != 0 and not shutil.which("fusermount3"):
        raise MountError("not permitted: fusermount3 is not installed (apt-get install fuse3)")


def _fuse_options(options: MountOptions) -> set[str]:
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


def mount(options: MountOptions, log_setup: LogSetup | None = None) -> int:
    """Mount and serve until unmounted or signalled. Returns the exit code.

    ``log_setup`` is called once mounted (in the daemon, after it detached); without one the
    logging configuration is left as it is.
    """
    pyfuse3 = load_fuse_bindings()  # or a one-sentence MountError
    _check_mountpoint(options.mountpoint, allow_nonempty=options.allow_nonempty)
    _check_fuse_device()
    _return_freed_buffers_to_the_os()
    # Open (and so validate) the bundle before mounting: a bad bundle fails here, clearly.
    # No name tables: the kernel's dentry cache (1-year timeouts) already remembers every name it
    # looked up, so each name reaches the daemon about once. Measured on 100,000 files: cold
    # random reads the same within noise (878-973 vs 830-942 files/s), 5.6 MB less memory, and
    # none that grows with the number of names.
    bundle = Bundle(
        options.bundle,
        cache_size=options.cache_size,
        check_index=options.check_index,
        name_cache=0,
        **options.remote_options(),
    )
    for damage in bundle.damaged_shards:
        log.warning("%s: %s; reads of what it lacks fail with EIO", options.bundle, damage)
    if bundle.damaged_shards and options.strict:
        bundle.close()
        raise MountError(f"{options.bundle} is damaged; refusing to mount it (--strict)")

    from bundlefs.mount.operations import BundleOperations, MountSettings, no_open_unavailable

    if options.open_mode == "no-open" and (reason := no_open_unavailable()) is not None:
        bundle.close()
        raise MountError(f"--open-mode no-open is not available: {reason}")

    workers, single_reason = _choose_workers(options, pyfuse3)
    ready_read, ready_write = (None, None) if options.foreground else os.pipe()

    def signal_ready() -> None:
        log.info("mounted %s on %s", options.bundle, options.mountpoint)
        try:
            if options.read_ahead_kb:
                _set_read_ahead(options)  # before "ready": the first big read already gains
        finally:
            if ready_write is not None:
                with contextlib.suppress(OSError):  # the parent is gone (interrupted): serve on
                    os.write(ready_write, b"1")
                os.close(ready_write)
            notify_systemd(f"READY=1\nSTATUS=serving {options.bundle}")

    def hold_index() -> None:
        if 0 < bundle.info().index_bytes <= options.index_resident:
            threading.Thread(
                target=_hold_index_resident, args=(bundle,), name="bundlefs-index", daemon=True
            ).start()

    async def announce_ready() -> None:
        hold_index()
        signal_ready()

    def on_ready() -> None:
        # pyfuse3 calls this while handling FUSE_INIT, before it replies; the kernel applies the
        # reply (and its own read-ahead default) when it arrives. A task started here runs after
        # the reply is written, so "ready" means the handshake is complete.
        import trio

        trio.lowlevel.spawn_system_task(announce_ready)

    settings = MountSettings(
        uid=options.uid,
        gid=options.gid,
        load_threads=_load_threads(options, workers, bundle),
        open_mode=options.open_mode,
        prefetch=options.prefetch,
    )
    ops = BundleOperations(bundle, settings, on_ready if workers == 1 else None)
    ops.single_process_reason = single_reason
    try:
        pyfuse3.init(ops, options.mountpoint, _fuse_options(options))
    except RuntimeError as e:
        bundle.close()
        raise MountError(f"cannot mount on {options.mountpoint}: {e}") from None

    if ready_read is not None and ready_write is not None:  # not in the foreground
        pid = os.fork()
        if pid:
            os.close(ready_write)
            # The parent must not unmount or close anything the child now owns.
            os._exit(_wait_for_child(ready_read, pid))
        os.close(ready_read)
        _become_daemon()
        if log_setup is not None:
            log_setup(False)
    elif log_setup is not None:
        log_setup(True)
    ops.daemon_facts = daemon_facts(options)
    if workers == 1:
        if single_reason:
            log.info("serving in one process: %s", single_reason)
        return _serve(ops, pyfuse3, lambda: _exit_code(worker.serve(ops, pyfuse3)))

    def serve_workers() -> int:
        if not worker.handshake(ops, pyfuse3):
            log.info("the file system went away before the kernel handshake")
            return 0
        if ops.open_mode != "no-open":  # the kernel refused no_open: the open path
            ops.single_process_reason = f"the open path ({ops.open_mode_reason})"
            log.info("serving in one process: %s", ops.single_process_reason)
            hold_index()
            signal_ready()
            return _exit_code(worker.serve(ops, pyfuse3))
        supervisor = Supervisor(
            ops,
            pyfuse3,
            workers,
            cache_size=options.cache_size,
            worker_setup=lambda slot: hold_index() if slot == 0 else None,
            auto_unmount=options.auto_unmount,
        )
        return supervisor.run(signal_ready)

    return _serve(ops, pyfuse3, serve_workers)


def _load_threads(options: MountOptions, workers: int, bundle: Bundle) -> int:
    """Threads for record loads in each serving process, unless ``--threads`` says.

    One process: 4, so a disk read does not stall every other request. Several workers: 0, every
    load inline: the other workers serve meanwhile, and the thread hop (60-70 µs a read here)
    is saved. A bundle on an object store keeps its threads (a miss may wait on the network).
    """
    if options.load_threads is not None:
        return options.load_threads
    return 4 if workers == 1 or bundle.content.reads_may_stall else 0


def _exit_code(ended: int) -> int:
    """The daemon's exit code for how a serving loop ended: unmounted or stopped, both fine."""
    return 0 if ended in (worker.ENDED_UNMOUNTED, worker.ENDED_BY_SIGNAL) else 1


def daemon_facts(options: MountOptions) -> dict[str, object]:
    """What ``info MNT`` says of the daemon itself: its PID (the supervisor's, where workers
    serve), when it started, its version, where it logs and its effective options. Storage
    options are named, never shown: they may hold credentials."""
    from bundlefs import __version__

    shown = dataclasses.asdict(options)
    shown["storage_options"] = sorted(options.storage_options or {})
    return {
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "version": __version__,
        "log": options.log_file or ("stderr" if options.foreground else "syslog"),
        "options": shown,
    }


def _choose_workers(options: MountOptions, pyfuse3: ModuleType) -> tuple[int, str]:
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
    if wanted == 1:
        return 1, "this machine has one CPU"
    if options.open_mode == "open":
        return 1, "--open-mode open"
    return wanted, ""


def _wait_for_child(ready_read: int, pid: int) -> int:
    import select

    ready, _, _ = select.select([ready_read], [], [], READY_TIMEOUT)
    if ready and os.read(ready_read, 1) == b"1":
        return 0
    log.error("the mount daemon did not become ready (see its log)")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    return 1


def _become_daemon() -> None:
    os.setsid()
    os.chdir("/")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _serve(ops: BundleOperations, pyfuse3: ModuleType, serve: Callable[[], int]) -> int:
    """Run ``serve``, then unmount and close whatever way it ended; the exit code."""
    code = 1
    try:
        code = serve()
    except BaseException:
        log.exception("the file system loop failed")
        code = 1
    finally:
        notify_systemd("STOPPING=1")
        pyfuse3.close(unmount=True)
        ops.close()
    log.info("unmounted; stats %s", json.dumps(ops.stats(), sort_keys=True))
    return code


def _hold_index_resident(bundle: Bundle) -> None:
    """Fault the index in and keep it mapped, off the event loop, after readiness.

    Cold lookups then cost no disk reads: each was a B-tree walk of page faults on the event loop
    (see docs/performance.md for the figures). In the background, so it never delays readiness.
    """
    started = time.monotonic()
    try:
        size = bundle.hold_index_resident()
    except (OSError, BundleError) as e:
        log.info("index not held in memory: %s", e)
        return
    elapsed_ms = (time.monotonic() - started) * 1e3
    log.info("index held in memory: %s bytes in %.0f ms", f"{size:,}", elapsed_ms)


def _return_freed_buffers_to_the_os() -> None:
    """Keep freed record buffers from piling up in glibc's heaps.

    Records (256 KiB) are allocated and freed all the time, by several threads. glibc raises its
    mmap threshold after the first such free, and from then on serves them from per-thread heaps
    that do not shrink: the soak test measured 100 MiB RSS for a 32 MiB cache. A fixed threshold
    keeps each buffer its own mapping, returned to the OS when freed (65 MiB in the same test).
    """
    try:
        set_mmap_threshold(_RECORD_BUFFER_MMAP_THRESHOLD)
    except OSError as e:  # not glibc: nothing to tune
        log.debug("mallopt unavailable: %s", e)


def _set_read_ahead(options: MountOptions) -> None:
    """Raise the kernel's read-ahead for this mount (root only): big sequential reads gain ~2.5×."""
    try:
        info = mount_info(options.mountpoint)
        if info is None:
            return
        with open(f"/sys/class/bdi/{info.device}/read_ahead_kb", "w") as f:
            f.write(str(options.read_ahead_kb))
    except OSError as e:
        log.debug("could not set read_ahead_kb: %s", e)


def notify_systemd(message: str) -> None:
    """Send ``message`` to systemd's notify socket, if we were started with one."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as e:
        log.warning("could not notify systemd: %s", e)


# -- unmounting ----------------------------------------------------------------------------------


def unmount(mountpoint: str, *, lazy: bool = False, force: bool = False) -> None:
    """Unmount a bundlefs mount, including a stale one whose daemon is gone; any other mount
    only with ``force`` (a mistyped path must never take down someone else's file system)."""
    path = resolved_mount_path(mountpoint)
    info = mount_info(path)
    if info is None:
        raise MountError(f"{mountpoint} is not a mount point")
    if info.fstype != BUNDLEFS_FSTYPE and not force:
        raise MountError(
            f"{mountpoint} is not a bundlefs mount (it is {info.fstype}); refusing to unmount "
            "it (use --force, or fusermount3 -u or umount, for other file systems)"
        )
    # Never stat the mount first: a hung daemon would hang us too. A dead daemon's mount is
    # unmounted like any other; only a busy one needs --lazy.
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool:
        command = [tool, "-u"] + (["-z"] if lazy else []) + [path]
    else:
        command = ["umount"] + (["-l"] if lazy else []) + [path]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        reason = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed"
        if "busy" in reason.lower():
            raise MountError(f"{mountpoint} is busy (a process uses it); try --lazy")
        raise MountError(f"cannot unmount {mountpoint}: {reason}")
