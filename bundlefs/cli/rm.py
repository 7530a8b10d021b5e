"""``bundlefs rm BUNDLE``: remove a bundle, its completion marker first.

A bundle on an object store may hold shards that published bundles use (packed on it by
reference, format version 6): then it is refused in one sentence naming one of them, unless
``--force``. Anything that is not a bundle is refused as well (``rm`` deletes bundles, not
prefixes). The library's ``bundlefs.storage.remove`` does the work.

May import: the library layers, ``bundlefs.cli.output``, ``bundlefs.cli.options``.
"""

from __future__ import annotations

import argparse

from bundlefs.cli.options import storage_options
from bundlefs.cli.output import EXIT_OK, out, out_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help="the bundle to remove: a path or a URL")
    p.add_argument(
        "--force",
        action="store_true",
        help="remove it even while published bundles keep shards in it (they will no longer "
        "open); default: refuse",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    # Imported here, as every command's library: building the parser loads none of them.
    from bundlefs.storage.location import parse_location
    from bundlefs.storage.remove import remove_bundle

    location = parse_location(args.bundle, storage_options(args))
    removed = remove_bundle(location, force=args.force)  # a BundleError: one sentence in main
    if args.json:
        out_json({"removed": removed.location, "objects": removed.objects})
    else:
        out(f"removed {removed.location} ({removed.objects} files or objects)")
    return EXIT_OK
