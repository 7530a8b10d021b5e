"""``bundlefs extract BUNDLE DEST [PATH...]``: the options, the progress line and the summary.

May import: the library layers, ``bundlefs.cli.output``, ``bundlefs.cli.options``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bundlefs.cli.options import BUNDLE_HELP, open_bundle
from bundlefs.cli.output import EXIT_FAILURE, EXIT_OK, count, error, files_progress, out, status
from bundlefs.errors import UsageError

if TYPE_CHECKING:
    from bundlefs.read.extract import ExtractSummary


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE_HELP)
    p.add_argument(
        "dest", metavar="DEST", help="the directory to extract into (created if missing)"
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help="files or directories (default: all)")
    p.add_argument(
        "--force",
        action="store_true",
        help="extract into a non-empty DEST, replacing files and symlinks in the way",
    )
    owners = p.add_mutually_exclusive_group()
    owners.add_argument(
        "--owners",
        dest="owners",
        action="store_true",
        default=None,
        help="restore uid/gid (default: as root)",
    )
    owners.add_argument(
        "--no-owners",
        dest="owners",
        action="store_false",
        help="do not restore uid/gid (default: not as root)",
    )
    p.add_argument(
        "--salvage",
        action="store_true",
        help="keep a damaged file with holes where bytes were lost, and write a map of them "
        "(exit status 1 if anything was lost)",
    )
    p.add_argument(
        "--salvage-map",
        metavar="FILE",
        help="where --salvage writes its map of lost ranges (default: DEST.salvage-map)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress and no summary")


def run(args: argparse.Namespace) -> int:
    from bundlefs.read.extract import extract

    if args.salvage_map and not args.salvage:
        raise UsageError("--salvage-map says where --salvage writes its map; give --salvage too")
    progress = files_progress("extracting")

    with open_bundle(args.bundle, args) as bundle:
        summary = extract(
            bundle,
            args.dest,
            args.paths,
            force=args.force,
            owners=args.owners,
            progress=None if args.quiet else progress,
            salvage=args.salvage,
        )
    status.clear()
    if args.salvage:
        _report_salvage(args, summary)
    for path in summary.damaged:
        error(f"{path} was not extracted: its content is damaged")
    if not args.quiet:
        out(
            f"extracted {count(summary.files, 'file')}, {count(summary.dirs, 'dir')}, "
            f"{count(summary.symlinks, 'symlink')}, {count(summary.hardlinks, 'hard link')}"
            + (f", {count(summary.specials, 'special file')}" if summary.specials else "")
            + f" ({count(summary.bytes, 'byte')}) into {summary.dest}"
        )
    return EXIT_OK if summary.ok else EXIT_FAILURE


def _report_salvage(args: argparse.Namespace, summary: ExtractSummary) -> None:
    """Write the map of lost ranges and say in one line what was lost (on stderr if anything)."""
    from bundlefs.read.salvage import summary_line, write_map

    target = args.salvage_map or summary.dest.rstrip("/") + ".salvage-map"
    write_map(target, args.bundle, summary.lost)
    line = f"{summary_line(summary.lost, summary.files)} (map: {target})"
    if summary.lost:
        error(line)
    elif not args.quiet:
        out(line)
