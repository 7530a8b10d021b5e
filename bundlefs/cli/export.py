"""``bundlefs export BUNDLE OUT.tar`` (``-``: stdout): the arguments, the output file, the summary.

OUT is written under a temporary name beside it and renamed into place only when the whole tar
is written, so a failed export (a damaged file, a full disk) leaves no partial OUT behind.

May import: the library layers, ``bundlefs.cli.output``, ``bundlefs.cli.options``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import TYPE_CHECKING

from bundlefs.cli.options import BUNDLE_HELP, open_bundle
from bundlefs.cli.output import EXIT_OK, count, files_progress, out, status
from bundlefs.errors import ExportError, naming, note_cleanup

if TYPE_CHECKING:
    from bundlefs.read.export import ExportSummary


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE_HELP)
    p.add_argument("out", metavar="OUT", help="the tar to write, or - for stdout")
    p.add_argument("--force", action="store_true", help="replace an existing OUT")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress and no summary")


def run(args: argparse.Namespace) -> int:
    from bundlefs.read.export import export_tar

    progress = files_progress("exporting")

    show = None if args.quiet else progress
    to_stdout = args.out == "-"
    if to_stdout and sys.stdout.isatty():
        raise ExportError("refusing to write a tar to a terminal (redirect stdout or give OUT)")
    if not to_stdout and os.path.isdir(args.out):
        # --force would not help: a tar replaces a file, never a directory.
        raise ExportError(f"{args.out} is a directory: OUT is the tar file to write")
    if not to_stdout and os.path.lexists(args.out) and not args.force:
        raise ExportError(f"{args.out} already exists (use --force to replace it)")
    with open_bundle(args.bundle, args) as bundle:
        if to_stdout:
            summary = export_tar(bundle, sys.stdout.buffer, progress=show)
            sys.stdout.buffer.flush()
        else:
            summary = _export_file(bundle, args.out, show)
    status.clear()
    if not args.quiet:
        # The summary goes to stderr when the tar itself is on stdout.
        line = (
            f"exported {count(summary.files, 'file')}, {count(summary.dirs, 'dir')}, "
            f"{count(summary.symlinks, 'symlink')}, {count(summary.hardlinks, 'hard link')}"
            + (f", {count(summary.specials, 'special file')}" if summary.specials else "")
            + f" ({count(summary.bytes, 'byte')}) as a "
            f"{summary.tar_bytes:,}-byte tar: {'stdout' if to_stdout else args.out}"
        )
        if summary.sockets_left_out:
            line += f" ({count(summary.sockets_left_out, 'socket')} left out: a tar holds none)"
        if to_stdout:
            sys.stderr.write(line + "\n")
        else:
            out(line)
    return EXIT_OK


def _export_file(bundle, path: str, progress) -> ExportSummary:
    from bundlefs.read.export import export_tar

    parent, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(parent, f".{name}.partial-{os.getpid()}")
    try:
        # A full disk is said with OUT's name (the temporary one would puzzle the user).
        with naming(path), open(temporary, "wb", buffering=1024 * 1024) as f:
            summary = export_tar(bundle, f, progress=progress)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(e, KeyboardInterrupt):
            note_cleanup(e, f"removed the partial tar {temporary}")
        raise
    return summary
