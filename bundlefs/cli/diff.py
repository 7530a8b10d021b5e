"""``bundlefs diff OLD NEW``: what changed between two bundles, from their indexes alone.

Lines as ``git diff --name-status`` writes them (``STATUS<TAB>PATH``, ``R<TAB>OLD<TAB>NEW``),
``-z`` NUL-separated as git's, ``--json`` one object per line, ``--stat`` one summary line,
``-q`` nothing. Exit 0 when the bundles are the same, 1 when they differ, 2 on an error (the
status ``app`` gives this command's failures).

May import: ``bundlefs.cli`` modules, and below them ``bundlefs.read`` (imported in ``run``).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Iterable
from contextlib import closing
from typing import TYPE_CHECKING

from bundlefs.cli.browse import shell_escaped
from bundlefs.cli.options import remote_options
from bundlefs.cli.output import EXIT_FAILURE, EXIT_OK, count, out

if TYPE_CHECKING:
    from bundlefs.read.diff import Change

# The summary's words, in its order.
_SAID = (
    ("A", "added"),
    ("D", "removed"),
    ("M", "changed"),
    ("m", "metadata only"),
    ("T", "type changed"),
    ("R", "renamed"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("old", metavar="OLD", help="the bundle before: its directory, or a URL")
    p.add_argument("new", metavar="NEW", help="the bundle after: its directory, or a URL")
    form = p.add_mutually_exclusive_group()
    form.add_argument(
        "--json", action="store_true", help="one JSON object per change, a line each (JSON Lines)"
    )
    form.add_argument(
        "-z", dest="zero", action="store_true", help="fields and lines end with NUL, as git's -z"
    )
    form.add_argument(
        "--stat", action="store_true", help="only a summary line: how many of each change"
    )
    form.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print nothing; the exit status says (stops at the first difference)",
    )
    p.add_argument(
        "--no-renames",
        action="store_true",
        help="a moved file is D and A, not R (the changes then stream: memory stays flat)",
    )


def summary(counts: Counter[str]) -> str:
    """``3 changes: 1 added, 2 removed``, or ``no changes``."""
    total = sum(counts.values())
    if not total:
        return "no changes"
    said = ", ".join(f"{counts[s]:,} {words}" for s, words in _SAID if counts[s])
    return f"{count(total, 'change')}: {said}"


def _line(change: Change, zero: bool) -> bytes:
    paths = [change.path] if change.old_path is None else [change.old_path, change.path]
    status = change.status.encode()
    if zero:
        return b"\0".join([status, *paths]) + b"\0"
    return b"\t".join([status, *map(shell_escaped, paths)]) + b"\n"


def write(changes: Iterable[Change], args: argparse.Namespace) -> Counter[str]:
    """Write ``changes`` as ``args`` asks; their count by status."""
    counts: Counter[str] = Counter()
    for change in changes:
        counts[change.status] += 1
        if args.quiet:
            break
        if args.json:
            out(json.dumps(change.to_dict(), separators=(",", ":")))
        elif not args.stat:
            out(_line(change, args.zero), end=b"")
    if args.stat:
        out(summary(counts))
    return counts


def run(args: argparse.Namespace) -> int:
    from bundlefs.read.diff import diff
    from bundlefs.read.options import ReadOptions

    options = ReadOptions(remote=remote_options(args))
    renames = not (args.no_renames or args.quiet)
    with closing(diff(args.old, args.new, renames=renames, options=options)) as changes:
        counts = write(changes, args)
    return EXIT_FAILURE if counts else EXIT_OK
