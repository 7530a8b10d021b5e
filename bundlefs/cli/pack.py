"""``bundlefs pack SRC... DEST``: the options, the progress line and the one-line summary (the SRC
forms, brace patterns among them, are ``cli.pack_sources``'s).

May import: the library layers, ``bundlefs.cli.output``, ``bundlefs.cli.options``,
``bundlefs.cli.pack_sources``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING

from bundlefs.cli.options import fraction, key_value_pairs, parse_time, storage_options
from bundlefs.cli.output import (
    count,
    out,
    out_json,
    rate,
    size,
    status,
    warn,
)
from bundlefs.cli.pack_report import (
    compaction_line,
    dedup_line,
    exit_status,
    reuse_line,
    summary_line,
    upload_line,
)
from bundlefs.cli.pack_sources import SourceTotals, expand_sources, read_files_from
from bundlefs.core import format as fmt
from bundlefs.core.units import format_size
from bundlefs.errors import PackError, UsageError
from bundlefs.storage.liveness import DEFAULT_MIN_LIVE

if TYPE_CHECKING:
    from collections.abc import Callable

    from bundlefs.packing.options import PackOptions, PackProgress, PackSummary
    from bundlefs.packing.user_data import UserDataFile


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "sources",
        nargs="+",
        metavar="SRC",
        help="the directory tree to pack, or archives: tar (.gz .bz2 .xz .zst), zip, '-' for a "
        "tar on stdin; several tar shards (or a quoted pattern like 'shards-{000..009}.tar') "
        "go into one bundle",
    )
    p.add_argument(
        "dest",
        metavar="DEST",
        help="the bundle to create: a directory, or a URL (s3://BUCKET/KEY: built in --staging, "
        "then uploaded, its completion marker last)",
    )
    p.add_argument(
        "--record-size",
        type=size,
        default=None,
        metavar="SIZE",
        help=f"uncompressed record size (default: {fmt.DEFAULT_RECORD_SIZE >> 10}KiB)",
    )
    p.add_argument(
        "--block-size",
        type=size,
        default=None,
        metavar="SIZE",
        help=f"shard block size (default: {fmt.DEFAULT_BLOCK_SIZE >> 10}KiB)",
    )
    p.add_argument(
        "--compression",
        default="lz4",
        metavar="CODEC",
        help="lz4 (default: fastest to read), zstd[:LEVEL] (smaller; LEVEL from -7 to 22, "
        "default 3; needs bundlefs[zstd]), none",
    )
    p.add_argument(
        "--shard-size",
        type=size,
        default=None,
        metavar="SIZE",
        help="start a new shard once one holds this much file data (default: 4GiB)",
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
    p.add_argument(
        "--user-data",
        metavar="FILE.jsonl",
        help="per-file metadata: JSON lines naming a file by 'file_name' (or 'path'); the rest "
        "of each object is stored with that file (default: none)",
    )
    p.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="metadata of the bundle itself (repeatable)",
    )
    p.add_argument(
        "--content-type",
        action="append",
        default=[],
        metavar="GLOB=TYPE",
        help="give files matching GLOB this media type ('GLOB=' for none; repeatable, the last "
        "match wins); others are detected from their extension and first bytes",
    )
    p.add_argument(
        "--no-content-types", action="store_true", help="store no detected content types"
    )
    p.add_argument(
        "--created",
        metavar="TIME",
        help="the creation time to record: seconds since the epoch or an ISO 8601 time "
        "(default: SOURCE_DATE_EPOCH if set, else now); fixed, two packs are byte-identical",
    )
    p.add_argument(
        "--no-sources",
        action="store_true",
        help="record no source ctime and inode number per file (what a later --check strict "
        "compares); without them, packs of two copies of a tree are byte-identical too",
    )
    p.add_argument("--force", action="store_true", help="replace an existing DEST")
    p.add_argument(
        "--staging",
        metavar="DIR",
        help="where a bundle for a URL is built before the upload (default: the temporary "
        "directory), and with --dask where the partitions are packed (default: beside DEST); "
        "it needs room for the whole bundle and is removed afterwards",
    )
    p.add_argument(
        "--skip-errors", action="store_true", help="skip unreadable files, and list them"
    )
    p.add_argument(
        "--files-from",
        metavar="LIST",
        help="pack exactly the paths LIST names, one a line, relative to the directory SRC ('-': "
        "stdin), stored in the listed order (default: the whole tree)",
    )
    p.add_argument(
        "-0", "--null", action="store_true", help="--files-from's paths end with NUL, not newline"
    )
    p.add_argument(
        "--base",
        metavar="OLD",
        help="a bundle of an earlier version of SRC: files unchanged since it are not read or "
        "stored again, their entries point at OLD's bytes (a local OLD's shards are hard-linked, "
        "else reflinked, else copied; a DEST on the object store OLD is on references OLD's "
        "shards there, uploading none of them; OLD is never modified); docs/versions.md "
        "(default: no base, every file read and stored)",
    )
    p.add_argument(
        "--materialize",
        action="store_true",
        help="with --base on an object store: have the store copy OLD's shards that DEST uses "
        "into DEST (server-side, nothing downloaded), so DEST stands alone, instead of "
        "referencing them (default: reference)",
    )
    p.add_argument(
        "--check",
        choices=("stat", "strict", "content"),
        default="stat",
        help="with --base, how a file is known unchanged: stat (type, size and mtime as fine as "
        "SRC keeps it, outside the racy window; the default), strict (also the ctime and inode "
        "number OLD recorded of a directory SRC's file; a file OLD has no record of is compared "
        "by content) or content (every file of OLD's size is read and compared with OLD's)",
    )
    p.add_argument(
        "--racy-seconds",
        type=float,
        default=2.0,
        metavar="S",
        help="with --base, a file whose mtime (with strict: or ctime) in OLD lies within S "
        "seconds before OLD was made is compared by content, never trusted by its stat "
        "(default: 2)",
    )
    p.add_argument(
        "--compact",
        action="store_true",
        help="with --base, compact as 'bundlefs compact' would, in the same publish: OLD's "
        "shards less live than --min-live are rewritten (their live records copied as stored), "
        "small shards merged on a geometric rule, new shards cut at --shard-size (default: "
        "OLD's shards linked as they are)",
    )
    p.add_argument(
        "--min-live",
        type=fraction,
        default=None,
        metavar="FRACTION",
        help=f"with --compact, rewrite the shards less live than this (0.5 or 50%%; default: "
        f"{DEFAULT_MIN_LIVE})",
    )
    p.add_argument(
        "--dedup",
        action="store_true",
        help="store each distinct file content once: a file whose content an earlier file of "
        "the pack has gets its own entry at that file's bytes (default: every file stored)",
    )
    p.add_argument(
        "--dask",
        metavar="ADDRESS|local:N",
        help="pack in partitions on a Dask cluster: a running scheduler's address, or local:N "
        "for N worker processes on this machine (needs bundlefs[dask]; SRC, DEST's directory "
        "and --staging must be paths every worker sees; default: no Dask, one process)",
    )
    p.add_argument(
        "--partitions",
        type=int,
        metavar="N",
        help="with --dask: how many tasks the pack is split into (default: 4 per worker, "
        "fewer for a small tree: one per 256MiB or 20,000 entries)",
    )
    p.add_argument(
        "-q", "--quiet", action="store_true", help="no progress and no summary (but --json's)"
    )
    p.add_argument(
        "--json", action="store_true", help="the summary as one JSON object (even with -q)"
    )


def check_values(
    compression: str, meta: tuple[tuple[str, str], ...], types: tuple[tuple[str, str], ...]
) -> None:
    """The option values a command line gives that the library would refuse as malformed: a
    usage error (exit 2), as argparse's own, rather than a failure of the pack (exit 1)."""
    from bundlefs.packing.options import parse_compression

    try:
        parse_compression(compression)
        for key, value in meta:
            fmt.meta_key(key)
            fmt.encode_meta_value(value)
        for _pattern, media_type in types:
            if media_type:
                fmt.encode_content_type(media_type)
    except (PackError, fmt.FormatError) as e:
        raise UsageError(str(e)) from None


