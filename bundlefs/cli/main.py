"""The ``bundlefs`` command line: argparse subcommands, output formatting and the error policy.

It owns how things look to a user, and nothing else: every subcommand is a thin wrapper around a
library call (``pack``, ``Bundle``, ``verify``, ``extract``). Policy, in one place:
- every ``BundleError``, and every ``OSError`` on a user's path, becomes ONE sentence on stderr
  (``bundlefs: error: …``) and exit status 1; usage errors exit 2; Ctrl-C exits 130; never a
  traceback;
- log warnings (the packer's skipped and changed files) appear as ``bundlefs: warning: …``;
- progress lines go to stderr, only when it is a terminal, and never with ``--quiet``.

Heavy modules are imported inside the subcommands that use them. The subcommand table
``COMMANDS`` is the one place a subcommand is added; ``mount``/``umount`` plug in there through
``_from_module`` (see the comment at the table) without importing pyfuse3 or trio here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from bundlefs.errors import BundleError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_BROKEN_PIPE = 141  # what a shell reports for a writer killed by SIGPIPE

_PROG = "bundlefs"
_MB = 1_000_000


# -- terminal output ------------------------------------------------------------------------------


class _StatusLine:
    """One self-overwriting progress line on stderr (only when stderr is a terminal)."""

    def __init__(self) -> None:
        self.enabled = False
        self._active = False

    def show(self, text: str) -> None:
        if not self.enabled:
            return
        sys.stderr.write("\r\x1b[K" + text)
        sys.stderr.flush()
        self._active = True

    def clear(self) -> None:
        if self._active:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._active = False


_status = _StatusLine()


class _Handler(logging.StreamHandler):
    """``bundlefs: warning: …`` on stderr, clearing a progress line first so they do not mix."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter(f"{_PROG}: %(levelname)s: %(message)s"))

    def format(self, record: logging.LogRecord) -> str:
        record = logging.makeLogRecord(record.__dict__)
        record.levelname = record.levelname.lower()
        return super().format(record)

    def emit(self, record: logging.LogRecord) -> None:
        _status.clear()
        super().emit(record)


def _setup_logging() -> None:
    logger = logging.getLogger("bundlefs")
    if not any(isinstance(h, _Handler) for h in logger.handlers):
        logger.addHandler(_Handler())
    logger.setLevel(logging.WARNING)
    logger.propagate = False


def _out(text: str | bytes = "") -> None:
    """Write a line to stdout as bytes, so names that are not UTF-8 come out unchanged."""
    data = os.fsencode(text) if isinstance(text, str) else text
    sys.stdout.buffer.write(data + b"\n")


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / _MB / seconds:.1f} MB/s" if seconds > 0 else "- MB/s"


def _size(text: str) -> int:
    """argparse type for sizes such as ``4096``, ``256K``, ``4GiB``."""
    from bundlefs.core.units import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _open_bundle(path: str):
    from bundlefs.read.bundle import Bundle

    return Bundle(path)


# -- pack -----------------------------------------------------------------------------------------


def _pack_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="the directory tree to pack")
    p.add_argument("dest", help="the bundle to create (a directory)")
    p.add_argument(
        "--record-size", type=_size, default=None, metavar="SIZE", help="uncompressed record size"
    )
    p.add_argument(
        "--block-size", type=_size, default=None, metavar="SIZE", help="shard block size"
    )
    p.add_argument("--compression", choices=("lz4", "none"), default="lz4")
    p.add_argument(
        "--shard-size",
        type=_size,
        default=None,
        metavar="SIZE",
        help="start a new shard once one holds this much file data (4GiB)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="skip names or relative paths matching this shell pattern (repeatable)",
    )
    p.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=4,
        help="threads reading source files and compressing records (default 4; 1: none)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing DEST")
    p.add_argument(
        "--skip-errors", action="store_true", help="skip unreadable files, and list them"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress and no summary")


class _SourceTotals:
    """Bytes of regular files under the source, summed by a background walk for the ETA.

    Only when a progress line is shown; it never slows the pack itself (one thread of lstat).
    """

    def __init__(self, source: str) -> None:
        self.bytes = 0
        self.done = False
        threading.Thread(target=self._walk, args=(source,), daemon=True).start()

    def _walk(self, source: str) -> None:
        total = 0
        for top, _dirs, files in os.walk(source):
            for name in files:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(top, name))
                    if stat.S_ISREG(st.st_mode):
                        total += st.st_size
        self.bytes, self.done = total, True


