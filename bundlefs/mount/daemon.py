"""``mount``, the daemon's sequence (preflight → open the bundle → mount → detach → serve), and
``unmount``.

It takes a ``MountOptions`` (the command line builds one: ``bundlefs.cli.mount``) and parses no
arguments and renders nothing; where its log goes is the caller's choice (``LogSetup``). It defines
no file-system semantics (that is ``operations``), and each step is done by a room of its own:
``preflight`` checks what a first attempt most often lacks and says so in one sentence;
``pyfuse3.init`` mounts without starting threads; ``lifecycle`` detaches (the parent exits 0 only
once the child reports that the kernel handshake happened, so a script can use the mount on its
very next line); ``tuning`` adjusts around the file system; then one process serves
(``worker``) or several do (``supervisor``, forked after the handshake). The supervisor opens
nothing after the fork; each worker owns its LMDB environment and threads (docs/concurrency.md).

May import: the library layers, ``bundlefs.mount`` (pyfuse3 and trio only inside ``mount``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from bundlefs.errors import MountError
from bundlefs.mount import lifecycle, preflight, tuning, worker
from bundlefs.mount.options import LogSetup, MountOptions
from bundlefs.mount.supervisor import Supervisor
from bundlefs.mount.table import BUNDLEFS_FSTYPE, mount_info, resolved_mount_path
from bundlefs.read.bundle import Bundle
from bundlefs.storage import native

if TYPE_CHECKING:
    from bundlefs.mount.operations import BundleOperations

log = logging.getLogger("bundlefs")


# -- mounting ------------------------------------------------------------------------------------


def mount(options: MountOptions, log_setup: LogSetup | None = None) -> int:
    """Mount and serve until unmounted or signalled. Returns the exit code.

    ``log_setup`` is called once mounted (in the daemon, after it detached); without one the
    logging configuration is left as it is.
    """
    pyfuse3 = preflight.check(options)  # or a one-sentence MountError
    workers, single_reason = preflight.choose_workers(options, pyfuse3)
    tuning.return_freed_buffers_to_the_os()
    bundle = _open_bundle(options)
    startup = _Startup(options, bundle)
    ops = _adapter(options, bundle, workers)
    ops.mount_stats.single_process_reason = single_reason
    if workers == 1:
        ops.on_ready = worker.after_handshake(startup.ready_in_one_process)
    try:
        pyfuse3.init(ops, options.mountpoint, preflight.fuse_options(options))
    except RuntimeError as e:
        bundle.close()
        raise MountError(f"cannot mount on {options.mountpoint}: {e}") from None
    if not options.foreground:
        startup.readiness.detach()  # from here on, this process is the daemon
    if log_setup is not None:
        log_setup(options.foreground)
    if native.module is None:  # the same bytes, ~15-20 % more CPU a cold file (performance.md)
        log.info("index steps in Python: bundlefs.storage._native %s", native.status)
    ops.mount_stats.daemon_facts = daemon_facts(options)
    if workers == 1:
        if single_reason:
            log.info("serving in one process: %s", single_reason)
        return _serve(ops, pyfuse3, lambda: _exit_code(worker.serve(ops, pyfuse3)))
    return _serve(ops, pyfuse3, lambda: _serve_workers(ops, pyfuse3, workers, startup))


def _open_bundle(options: MountOptions) -> Bundle:
    """The bundle, opened (and so validated) before mounting: a bad bundle fails here, clearly."""
    # No name tables: the kernel's dentry cache (1-year timeouts) already remembers every name it
    # looked up, so each name reaches the daemon about once. Measured on 100,000 files: cold
    # random reads the same within noise (878-973 vs 830-942 files/s), 5.6 MB less memory, and
    # none that grows with the number of names.
    bundle = Bundle(options.bundle, options=dataclasses.replace(options.read, name_cache=0))
    for damage in bundle.damaged_shards:
        log.warning("%s: %s; reads of what it lacks fail with EIO", options.bundle, damage)
    if bundle.damaged_shards and options.strict:
        bundle.close()
        raise MountError(f"{options.bundle} is damaged; refusing to mount it (--strict)")
    return bundle


def _adapter(options: MountOptions, bundle: Bundle, workers: int) -> BundleOperations:
    from bundlefs.mount.operations import BundleOperations, MountSettings  # (loads pyfuse3)

    settings = MountSettings(
        uid=options.uid,
        gid=options.gid,
        load_threads=tuning.load_threads(options, workers, bundle),
        open_mode=options.open_mode,
        prefetch=options.prefetch,
        readdirplus=options.readdirplus,
    )
    return BundleOperations(bundle, settings)


class _Startup:
    """What happens once the kernel handshake is done: say so, tune the mount, hold the index."""

    def __init__(self, options: MountOptions, bundle: Bundle) -> None:
        self.options = options
        self.bundle = bundle
        self.readiness = lifecycle.Readiness()

    def hold_index(self) -> None:
        tuning.hold_index(self.bundle, self.options.index_resident)

    def ready(self) -> None:
        options = self.options
        log.info("mounted %s on %s", options.bundle, options.mountpoint)
        try:
            if options.read_ahead_kb:  # before "ready": the first big read already gains
                tuning.set_read_ahead(options.mountpoint, options.read_ahead_kb)
        finally:
            self.readiness.ready(f"serving {options.bundle}")

    def ready_in_one_process(self) -> None:
        self.hold_index()
        self.ready()


def _serve_workers(
    ops: BundleOperations, pyfuse3: ModuleType, workers: int, startup: _Startup
) -> int:
    """Serve with ``workers`` processes, forked after the handshake; or in this one process
    where the kernel refused no-open (workers serve the no-open path only)."""
    if not worker.handshake(ops, pyfuse3):
        log.info("the file system went away before the kernel handshake")
        return 0
    if ops.open_mode != "no-open":  # the kernel refused no_open: the open path
        reason = f"the open path ({ops.open_mode_reason})"
        ops.mount_stats.single_process_reason = reason
        log.info("serving in one process: %s", reason)
        startup.ready_in_one_process()
        return _exit_code(worker.serve(ops, pyfuse3))
    supervisor = Supervisor(
        ops,
        pyfuse3,
        workers,
        cache_size=startup.options.read.cache_size,
        worker_setup=lambda slot: startup.hold_index() if slot == 0 else None,
        auto_unmount=startup.options.auto_unmount,
    )
    return supervisor.run(startup.ready)


def _serve(ops: BundleOperations, pyfuse3: ModuleType, serve: Callable[[], int]) -> int:
    """Run ``serve``, then unmount and close whatever way it ended; the exit code."""
    code = 1
    try:
        code = serve()
    except BaseException:
        log.exception("the file system loop failed")
        code = 1
    finally:
        lifecycle.notify_systemd("STOPPING=1")
        pyfuse3.close(unmount=True)
        ops.close()
    log.info("unmounted; stats %s", json.dumps(ops.stats(), sort_keys=True))
    return code


def _exit_code(ended: int) -> int:
    """The daemon's exit code for how a serving loop ended: unmounted or stopped, both fine."""
    return 0 if ended in (worker.ENDED_UNMOUNTED, worker.ENDED_BY_SIGNAL) else 1


def daemon_facts(options: MountOptions) -> dict[str, object]:
    """What ``info MNT`` says of the daemon itself: its PID (the supervisor's, where workers
    serve), when it started, its version, where it logs and its effective options. Storage
    options are named, never shown: they may hold credentials."""
    from bundlefs import __version__

    shown = dataclasses.asdict(options)
    read = shown.pop("read")  # shown flat, as the command line takes them
    shown.update(cache_size=read["cache_size"], check_index=read["check_index"], **read["remote"])
    shown["storage_options"] = sorted(options.read.remote.storage_options or {})
    return {
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "version": __version__,
        "log": options.log_file or ("stderr" if options.foreground else "syslog"),
        # "compiled", or why not ("not built (pure Python)", "stale: …"): ~13-17 % of a cold file
        "index_steps": native.status,
        "options": shown,
    }


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
    import shutil  # here: its ~5 ms of imports (bz2, lzma) are not every mount's start
    import subprocess

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
