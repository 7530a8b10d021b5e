"""``bundlefs mount`` and ``bundlefs umount``: flags and ``-o`` options to one ``MountOptions``.

The daemon's lifecycle is ``bundlefs.mount.daemon``; it is imported only when a command runs, so
building the parser (for any command) loads nothing of the mount. ``-o a,b=c`` is the form
mount(8), mount.fuse3 and fstab pass (``bundlefs BUNDLE MNT -o OPTS``; see ``cli.app``). Where
the detached daemon logs is decided here: ``--log-file``, else syslog, else (no ``/dev/log``:
containers, HPC nodes) a file under ``$XDG_STATE_HOME/bundlefs`` (``daemon_log_path``).

May import: the library layers, ``bundlefs.mount`` (the daemon only when a command runs),
``bundlefs.cli.output``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import TYPE_CHECKING

from bundlefs.cli.options import BUNDLE_HELP, seconds
from bundlefs.cli.output import EXIT_OK, LogTarget, setup_logging, size
from bundlefs.core.units import parse_size
from bundlefs.errors import MountError, MountOptionError
from bundlefs.read.options import DEFAULT_CACHE_SIZE, ReadOptions, RemoteOptions

if TYPE_CHECKING:
    from bundlefs.mount.options import MountOptions

# Options mount(8)/mount.fuse3 and fstab pass that mean nothing here (or that we always set).
_IGNORED_OPTIONS = {
    "ro", "rw", "dev", "nodev", "suid", "nosuid", "exec", "noexec", "auto", "noauto", "user",
    "nouser", "users", "defaults", "_netdev", "nofail", "async", "sync", "atime", "noatime",
    "relatime", "norelatime", "strictatime", "diratime", "nodiratime", "default_permissions",
    "auto_unmount", "loop", "owner", "group", "comment",
}  # fmt: skip

# -o options that take a text value; sizes among them are parsed once merged with the flags.
_TEXT_OPTIONS = (
    "cache_size", "owner", "log_file", "open_mode", "index_resident", "disk_cache",
    "disk_cache_size", "store_timeout", "readdirplus",
)  # fmt: skip
# libfuse transports and loop options that the worker processes do not use.
_UNSUPPORTED_TRANSPORTS = {"io_uring", "clone_fd", "max_threads", "max_idle_threads"}
_NUMBER_OPTIONS = ("uid", "gid", "read_ahead_kb", "workers")
_LIST_OPTIONS = ("storage_option", "storage_options_file")  # repeatable, in order
_OPEN_MODES, _READDIRPLUS = ("auto", "no-open", "open"), ("auto", "always", "never")
_SYSLOG_SOCKET = "/dev/log"


# -- mount ----------------------------------------------------------------------------------------


def add_mount_arguments(p: argparse.ArgumentParser) -> None:
    # The read-ahead and index-resident defaults named in the help are bundlefs.mount.options',
    # which building the parser does not import (tests/cli/test_first_contact.py keeps them equal).
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE_HELP)
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="an existing empty directory")
    p.add_argument("-f", "--foreground", action="store_true", help="stay attached, log to stderr")
    p.add_argument(
        "--cache-size",
        type=size,
        default=None,
        metavar="SIZE",
        help=f"record cache size, e.g. 512MiB (default: {DEFAULT_CACHE_SIZE >> 20}MiB)",
    )
    p.add_argument(
        "--allow-nonempty",
        action="store_true",
        help="mount over a directory that is not empty (hiding what it holds); -o nonempty",
    )
    p.add_argument("--allow-other", action="store_true", help="let other users use the mount")
    p.add_argument(
        "--owner",
        choices=("stored", "mounter"),
        default="stored",
        help="show the owners stored in the bundle (default), or the mounting user",
    )
    p.add_argument(
        "--uid", type=int, help="show every entry as owned by this uid (default: as --owner says)"
    )
    p.add_argument(
        "--gid", type=int, help="show every entry as owned by this gid (default: as --owner says)"
    )
    p.add_argument(
        "--read-ahead-kb",
        type=int,
        default=None,
        metavar="KIB",
        help="kernel read-ahead for the mount in KiB (root only; default: 1024)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="processes serving the mount (default: one per CPU, at most 8); one where the "
        "FUSE binding or the open path cannot share a mount; -o workers=N",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="record loads in parallel off each process's event loop (default: 4 in one "
        "process, 0 (inline) with several workers, 4 for a bundle at a URL)",
    )
    p.add_argument(
        "--open-mode",
        choices=_OPEN_MODES,
        default=None,
        help="no-open: the kernel serves opens and cached reads without asking the daemon "
        "(needs the patched pyfuse3 and Linux 5.1+); open: the daemon answers every open; "
        "auto (default): no-open where available",
    )
    p.add_argument(
        "--readdirplus",
        choices=_READDIRPLUS,
        default=None,
        help="listings with attributes (READDIRPLUS): auto (default: kernel's pick), always, never",
    )
    p.add_argument(
        "--index-resident",
        type=size,
        default=None,
        metavar="SIZE",
        help="keep the index in memory when it is at most this size, e.g. 1GiB (default: 256MiB; "
        "0: never)",
    )
    p.add_argument(
        "--no-prefetch",
        action="store_true",
        help="do not start reading a small file's bytes when it is looked up",
    )
    p.add_argument(
        "--no-index-check", action="store_true", help="skip the index checks (checksum, pages)"
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse a bundle with a damaged shard (default: warn, and serve the intact files); "
        "-o strict",
    )
    p.add_argument(
        "--log-file",
        metavar="FILE",
        help="log here (default: stderr in the foreground; syslog, or without /dev/log "
        "$XDG_STATE_HOME/bundlefs/mount-MOUNTPOINT.log, when detached)",
    )
    p.add_argument(
        "--no-auto-unmount",
        action="store_true",
        help="leave the mount in place if the daemon is killed (debugging only)",
    )
    p.add_argument("--debug", action="store_true", help="log every error in detail")
    p.add_argument(
        "-o",
        dest="options",
        action="append",
        default=[],
        metavar="OPTIONS",
        help="comma-separated mount options, as mount(8) and fstab pass them (repeatable)",
    )


def parse_mount_options(groups: list[str]) -> dict[str, object]:
    """The ``-o`` option strings (``ro,cache_size=1GiB,uid=1000``) as option name → value.

    Text values stay text (sizes are parsed when merged with the flags), numbers become ints,
    flags ``True``; the generic options of mount(8) and fstab are dropped. An option bundlefs
    does not know, or a malformed value, raises ``MountOptionError`` (a usage error: exit 2).
    """
    values: dict[str, object] = {}
    for group in groups:
        for option in filter(None, group.split(",")):
            name, _, value = option.partition("=")
            key = name.replace("-", "_")
            if key in _TEXT_OPTIONS and value:
                values[key] = value  # before the generic ones: mount(8)'s flag "owner" has none
                continue
            if key in _LIST_OPTIONS and value:  # fstab: -o storage_option=KEY=VALUE, repeated
                items = values.setdefault(key, [])
                assert isinstance(items, list)
                items.append(value)
                continue
            if key in _UNSUPPORTED_TRANSPORTS:
                raise MountError(
                    f"mount option {name!r} is not supported: bundlefs serves /dev/fuse with "
                    "its own worker processes (--workers), each on a cloned descriptor"
                )
            if name in _IGNORED_OPTIONS or name.startswith(("x-systemd.", "x-")):
                continue
            if key in ("allow_other", "foreground", "strict"):
                values[key] = True
            elif key in ("nonempty", "allow_nonempty"):
                values["allow_nonempty"] = True
            elif key in _NUMBER_OPTIONS and value.isdigit():
                values[key] = int(value)
            elif key in _NUMBER_OPTIONS:
                raise MountOptionError(f"mount option {option!r}: {key}= takes a whole number")
            else:
                raise MountOptionError(f"unknown mount option {option!r}")
    return values


def _int_or_none(value: object) -> int | None:
    assert value is None or isinstance(value, int)  # parse_mount_options and argparse made it
    return value


def _size_or_none(value: object) -> int | None:
    """A size from a flag (parsed by argparse) or an -o option (text, parsed here)."""
    assert value is None or isinstance(value, int | str)
    return None if value is None else parse_size(value)


def _seconds_or_none(value: object) -> float | None:
    """Seconds from a flag (parsed by argparse) or an -o option (text, parsed here)."""
    assert value is None or isinstance(value, float | str)
    if value is None or isinstance(value, float):
        return value
    try:
        return seconds(value)
    except argparse.ArgumentTypeError as e:
        raise MountError(f"store_timeout= takes seconds: {e}") from None


def _text_or_none(value: object) -> str | None:
    assert value is None or isinstance(value, str)
    return value


def _flags_and_options(args: argparse.Namespace) -> tuple[dict[str, object], list[str], list[str]]:
    """The flags merged with the ``-o`` options (the later wins), checked where a choice is
    closed; and the storage options given as ``KEY=VALUE`` pairs and as files, flags first."""
    values: dict[str, object] = dict(
        foreground=args.foreground,
        allow_nonempty=args.allow_nonempty,
        strict=args.strict,
        cache_size=args.cache_size,
        allow_other=args.allow_other,
        owner=args.owner,
        uid=args.uid,
        gid=args.gid,
        read_ahead_kb=args.read_ahead_kb,
        log_file=args.log_file,
        open_mode=args.open_mode,
        readdirplus=args.readdirplus,
        index_resident=args.index_resident,
        disk_cache=args.disk_cache,
        disk_cache_size=args.disk_cache_size,
        workers=args.workers,
        store_timeout=args.store_timeout,
    )
    mount_options = parse_mount_options(args.options)
    pairs_o = mount_options.pop("storage_option", [])
    files_o = mount_options.pop("storage_options_file", [])
    assert isinstance(pairs_o, list) and isinstance(files_o, list)  # parse_mount_options made them
    values.update(mount_options)
    if values["owner"] not in ("stored", "mounter"):
        raise MountOptionError("owner= takes 'stored' or 'mounter'")
    for key, allowed in (("open_mode", _OPEN_MODES), ("readdirplus", _READDIRPLUS)):
        if values[key] not in (None, *allowed):
            raise MountOptionError(f"{key}= takes {', '.join(map(repr, allowed))}")
    return values, [*args.storage_option, *pairs_o], [*args.storage_options_file, *files_o]


def options_from_args(args: argparse.Namespace) -> MountOptions:
    """Merge the flags and ``-o`` options (the later wins) into one ``MountOptions``."""
    from bundlefs.mount.options import DEFAULT_INDEX_RESIDENT, DEFAULT_READ_AHEAD_KB, MountOptions
    from bundlefs.storage.location import merged_storage_options, parse_location

    values, option_pairs, option_files = _flags_and_options(args)
    uid, gid = _int_or_none(values["uid"]), _int_or_none(values["gid"])
    if values["owner"] == "mounter":
        uid = os.getuid() if uid is None else uid
        gid = os.getgid() if gid is None else gid
    cache, resident = _size_or_none(values["cache_size"]), _size_or_none(values["index_resident"])
    read_ahead = _int_or_none(values["read_ahead_kb"])
    # A URL stays a URL (the mount point is local); its options go to the daemon in memory, not
    # on its command line or in the mount table (they may hold credentials).
    location = parse_location(args.bundle, merged_storage_options(option_files, option_pairs))
    disk_cache = _text_or_none(values["disk_cache"])
    return MountOptions(
        bundle=os.path.abspath(location.path) if location.is_local else location.url,
        mountpoint=os.path.abspath(args.mountpoint),
        foreground=bool(values["foreground"]),
        allow_other=bool(values["allow_other"]),
        uid=uid,
        gid=gid,
        read_ahead_kb=DEFAULT_READ_AHEAD_KB if read_ahead is None else read_ahead,
        load_threads=None if args.threads is None else max(0, args.threads),
        open_mode=_text_or_none(values["open_mode"]) or "auto",
        readdirplus=_text_or_none(values["readdirplus"]) or "auto",
        index_resident=DEFAULT_INDEX_RESIDENT if resident is None else resident,
        prefetch=not args.no_prefetch,
        strict=bool(values["strict"]),
        # Absolute: the detached daemon changes its directory to / before it opens the log.
        log_file=_absolute_or_none(_text_or_none(values["log_file"])),
        debug=args.debug,
        auto_unmount=not args.no_auto_unmount,
        allow_nonempty=bool(values["allow_nonempty"]),
        workers=_int_or_none(values["workers"]),
        read=ReadOptions(
            cache_size=DEFAULT_CACHE_SIZE if cache is None else cache,
            check_index=not args.no_index_check,
            remote=RemoteOptions(
                storage_options=dict(location.storage_options) or None,
                disk_cache=_absolute_or_none(disk_cache),
                disk_cache_size=_size_or_none(values["disk_cache_size"]),
                store_timeout=_seconds_or_none(values["store_timeout"]),
            ),
        ),
    )


def daemon_log_path(mountpoint: str) -> str:
    """Where a detached daemon logs when there is no syslog to log to.

    ``$XDG_STATE_HOME/bundlefs/mount-NAME.log`` (``~/.local/state`` without it), NAME being the
    absolute mount point with its slashes as dashes: ``/mnt/imagenet`` → ``mount-mnt-imagenet.log``.
    """
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    name = os.path.abspath(mountpoint).strip("/").replace("/", "-") or "root"
    return os.path.join(os.path.abspath(state), "bundlefs", f"mount-{name}.log")


def _syslog_reachable() -> bool:
    """Whether something listens on /dev/log (a container may have none, or a dead socket)."""
    import socket  # here: ~4 ms of imports only where the log goes to syslog

    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):  # as logging's SysLogHandler tries
        try:
            with socket.socket(socket.AF_UNIX, kind | socket.SOCK_CLOEXEC) as sock:
                sock.connect(_SYSLOG_SOCKET)
            return True
        except OSError:
            continue
    return False


def _fallback_log_path(options: MountOptions) -> str | None:
    """The log file of a detached daemon that would otherwise log nowhere (no syslog), or None.

    Checked before mounting, so a log that cannot be written is one sentence here rather than a
    daemon that dies unseen after detaching; created only once mounted (a failed mount leaves
    nothing)."""
    if options.log_file or options.foreground or _syslog_reachable():
        return None
    path = daemon_log_path(options.mountpoint)
    existing = os.path.dirname(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not (os.path.isdir(existing) and os.access(existing, os.W_OK | os.X_OK)):
        raise MountError(
            f"there is no syslog ({_SYSLOG_SOCKET}) and the daemon cannot write its log under "
            f"{existing}; use --log-file"
        )
    return path


def _absolute_or_none(path: str | None) -> str | None:
    return os.path.abspath(path) if path else None


def run_mount(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    fallback_log = _fallback_log_path(options)
    if fallback_log is not None:
        options = dataclasses.replace(options, log_file=fallback_log)
    from bundlefs.mount.daemon import mount

    def log_setup(foreground: bool) -> None:
        if fallback_log is not None:
            os.makedirs(os.path.dirname(fallback_log), exist_ok=True)
        target: LogTarget = "stderr" if foreground else "syslog"
        setup_logging(target, log_file=options.log_file, debug=options.debug)

    return mount(options, log_setup)


# -- umount ---------------------------------------------------------------------------------------


def add_umount_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="where a bundle is mounted")
    p.add_argument("-z", "--lazy", action="store_true", help="detach now, clean up when unused")
    p.add_argument(
        "--force",
        action="store_true",
        help="unmount it even if it is not a bundlefs mount (refused by default)",
    )


def run_umount(args: argparse.Namespace) -> int:
    from bundlefs.mount.daemon import unmount

    unmount(args.mountpoint, lazy=args.lazy, force=args.force)
    return EXIT_OK
