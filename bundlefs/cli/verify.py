"""``bundlefs verify BUNDLE``: the progress line, the report (human or ``--json``), the status.

May import: the library layers, ``bundlefs.cli.output``, ``bundlefs.cli.options``.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from bundlefs.cli.options import BUNDLE_HELP, bundle_options, open_bundle
from bundlefs.cli.output import EXIT_FAILURE, EXIT_OK, count, error, out, out_json, rate, status
from bundlefs.core.units import format_size
from bundlefs.errors import BundleError

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
            f"checked {count(report.files, 'file')}, {count(report.dirs, 'dir')}, "
            f"{count(report.symlinks, 'symlink')}, {count(report.hardlinks, 'hard link')}, "
            f"{count(report.records, 'record')} in {count(report.shards, 'shard')}: "
            f"{_checked_bytes(args, report.bytes_checked)} in {report.seconds:.2f} s "
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


def _checked_bytes(args: argparse.Namespace, checked: int) -> str:
    """What was checked, in the figures ``info`` prints (file data, stored bytes, index size),
    so the two commands agree; the raw count where the bundle does not open for its facts."""
    try:
        with open_bundle(args.bundle, args) as bundle:
            facts = bundle.info()
    except (BundleError, OSError):
        return f"{count(checked, 'byte')} read"
    return (
        f"{count(facts.config.data_bytes, 'byte')} of file data, stored in "
        f"{count(facts.shard_bytes, 'byte')} of shards, and a {facts.index_bytes:,}-byte index"
    )