def _run_pack(args: argparse.Namespace) -> int:
    from bundlefs.packing.packer import PackOptions, pack

    defaults = PackOptions()
    options = PackOptions(
        record_size=args.record_size or defaults.record_size,
        block_size=args.block_size or defaults.block_size,
        compression=args.compression,
        shard_size=args.shard_size or defaults.shard_size,
        excludes=tuple(args.exclude),
        force=args.force,
        skip_errors=args.skip_errors,
        jobs=max(1, args.jobs),
    )

    totals = _SourceTotals(args.source) if _status.enabled else None

    def progress(p) -> None:
        elapsed = time.monotonic() - p.started
        line = (
            f"packing: {p.files:,} files, {p.dirs:,} dirs, {_human(p.bytes_read)} "
            f"({_rate(p.bytes_read, elapsed)}), {elapsed:.0f} s"
        )
        if totals is not None and totals.done and totals.bytes and p.bytes_read:
            left = max(0, totals.bytes - p.bytes_read) * elapsed / p.bytes_read
            percent = min(100, 100 * p.bytes_read // totals.bytes)
            line += f", {percent}%, ETA {left:.0f} s"
        _status.show(line)

    summary = pack(args.source, args.dest, options, None if args.quiet else progress)
    _status.clear()
    if args.quiet:
        return EXIT_OK
    c = summary.config
    ratio = c.data_bytes / summary.stored_bytes if summary.stored_bytes else 0.0
    notes = []
    if summary.skipped:
        notes.append(f"{len(summary.skipped)} skipped")
    if summary.changed:
        notes.append(f"{len(summary.changed)} changed while packing")
    note = f" ({', '.join(notes)}: see the warnings above)" if notes else ""
    _out(
        f"packed {c.file_count:,} files, {c.dir_count:,} dirs, {c.data_bytes:,} bytes into "
        f"{summary.stored_bytes:,} stored bytes (ratio {ratio:.2f}) in {summary.seconds:.2f} s "
        f"({_rate(c.data_bytes, summary.seconds)}): {summary.dest}{note}"
    )
    return EXIT_OK


# -- info -----------------------------------------------------------------------------------------


def _info_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", help="a bundle, or a bundlefs mount point (adds daemon statistics)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _run_info(args: argparse.Namespace) -> int:
    from bundlefs.core.format import FORMAT_VERSION
    from bundlefs.mount.table import daemon_stats, mounted_bundle

    daemon = None
    served = mounted_bundle(args.bundle)
    if served is not None:
        daemon = daemon_stats(args.bundle)
        args.bundle = served
    with _open_bundle(args.bundle) as bundle:
        info = bundle.info()
    c = info.config
    facts = {
        "path": info.path,
        "bundle_id": info.bundle_id.hex(),
        "format_version": FORMAT_VERSION,
        "files": c.file_count,
        "dirs": c.dir_count,
        "symlinks": c.symlink_count,
        "hardlinks": c.hardlink_count,
        "entries": c.entry_count,
        "bytes": c.data_bytes,
        "stored_bytes": info.shard_bytes,
        "ratio": round(c.data_bytes / info.shard_bytes, 4) if info.shard_bytes else 0.0,
        "shards": c.shard_count,
        "index_bytes": info.index_bytes,
        "record_size": c.record_size,
        "block_size": c.block_size,
        "large_file_threshold": c.large_file_threshold,
        "compression": c.compression_name,
        "created_ns": c.created_ns,
    }
    if daemon is not None:
        facts["daemon"] = daemon
    if args.json:
        _out(json.dumps(facts, indent=2))
        return EXIT_OK
    rows = [
        ("bundle", info.path),
        ("bundle id", facts["bundle_id"]),
        ("format", f"version {FORMAT_VERSION}"),
        ("files", f"{c.file_count:,}"),
        ("directories", f"{c.dir_count:,}"),
        ("symlinks", f"{c.symlink_count:,}"),
        ("hard links", f"{c.hardlink_count:,}"),
        ("bytes", f"{c.data_bytes:,} ({_human(c.data_bytes)})"),
        ("stored bytes", f"{info.shard_bytes:,} ({_human(info.shard_bytes)})"),
        ("ratio", f"{facts['ratio']:.2f}"),
        ("shards", f"{c.shard_count:,}"),
        ("index size", f"{info.index_bytes:,} ({_human(info.index_bytes)})"),
        ("record size", _human(c.record_size)),
        ("block size", _human(c.block_size)),
        ("compression", c.compression_name),
    ]
    if c.created_ns:
        created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(c.created_ns // 10**9))
        rows.append(("created", created))
    if daemon is not None:
        for key, value in sorted(daemon.items()):
            rows.append((f"daemon {key.replace('_', ' ')}", _daemon_value(value)))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        _out(f"{key:<{width}}  {value}")
    return EXIT_OK


def _daemon_value(value: object) -> str:
    if isinstance(value, dict):  # request counts: the ones that happened, busiest first
        counts = sorted(((n, k) for k, n in value.items() if n), reverse=True)
        return ", ".join(f"{k} {n:,}" for n, k in counts) or "none"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value) or "-"


# -- ls -------------------------------------------------------------------------------------------


def _ls_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle")
    p.add_argument("paths", nargs="*", metavar="PATH", help="directories or files (default: /)")
    p.add_argument("-l", dest="long", action="store_true", help="long format, like ls -l")
    p.add_argument("-a", dest="all", action="store_true", help="show names starting with '.'")
    p.add_argument("-R", dest="recursive", action="store_true", help="list subdirectories too")


class _Names:
    """uid/gid → user/group names, looked up once each (numbers when the system has no name)."""

    def __init__(self) -> None:
        self._users: dict[int, str] = {}
        self._groups: dict[int, str] = {}

    def user(self, uid: int) -> str:
        if uid not in self._users:
            import pwd

            try:
                self._users[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                self._users[uid] = str(uid)
        return self._users[uid]

    def group(self, gid: int) -> str:
        if gid not in self._groups:
            import grp

            try:
                self._groups[gid] = grp.getgrgid(gid).gr_name
            except KeyError:
                self._groups[gid] = str(gid)
        return self._groups[gid]


def _long_line(bundle, entry, name: bytes, names: _Names) -> bytes:
    import stat

    st = bundle.stat_entry(entry)
    seconds = st.st_mtime_ns // 10**9
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))
    head = (
        f"{stat.filemode(st.st_mode)} {st.st_nlink:>3} {names.user(st.st_uid):<8} "
        f"{names.group(st.st_gid):<8} {st.st_size:>12} {when} "
    )
    line = os.fsencode(head) + name
    if entry.is_symlink:
        line += b" -> " + entry.symlink
    return line


