"""``bundlefs verify BUNDLE``: the progress line, the report, the status.

The report is a summary by default — per shard, then the rest of the bundle, per kind of problem:
the count and the first few (a truncated shard first: it explains the rest) — so a damaged
bundle is a screenful, not thousands of lines; ``--list`` prints every problem and every damaged
file, ``--json`` the whole report. ``--shard N[-M]`` checks only those shards (and their files).

May import: the library layers, ``bundlefs.cli.output``, ``bundlefs.cli.options``.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from bundlefs.cli.options import BUNDLE_HELP, remote_options
from bundlefs.cli.output import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    count,
    error,
    out,
    out_json,
    rate,
    status,
)
from bundlefs.core.units import format_size

if TYPE_CHECKING:
    from bundlefs.read.verify import Problem, VerifyProgress, VerifyReport


# Problems (or damaged files) shown per group before "… and N more": --list shows all.
_FIRST = 3
# The order kinds are shown in within a group: what explains the rest comes first.
_KINDS = ("marker", "index", "config", "shard", "record", "entry", "file")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE_HELP)
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
    p.add_argument(
        "--shard",
        dest="shards",
        metavar="N[-M]",
        action="append",
        type=shard_numbers,
        help="check only shard N (or shards N to M; repeatable, or N,M,…): their headers, records "
        "and the files stored in them, as after transferring a few (the index and tree are "
        "always checked)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress")


def shard_numbers(text: str) -> list[int]:
    """``--shard``'s value: ``N``, ``N-M`` (both included), or several joined by commas."""
    numbers: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last if dash else first)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a shard number or range: {part!r}") from None
        if low < 0 or high < low:
            raise argparse.ArgumentTypeError(f"not a shard range: {part!r}")
        numbers.extend(range(low, high + 1))
    return numbers


def shown_ranges(numbers: list[int]) -> str:
    """Sorted shard numbers as ranges: ``0-3, 7``."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def run(args: argparse.Namespace) -> int:
    from bundlefs.read.verify import UnknownShard, verify

    def progress(p: VerifyProgress) -> None:
        elapsed = time.monotonic() - p.started
        total = f"/{p.total:,}" if p.total else ""
        status.show(
            f"verifying {p.phase}: {p.done:,}{total}, {format_size(p.bytes_checked)} checked "
            f"({rate(p.bytes_checked, elapsed)}), {elapsed:.0f} s"
        )

    shards = None if args.shards is None else sorted({n for ns in args.shards for n in ns})
    try:
        report = verify(
            args.bundle,
            None if args.quiet else progress,
            remote=remote_options(args),
            shards=shards,
        )
    except UnknownShard as e:
        status.clear()
        error(str(e))
        return EXIT_USAGE
    status.clear()
    if args.json:
        out_json(report.to_dict())
    else:
        _print_totals(report)
        if report.ok:
            out(f"OK: {report.bundle} is intact" + ("" if shards is None else " in those shards"))
        elif args.list:
            _print_every_problem(report)
        else:
            _print_summary(report, args.bundle)
    if report.ok:
        return EXIT_OK
    error(
        f"{report.bundle} is damaged: {count(len(report.problems), 'problem')}, "
        f"{count(len(report.damaged_files), 'damaged file')}"
    )
    return EXIT_FAILURE


def _print_totals(report: VerifyReport) -> None:
    """What was checked: the whole bundle's counts, or the shards asked for and their files."""
    if report.shards_checked is not None:
        out(
            f"checked shards {shown_ranges(report.shards_checked)} of {report.shards}: "
            f"{count(report.records, 'record')}, {count(report.files_checked, 'file')} stored in "
            f"them, {count(report.bytes_checked, 'byte')} of shards read sound of "
            f"{report.stored_bytes:,}, and the {report.index_bytes:,}-byte index, in "
            f"{report.seconds:.2f} s ({rate(report.bytes_checked, report.seconds)})"
        )
        return
    out(
        f"checked {count(report.files, 'file')}, {count(report.dirs, 'dir')}, "
        f"{count(report.symlinks, 'symlink')}, {count(report.hardlinks, 'hard link')}, "
        + (f"{count(report.specials, 'special file')}, " if report.specials else "")
        + f"{count(report.records, 'record')} in {count(report.shards, 'shard')}: "
        f"{_checked_bytes(report)} in {report.seconds:.2f} s "
        f"({rate(report.bytes_checked, report.seconds)})"
    )


def _print_every_problem(report: VerifyReport) -> None:
    out(f"{count(len(report.problems), 'problem')}:")
    for problem in report.problems:
        out(f"  {problem.message}")
    if report.damaged_files:
        out(f"{count(len(report.damaged_files), 'damaged file')}:")
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
                out(f"  {count(len(names), 'damaged file')}: {shown}{more}")
                continue
            out(f"  {count(len(problems), kind + ' problem')}:")
            for problem in problems[:_FIRST]:
                out(f"    {problem.message}")
            if len(problems) > _FIRST:
                out(f"    … and {len(problems) - _FIRST:,} more")
    other_names = len(report.damaged_files) - sum(
        len(kinds.get("file", [])) for kinds in groups.values()
    )
    if other_names > 0:
        out(f"{count(other_names, 'more name')} of damaged files (hard links)")
    out(f"'bundlefs verify --list {bundle}' prints every problem and every damaged file")


def _checked_bytes(report: VerifyReport) -> str:
    """What was checked, in the figures ``info`` prints (file data, stored bytes, index size),
    so the two commands agree; the stored bytes read sound as well where they fall short (a
    damaged shard), and the raw count where the bundle did not open for its facts."""
    if report.data_bytes is None:
        return f"{count(report.bytes_checked, 'byte')} read"
    sound = (
        ""
        if report.bytes_checked == report.stored_bytes
        else f" ({report.bytes_checked:,} of them read sound)"
    )
    return (
        f"{count(report.data_bytes, 'byte')} of file data, stored in "
        f"{count(report.stored_bytes, 'byte')} of shards{sound}, and a "
        f"{report.index_bytes:,}-byte index"
    )
