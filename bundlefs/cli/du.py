"""``bundlefs du``: what a directory of a bundle holds, in all its depth, without walking it.

A bundle of format version 5 stores each directory's subtree totals (docs/format.md, ``totals``),
so the answer is one lookup whatever the subtree's size; an older bundle is walked once, with the
same answer (``Bundle.du``). Bytes are the files' apparent sizes (``du --apparent-size``), each
hard-linked file counted once, as ``du`` counts an inode once.

May import: the library layers, ``bundlefs.cli.output``, ``bundlefs.cli.options``.
"""

from __future__ import annotations

import argparse
import json
import os

from bundlefs.cli.options import BUNDLE_HELP, open_bundle
from bundlefs.cli.output import EXIT_OK, count, out
from bundlefs.core.units import format_size


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE_HELP)
    p.add_argument("paths", nargs="*", metavar="PATH", help="directories or files (default: /)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument(
        "-b", "--bytes", action="store_true", help="sizes in bytes (default: binary units)"
    )
    shown.add_argument(
        "--json",
        action="store_true",
        help="for programs: one JSON object per PATH per line: path, bytes, files, dirs, entries",
    )


def run(args: argparse.Namespace) -> int:
    paths = args.paths or ["/"]
    with open_bundle(args.bundle, args) as bundle:
        for path in paths:
            totals = bundle.du(path)
            if args.json:
                facts = {"path": path, **totals.to_dict()}
                out(json.dumps(facts, sort_keys=True))
                continue
            shown = f"{totals.bytes}" if args.bytes else format_size(totals.bytes)
            line = f"{shown}\t{count(totals.files, 'file')}\t{count(totals.dirs, 'dir')}\t"
            out(line.encode() + os.fsencode(path))
    return EXIT_OK
