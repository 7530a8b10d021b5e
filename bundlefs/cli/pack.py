"""``bundlefs pack SRC DEST``: the options, the progress line and the one-line summary.

May import: the library layers, ``bundlefs.cli.output``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import threading
import time
from typing import TYPE_CHECKING

from bundlefs.cli.output import EXIT_OK, out, out_json, rate, size, status
from bundlefs.core.units import format_size

if TYPE_CHECKING:
    from bundlefs.packing.packer import PackProgress


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="the directory tree to pack")
    p.add_argument("dest", help="the bundle to create (a directory)")
    p.add_argument(
        "--record-size", type=size, default=None, metavar="SIZE", help="uncompressed record size"
    )
    p.add_argument("--block-size", type=size, default=None, metavar="SIZE", help="shard block size")
    p.add_argument("--compression", choices=("lz4", "none"), default="lz4")
    p.add_argument(
        "--shard-size",
        type=size,
        default=None,
        metavar="SIZE",
        help="start a new shard once one holds this much file data (4GiB)",
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
    p.add_argument("--force", action="store_true", help="replace an existing DEST")
    p.add_argument(
        "--skip-errors", action="store_true", help="skip unreadable files, and list them"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress and no summary")
    p.add_argument("--json", action="store_true", help="the summary as one JSON object")


class _SourceTotals:
    """Bytes of regular files under the source, summed by a background walk for the ETA.

    Only when a progress line is shown; it never slows the pack itself (one thread of lstat).
    """

    def __init__(self, source: str) -> None:
        self.bytes = 0
        self.done = False
        threading.Thread(target=self._walk, args=(source,), daemon=True).start()

    def _walk(self, source: str) -> None:
        total = 0
        for top, _dirs, files in os.walk(source):
            for name in files:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(top, name))
                    if stat.S_ISREG(st.st_mode):
                        total += st.st_size
        self.bytes, self.done = total, True


def run(args: argparse.Namespace) -> int:
    from bundlefs.packing.packer import PackOptions, pack

    defaults = PackOptions()
    options = PackOptions(
        record_size=args.record_size or defaults.record_size,
        block_size=args.block_size or defaults.block_size,
        compression=args.compression,
        shard_size=args.shard_size or defaults.shard_size,
        excludes=tuple(args.exclude),
        force=args.force,
        skip_errors=args.skip_errors,
        jobs=max(1, args.jobs),
    )

    totals = _SourceTotals(args.source) if status.enabled else None

    def progress(p: PackProgress) -> None:
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

    summary = pack(args.source, args.dest, options, None if args.quiet else progress)
    status.clear()
    if args.quiet:
        return EXIT_OK
    if args.json:
        out_json(summary.to_dict())
        return EXIT_OK
    c = summary.config
    ratio = c.data_bytes / summary.stored_bytes if summary.stored_bytes else 0.0
    notes = []
    if summary.skipped:
        notes.append(f"{len(summary.skipped)} skipped")
    if summary.changed:
        notes.append(f"{len(summary.changed)} changed while packing")
    note = f" ({', '.join(notes)}: see the warnings above)" if notes else ""
    out(
        f"packed {c.file_count:,} files, {c.dir_count:,} dirs, {c.data_bytes:,} bytes into "
        f"{summary.stored_bytes:,} stored bytes (ratio {ratio:.2f}) in {summary.seconds:.2f} s "
        f"({rate(c.data_bytes, summary.seconds)}): {summary.dest}{note}"
    )
    return EXIT_OK