def _run_ls(args: argparse.Namespace) -> int:
    names = _Names()
    paths = [os.fsencode(p) for p in args.paths] or [b""]
    with _open_bundle(args.bundle) as bundle:

        def show(entry, name: bytes) -> None:
            _out(_long_line(bundle, entry, name, names) if args.long else name)

        files, dirs = [], []
        for raw in paths:
            entry = bundle.resolve(raw, follow_symlinks=False)
            if entry.is_symlink and (not args.long or raw.endswith(b"/")):
                # like ls: a symlink to a directory is listed through, unless -l
                with contextlib.suppress(BundleError):
                    entry = bundle.resolve(raw, follow_symlinks=True)
            (dirs if entry.is_dir else files).append((raw, entry))
        for raw, entry in files:
            show(entry, raw)
        headers = args.recursive or len(paths) > 1
        first = not files
        pending = list(reversed(dirs))
        while pending:
            raw, directory = pending.pop()
            if headers:
                if not first:
                    _out()
                _out((raw or b".") + b":")
            first = False
            subdirs = []
            for name, entry in bundle.children(directory):
                if name.startswith(b".") and not args.all:
                    continue
                show(entry, name)
                if entry.is_dir:
                    subdirs.append((raw.rstrip(b"/") + b"/" + name if raw else name, entry))
            if args.recursive:
                pending.extend(reversed(subdirs))
    return EXIT_OK