def _pack_on_dask(
    args: argparse.Namespace,
    source: str | list[str],
    options: PackOptions,
    progress: Callable[[PackProgress], None] | None,
) -> PackSummary:
    """``--dask``: the pack split into partitions on a cluster (bundlefs.integrations.dask)."""
    try:
        from bundlefs.integrations import dask as on_dask
    except ImportError as e:
        if (e.name or "").split(".")[0] not in ("dask", "distributed"):
            raise
        raise PackError("--dask needs dask.distributed: pip install 'bundlefs[dask]'") from None
    try:
        on_dask.parse_spec(args.dask)
    except PackError as e:  # a malformed value: a usage error
        raise UsageError(str(e)) from None
    if args.partitions is not None and args.partitions < 1:
        raise UsageError(f"--partitions {args.partitions}: at least 1")
    with on_dask.connect(args.dask) as client:
        return on_dask.pack_with_dask(
            source,
            args.dest,
            client,
            options,
            partitions=args.partitions,
            progress=progress,
            base=args.base,
        )


def run(args: argparse.Namespace) -> int:
    from bundlefs.packing.packer import pack
    from bundlefs.packing.user_data import UserDataFile

    options = _options(args)
    sources = expand_sources(args.sources)
    source: str | list[str] = sources[0] if len(sources) == 1 else sources
    progress = None if args.quiet else _progress([] if args.files_from else source)
    if args.compact and args.dask is not None:
        raise UsageError("--compact compacts in one process: not with --dask")
    if args.compact and args.base is None:
        raise UsageError("--compact compacts a pack on a base: give --base OLD too")
    if args.min_live is not None and not args.compact:
        raise UsageError("--min-live says what --compact rewrites: give --compact too")
    if args.dask is not None and args.dedup:
        raise UsageError("--dedup packs in one process; it does not go with --dask")
    if args.dask is not None and args.files_from:
        raise UsageError("--files-from packs in one process; it does not go with --dask")
    if args.dask is not None:
        summary = _pack_on_dask(args, source, options, progress)
    elif args.partitions is not None:
        raise UsageError("--partitions splits a pack for --dask; give --dask too")
    else:
        summary = pack(source, args.dest, options, progress, base=args.base)
    status.clear()
    if isinstance(options.user_data, UserDataFile):
        _warn_unused(options.user_data, args.user_data)
    done = exit_status(summary)
    if args.json:  # --json always prints its object: -q quiets the human text only
        out_json(summary.to_dict())
    elif not args.quiet:
        out(summary_line(summary))
        if summary.reuse is not None:
            out(reuse_line(summary.reuse))
        if summary.compaction is not None:
            out(compaction_line(summary.compaction))
        if summary.dedup_files:
            out(dedup_line(summary.dedup_files, summary.dedup_bytes))
    return done


