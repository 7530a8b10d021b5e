"""``bundlefs merge``: bundles into one, their shard files linked rather than copied.

May import: ``bundlefs.cli`` modules, and below them ``bundlefs.packing`` (imported in ``run``).
"""

from __future__ import annotations

import argparse

from bundlefs.cli.options import storage_options
from bundlefs.cli.output import EXIT_OK, out, out_json, warn
from bundlefs.cli.pack import key_value_pairs, parse_time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="BUNDLE", help="the bundles to merge, in order")
    p.add_argument("dest", metavar="OUT", help="the new bundle: a directory or a URL")
    p.add_argument(
        "--at",
        action="append",
        metavar="PREFIX",
        help="where each bundle's tree goes in OUT, one per bundle in order ('.' for the "
        "root); without --at, every tree is overlaid at the root",
    )
    p.add_argument(
        "--on-clash",
        choices=("error", "last", "first"),
        default="error",
        help="a name that is not a directory in every bundle holding it: refuse (default), or "
        "keep the last or the first bundle's",
    )
    p.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="metadata of the new bundle (repeatable); the inputs' own is not carried over",
    )
    p.add_argument(
        "--created",
        metavar="TIME",
        help="the creation time to record (as for pack); fixed, two merges are byte-identical",
    )
    p.add_argument("--force", action="store_true", help="replace an existing OUT")
    p.add_argument(
        "--staging", metavar="DIR", help="where a bundle for a URL is built before the upload"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no summary")
    p.add_argument("--json", action="store_true", help="the summary as one JSON object")


def run(args: argparse.Namespace) -> int:
    from bundlefs.packing.merge import MergeOptions, merge

    options = MergeOptions(
        at=tuple(args.at) if args.at else None,
        on_clash=args.on_clash,
        force=args.force,
        meta=key_value_pairs(args.meta, "--meta"),
        created_ns=parse_time(args.created) if args.created else None,
        storage_options=storage_options(args) or None,
        staging=args.staging,
    )
    summary = merge(args.inputs, args.dest, options)
    if summary.copied:
        warn(
            f"copied {summary.copied} of {summary.config.shard_count} shard files: they could be "
            "neither hard-linked nor reflinked (another file system?)"
        )
    if summary.overridden:
        warn(
            f"{len(summary.overridden)} name(s) were in more than one bundle; "
            f"--on-clash {args.on_clash} kept one, e.g. {summary.overridden[0]}"
        )
    if args.quiet:
        return EXIT_OK
    if args.json:
        out_json(summary.to_dict())
        return EXIT_OK
    c = summary.config
    ways = f"{summary.linked} linked, {summary.reflinked} reflinked, {summary.copied} copied"
    out(
        f"merged {summary.inputs} bundles: {c.file_count:,} files, {c.dir_count:,} dirs, "
        f"{c.data_bytes:,} bytes in {c.shard_count} shards ({ways}) in {summary.seconds:.2f} s: "
        f"{summary.dest}"
    )
    return EXIT_OK
