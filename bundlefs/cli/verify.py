"""``bundlefs verify BUNDLE``: the progress line, the report (human or ``--json``), the status.

May import: the library layers, ``bundlefs.cli.output``, ``bundlefs.cli.options``.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from bundlefs.cli.options import BUNDLE_HELP, bundle_options
from bundlefs.cli.output import EXIT_FAILURE, EXIT_OK, error, out, out_json, rate, status
from bundlefs.core.units import format_size

if TYPE_CHECKING:
    from bundlefs.read.verify import VerifyProgress


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE_HELP)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress")


def run(args: argparse.Namespace) -> int:
    from bundlefs.read.verify import verify

    def progress(p: VerifyProgress) -> None:
        elapsed = time.monotonic() - p.started
        total = f"/{p.total:,}" if p.total else ""
        status.show(
            f"verifying {p.phase}: {p.done:,}{total}, {format_size(p.bytes_checked)} checked "
            f"({rate(p.bytes_checked, elapsed)}), {elapsed:.0f} s"
        )

    report = verify(args.bundle, None if args.quiet else progress, **bundle_options(args))
    status.clear()
    if args.json:
        out_json(report.to_dict())
    else:
        out(
            f"checked {report.files:,} files, {report.dirs:,} dirs, {report.symlinks:,} symlinks, "
            f"{report.hardlinks:,} hard links, {report.records:,} records in {report.shards:,} "
            f"shards: {report.bytes_checked:,} bytes in {report.seconds:.2f} s "
            f"({rate(report.bytes_checked, report.seconds)})"
        )
        if report.ok:
            out(f"OK: {report.bundle} is intact")
        else:
            out(f"{len(report.problems)} problems:")
            for problem in report.problems:
                out(f"  {problem.message}")
            if report.damaged_files:
                out(f"{len(report.damaged_files)} damaged files:")
                for path in report.damaged_files:
                    out(f"  {path}")
    if report.ok:
        return EXIT_OK
    error(
        f"{report.bundle} is damaged: {len(report.problems)} problems, "
        f"{len(report.damaged_files)} damaged files"
    )
    return EXIT_FAILURE
