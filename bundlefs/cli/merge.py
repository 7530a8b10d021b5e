"""``bundlefs merge``: bundles into one, their shard files linked rather than copied.

May import: ``bundlefs.cli`` modules, and below them ``bundlefs.packing`` (imported in ``run``).
"""

from __future__ import annotations

import argparse

from bundlefs.cli.options import key_value_pairs, parse_time, storage_options
from bundlefs.cli.output import EXIT_OK, count, out, out_json, warn


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="BUNDLE", help="the bundles to merge, in order")
    p.add_argument("dest", metavar="OUT", help="the new bundle: a directory or a URL")
    p.add_argument(
        "--at",
        action="append",
        metavar="PREFIX",
        help="where each bundle's tree goes in OUT, one per bundle in order ('.' for the "
        "root); default: every tree is overlaid at the root",
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
        help="the creation time to record (as for pack; default: SOURCE_DATE_EPOCH if set, "
        "else now); fixed, two merges are byte-identical",
    )
    p.add_argument("--force", action="store_true", help="replace an existing OUT")
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
            f"copied {summary.copied:,} of {count(summary.config.shard_count, 'shard file')}: "
            "they could be neither hard-linked nor reflinked (another file system?)"
        )
    if summary.overridden:
        warn(
            f"{count(len(summary.overridden), 'name')} "
            f"{'was' if len(summary.overridden) == 1 else 'were'} in more than one bundle; "
            f"--on-clash {args.on_clash} kept one, e.g. {summary.overridden[0]}"
        )
    if args.json:  # --json always prints its object: -q quiets the human text only
        out_json(summary.to_dict())
        return EXIT_OK
    if args.quiet:
        return EXIT_OK
    c = summary.config
    ways = f"{summary.linked:,} linked, {summary.reflinked:,} reflinked, {summary.copied:,} copied"
    out(
        f"merged {count(summary.inputs, 'bundle')}: {count(c.file_count, 'file')}, "
        f"{count(c.dir_count, 'dir')}, {count(c.data_bytes, 'byte')} in "
        f"{count(c.shard_count, 'shard')} ({ways}) in {summary.seconds:.2f} s: {summary.dest}"
    )
    return EXIT_OK
