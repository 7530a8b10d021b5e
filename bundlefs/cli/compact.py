"""``bundlefs compact B NEW``: a new bundle of B's tree without the records no file uses.

May import: ``bundlefs.cli`` modules, and below them ``bundlefs.packing`` (imported in ``run``).
"""

from __future__ import annotations

import argparse

from bundlefs.cli.options import fraction, storage_options
from bundlefs.cli.output import EXIT_OK, count, out, out_json, size, warn
from bundlefs.core.units import format_size
from bundlefs.storage.liveness import DEFAULT_MIN_LIVE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help="the bundle to compact (never modified)")
    p.add_argument("dest", metavar="NEW", help="the new bundle: a directory or a URL")
    p.add_argument(
        "--min-live",
        type=fraction,
        default=DEFAULT_MIN_LIVE,
        metavar="FRACTION",
        help="rewrite the shards less live than this (0.5 or 50%%; default: 0.5); the others are "
        "linked as they are",
    )
    p.add_argument(
        "--shard-size",
        type=size,
        default=None,
        metavar="SIZE",
        help="cut new shards at this size (default: 4GiB, as pack); shards under a quarter of it "
        "are merged on a geometric rule",
    )
    p.add_argument("--force", action="store_true", help="replace an existing NEW")
    p.add_argument(
        "--staging",
        metavar="DIR",
        help="where a bundle for a URL is built before the upload (default: the temporary "
        "directory)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no summary (but --json's)")
    p.add_argument(
        "--json", action="store_true", help="the summary as one JSON object (even with -q)"
    )


def run(args: argparse.Namespace) -> int:
    from bundlefs.packing.compact import CompactOptions, compact

    sizes = {} if args.shard_size is None else {"shard_size": args.shard_size}
    options = CompactOptions(
        min_live=args.min_live,
        force=args.force,
        storage_options=storage_options(args) or None,
        staging=args.staging,
        **sizes,
    )
    summary = compact(args.bundle, args.dest, options)
    copied = summary.ways.count("copy")
    if copied:
        warn(
            f"copied {copied:,} of {count(summary.kept, 'kept shard file')}: they could be "
            "neither hard-linked nor reflinked (another file system?)"
        )
    if args.json:  # --json always prints its object: -q quiets the human text only
        out_json(summary.to_dict())
        return EXIT_OK
    if args.quiet:
        return EXIT_OK
    before, after = summary.before.stored_bytes, summary.stored_bytes
    out(
        f"compacted {count(summary.before.shards, 'shard')} into "
        f"{count(summary.config.shard_count, 'shard')} ({summary.kept:,} kept as they are, "
        f"{summary.rewritten:,} rewritten into {summary.written:,}, "
        f"{count(summary.records_copied, 'record')} copied): {format_size(before)} -> "
        f"{format_size(after)} stored in {summary.seconds:.2f} s: {summary.dest}"
    )
    return EXIT_OK