# -- cat ------------------------------------------------------------------------------------------


def _cat_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle")
    p.add_argument("paths", nargs="+", metavar="PATH", help="files to write to stdout, in order")


def _run_cat(args: argparse.Namespace) -> int:
    from bundlefs.errors import IsADirectory
    from bundlefs.read.verify import iter_content

    status = EXIT_OK
    out = sys.stdout.buffer
    with _open_bundle(args.bundle) as bundle:
        for path in args.paths:
            try:
                entry = bundle.resolve(path)
                if entry.is_dir:
                    raise IsADirectory(f"{path!r} is a directory")
                for piece in iter_content(bundle, entry, path):
                    out.write(piece)
            except BundleError as e:
                out.flush()
                _error(str(e))
                status = EXIT_FAILURE
        out.flush()
    return status


# -- extract --------------------------------------------------------------------------------------


def _extract_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle")
    p.add_argument("dest", help="the directory to extract into (created if missing)")
    p.add_argument("paths", nargs="*", metavar="PATH", help="files or directories (default: all)")
    p.add_argument(
        "--force",
        action="store_true",
        help="extract into a non-empty DEST, replacing files and symlinks in the way",
    )
    owners = p.add_mutually_exclusive_group()
    owners.add_argument(
        "--owners", dest="owners", action="store_true", default=None, help="restore uid/gid"
    )
    owners.add_argument(
        "--no-owners", dest="owners", action="store_false", help="do not restore uid/gid"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress and no summary")


def _run_extract(args: argparse.Namespace) -> int:
    from bundlefs.read.extract import extract

    started = last = time.monotonic()

    def progress(s) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= 0.2:
            last = now
            _status.show(f"extracting: {s.files:,} files, {_human(s.bytes)}, {now - started:.0f} s")

    with _open_bundle(args.bundle) as bundle:
        summary = extract(
            bundle,
            args.dest,
            args.paths,
            force=args.force,
            owners=args.owners,
            progress=None if args.quiet else progress,
        )
    _status.clear()
    for path in summary.damaged:
        _error(f"{path} was not extracted: its content is damaged")
    if not args.quiet:
        _out(
            f"extracted {summary.files:,} files, {summary.dirs:,} dirs, {summary.symlinks:,} "
            f"symlinks, {summary.hardlinks:,} hard links ({summary.bytes:,} bytes) into "
            f"{summary.dest}"
        )
    return EXIT_OK if summary.ok else EXIT_FAILURE


# -- verify ---------------------------------------------------------------------------------------


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress")


def _run_verify(args: argparse.Namespace) -> int:
    from bundlefs.read.verify import verify

    def progress(p) -> None:
        elapsed = time.monotonic() - p.started
        total = f"/{p.total:,}" if p.total else ""
        _status.show(
            f"verifying {p.phase}: {p.done:,}{total}, {_human(p.bytes_checked)} checked "
            f"({_rate(p.bytes_checked, elapsed)}), {elapsed:.0f} s"
        )

    report = verify(args.bundle, None if args.quiet else progress)
    _status.clear()
    if args.json:
        facts = {
            "bundle": report.bundle,
            "ok": report.ok,
            "entries": report.entries,
            "files": report.files,
            "dirs": report.dirs,
            "symlinks": report.symlinks,
            "hardlinks": report.hardlinks,
            "shards": report.shards,
            "records": report.records,
            "bytes_checked": report.bytes_checked,
            "seconds": round(report.seconds, 3),
            "problems": [
                {"kind": p.kind, "message": p.message, "path": p.path, "shard": p.shard}
                for p in report.problems
            ],
            "damaged_files": report.damaged_files,
        }
        _out(json.dumps(facts, indent=2))
    else:
        _out(
            f"checked {report.files:,} files, {report.dirs:,} dirs, {report.symlinks:,} symlinks, "
            f"{report.hardlinks:,} hard links, {report.records:,} records in {report.shards:,} "
            f"shards: {report.bytes_checked:,} bytes in {report.seconds:.2f} s "
            f"({_rate(report.bytes_checked, report.seconds)})"
        )
        if report.ok:
            _out(f"OK: {report.bundle} is intact")
        else:
            _out(f"{len(report.problems)} problems:")
            for problem in report.problems:
                _out(f"  {problem.message}")
            if report.damaged_files:
                _out(f"{len(report.damaged_files)} damaged files:")
                for path in report.damaged_files:
                    _out(f"  {path}")
    if report.ok:
        return EXIT_OK
    _error(
        f"{report.bundle} is damaged: {len(report.problems)} problems, "
        f"{len(report.damaged_files)} damaged files"
    )
    return EXIT_FAILURE


# -- the subcommand table -------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    own_logging: bool = False  # the command configures logging itself (the mount daemon does)


def _from_module(name: str, help: str, module: str, add: str, run: str) -> Command:
    """A subcommand implemented in another module, imported only when the parser is built/run.

    That module must not import pyfuse3/trio at import time (only inside ``run``).
    """

    def add_arguments(p: argparse.ArgumentParser) -> None:
        getattr(importlib.import_module(module), add)(p)

    def run_command(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(module), run)(args)

    return Command(name, help, add_arguments, run_command, own_logging=True)


COMMANDS: list[Command] = [
    Command("pack", "pack a directory tree into a new bundle", _pack_args, _run_pack),
    Command("info", "show what a bundle holds", _info_args, _run_info),
    Command("ls", "list directories in a bundle", _ls_args, _run_ls),
    Command("cat", "write files from a bundle to stdout", _cat_args, _run_cat),
    Command("extract", "restore a bundle (or parts) to a directory", _extract_args, _run_extract),
    Command("verify", "check every checksum and structure of a bundle", _verify_args, _run_verify),
    _from_module(
        "mount",
        "mount a bundle read-only",
        "bundlefs.mount.daemon",
        "add_mount_arguments",
        "run_mount",
    ),
    _from_module(
        "umount", "unmount a bundle", "bundlefs.mount.daemon", "add_umount_arguments", "run_umount"
    ),
]


def _mount_helper_form(argv: list[str]) -> list[str]:
    """mount.fuse3 (``mount -t fuse.bundlefs``, fstab) runs ``bundlefs BUNDLE MNT -o OPTS``."""
    names = {c.name for c in COMMANDS}
    if len(argv) >= 2 and argv[0] not in names and not argv[0].startswith("-"):
        return ["mount", *argv]
    return argv


def build_parser() -> argparse.ArgumentParser:
    from bundlefs import __version__

    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Pack many small files into one immutable, compressed, seekable bundle.",
    )
    parser.add_argument("--version", action="version", version=f"{_PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(p)
        p.set_defaults(_command=command)
    return parser


# -- entry point ----------------------------------------------------------------------------------


def _error(message: str) -> None:
    _status.clear()
    sys.stderr.write(f"{_PROG}: error: {message}\n")
    sys.stderr.flush()


def _os_error(e: OSError) -> str:
    what = e.strerror or str(e)
    if e.filename is not None:
        return f"{os.fsdecode(e.filename)}: {what}"
    return what


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (the console script passes it to ``sys.exit``)."""
    try:
        argv = _mount_helper_form(sys.argv[1:] if argv is None else list(argv))
        args = build_parser().parse_args(argv)
        command: Command = args._command
        if not command.own_logging:
            _setup_logging()
            _status.enabled = sys.stderr.isatty() and not getattr(args, "quiet", False)
        return command.run(args)
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of our stdout went away (``bundlefs cat … | head``): not worth a message.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except BundleError as e:
        _error(str(e))
        return EXIT_FAILURE
    except OSError as e:
        _error(_os_error(e))
        return EXIT_FAILURE
    finally:
        _status.clear()