def _options(args: argparse.Namespace) -> PackOptions:
    """The command line's ``PackOptions``, malformed values a usage error."""
    from bundlefs.packing.options import PackOptions
    from bundlefs.packing.user_data import UserDataFile

    meta = key_value_pairs(args.meta, "--meta")
    content_types = key_value_pairs(args.content_type, "--content-type")
    check_values(args.compression, meta, content_types)
    defaults = PackOptions()
    return PackOptions(
        record_size=args.record_size or defaults.record_size,
        block_size=args.block_size or defaults.block_size,
        compression=args.compression,
        shard_size=args.shard_size or defaults.shard_size,
        excludes=tuple(args.exclude),
        force=args.force,
        skip_errors=args.skip_errors,
        jobs=max(1, args.jobs),
        user_data=UserDataFile(args.user_data) if args.user_data else None,
        meta=meta,
        content_types=content_types,
        detect_content_types=not args.no_content_types,
        created_ns=parse_time(args.created) if args.created else None,
        record_sources=not args.no_sources,
        storage_options=storage_options(args) or None,
        staging=args.staging,
        files_from=read_files_from(args.files_from, args.null) if args.files_from else None,
        check=args.check,
        racy_seconds=args.racy_seconds,
        materialize=args.materialize,
        dedup=args.dedup,
        compact=args.compact,
        min_live=DEFAULT_MIN_LIVE if args.min_live is None else args.min_live,
    )


def _progress(source: str | list[str]) -> Callable[[PackProgress], None]:
    """The progress line's callback: counts and rate, and for a directory a percentage and an
    ETA once a background walk has summed its bytes."""
    directory = source if isinstance(source, str) and os.path.isdir(source) else None
    totals = SourceTotals(directory) if status.enabled and directory is not None else None

    def progress(p: PackProgress) -> None:
        if p.upload is not None:
            status.show(upload_line(p.upload))
            return
        elapsed = time.monotonic() - p.started
        line = (
            f"packing: {p.files:,} files, {p.dirs:,} dirs, {format_size(p.bytes_read)} "
            f"({rate(p.bytes_read, elapsed)}), {elapsed:.0f} s"
        )
        if totals is not None and totals.done and totals.bytes and p.bytes_read:
            left = max(0, totals.bytes - p.bytes_read) * elapsed / p.bytes_read
            percent = min(100, 100 * p.bytes_read // totals.bytes)
            line += f", {percent}%, ETA {left:.0f} s"
        status.show(line)

    return progress


def _warn_unused(user_data: UserDataFile, path: str) -> None:
    """One warning naming the --user-data paths that are not files of the bundle."""
    unused = user_data.unused()
    if unused:
        warn(
            f"{count(len(unused), 'path')} in {path} "
            f"{'is not a file' if len(unused) == 1 else 'are not files'} of the bundle, e.g. "
            f"{unused[0]!r}"
        )
