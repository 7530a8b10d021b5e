"""``bundlefs verify BUNDLE``: the progress line, the report, the status.

The report is a summary by default — per shard, then the rest of the bundle, per kind of problem:
the count and the first few (a truncated shard first: it explains the rest) — so a damaged
bundle is a screenful, not thousands of lines; ``--list`` prints every problem and every damaged
file, ``--json`` the whole report.

May import: the library layers, ``bundlefs.cli.output``, ``bundlefs.cli.options``.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from bundlefs.cli.options import bundle_options
from bundlefs.cli.output import EXIT_FAILURE, EXIT_OK, error, out, out_json, rate, status
from bundlefs.core.units import format_size

if TYPE_CHECKING:
    from bundlefs.read.verify import Problem, VerifyProgress, VerifyReport


# Problems (or damaged files) shown per group before "… and N more": --list shows all.
_FIRST = 3
# The order kinds are shown in within a group: what explains the rest comes first.
_KINDS = ("marker", "index", "config", "shard", "record", "entry", "file")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", help="the bundle directory, or its URL")
    out_format = p.add_mutually_exclusive_group()
    out_format.add_argument(
        "--list",
        action="store_true",
        help="print every problem and every damaged file (default: a summary per shard and "
        f"per kind of problem, the first {_FIRST} of each)",
    )
    out_format.add_argument(
        "--json", action="store_true", help="print the whole report as one JSON object"
    )
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
            f"{report.hardlinks:,} hard links, {report.records:,} records in "
            f"{_count(report.shards, 'shard')}: {report.bytes_checked:,} of "
            f"{report.stored_bytes:,} stored bytes and the {report.index_bytes:,}-byte index in "
            f"{report.seconds:.2f} s ({rate(report.bytes_checked, report.seconds)})"
        )
        if report.ok:
            out(f"OK: {report.bundle} is intact")
        elif args.list:
            _print_every_problem(report)
        else:
            _print_summary(report, args.bundle)
    if report.ok:
        return EXIT_OK
    error(
        f"{report.bundle} is damaged: {len(report.problems)} problems, "
        f"{len(report.damaged_files)} damaged files"
    )
    return EXIT_FAILURE


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def _print_every_problem(report: VerifyReport) -> None:
    out(f"{_count(len(report.problems), 'problem')}:")
    for problem in report.problems:
        out(f"  {problem.message}")
    if report.damaged_files:
        out(f"{_count(len(report.damaged_files), 'damaged file')}:")
        for path in report.damaged_files:
            out(f"  {path}")


def _print_summary(report: VerifyReport, bundle: str) -> None:
    """Per shard (then the rest of the bundle), per kind of problem: the count and the first
    few; damaged files as their count and first names."""
    groups: dict[int | None, dict[str, list[Problem]]] = {}
    for problem in report.problems:
        groups.setdefault(problem.shard, {}).setdefault(problem.kind, []).append(problem)
    order = sorted(s for s in groups if s is not None) + ([None] if None in groups else [])
    for shard in order:
        out(f"shard {shard}:" if shard is not None else "the rest of the bundle:")
        kinds = groups[shard]
        for kind in sorted(kinds, key=lambda k: _KINDS.index(k) if k in _KINDS else len(_KINDS)):
            problems = kinds[kind]
            if kind == "file":
                names = [p.path or p.message for p in problems]
                shown = ", ".join(names[:_FIRST])
                more = f" and {len(names) - _FIRST:,} more" if len(names) > _FIRST else ""
                out(f"  {_count(len(names), 'damaged file')}: {shown}{more}")
                continue
            out(f"  {_count(len(problems), kind + ' problem')}:")
            for problem in problems[:_FIRST]:
                out(f"    {problem.message}")
            if len(problems) > _FIRST:
                out(f"    … and {len(problems) - _FIRST:,} more")
    other_names = len(report.damaged_files) - sum(
        len(kinds.get("file", [])) for kinds in groups.values()
    )
    if other_names > 0:
        out(f"{_count(other_names, 'more name')} of damaged files (hard links)")
    out(f"'bundlefs verify --list {bundle}' prints every problem and every damaged file")
