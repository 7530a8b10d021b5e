"""``bundlefs gc DIR``: remove what killed packs left behind.

A pack builds its bundle in a hidden sibling ``.NAME.partial-PID`` and holds a lock on it until it
is done; a killed pack's stays (often hundreds of MB) until the next pack to the same name. This
command removes, in DIR, every partial nobody holds (``bundlefs.storage.publish`` decides, with
the same lock test the packer uses) and leaves a live pack's alone. Given a bundle, it cleans the
partials of that bundle beside it.

May import: the library layers, ``bundlefs.cli.output``.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from bundlefs.cli.output import EXIT_OK, out, out_json
from bundlefs.core.units import format_size

if TYPE_CHECKING:
    from bundlefs.storage.publish import Partial


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "directory",
        metavar="DIR",
        help="a directory bundles are packed into (or a bundle: its own leftovers)",
    )
    p.add_argument(
        "-n", "--dry-run", action="store_true", help="list what would be removed, remove nothing"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    # Imported here, as every command's library: building the parser loads none of them.
    from bundlefs.storage.marker import is_bundle
    from bundlefs.storage.publish import find_partials, remove_dead_partials

    path = os.path.abspath(args.directory)
    if is_bundle(path):
        directory, name = os.path.split(path)
    else:
        directory, name = path, None
    scan = find_partials if args.dry_run else remove_dead_partials
    found = scan(directory, name)  # OSError (missing, not a directory): one sentence in main
    dead = [p for p in found if not p.in_use]
    live = [p for p in found if p.in_use]
    freed = sum(p.size for p in dead)
    if args.json:
        out_json(
            {
                "directory": directory,
                "dry_run": args.dry_run,
                "removed": [p.to_dict() for p in dead],
                "in_use": [p.to_dict() for p in live],
                "freed_bytes": 0 if args.dry_run else freed,
            }
        )
        return EXIT_OK
    verb = "would remove" if args.dry_run else "removed"
    for partial in dead:
        out(
            f"{verb} {partial.path} ({format_size(partial.size)}), left by a killed pack "
            "(or extract)"
        )
    for partial in live:
        out(f"kept {partial.path}: a pack is writing it")
    out(_summary(directory, dead, verb, freed))
    return EXIT_OK


def _summary(directory: str, dead: list[Partial], verb: str, freed: int) -> str:
    if not dead:
        return f"no partial bundles left by killed packs in {directory}"
    what = "partial bundle" if len(dead) == 1 else "partial bundles"
    return f"{verb} {len(dead)} {what} ({format_size(freed)})"
