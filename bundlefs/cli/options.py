"""Options several commands share: where a bundle lives and how a remote one is cached.

Every command that names a bundle takes it as a local path or a URL (``s3://bucket/x.bundle``,
docs/storage.md), ``--storage-option KEY=VALUE`` (repeatable: credentials, endpoint, region;
parsed by ``bundlefs.storage.location.parse_storage_options``) and ``--storage-options-file FILE``
(the same in a file only its owner can read; ``cli.scrub`` turns the pairs given on a command
line into one of these, so no secret stays in ``ps``); the commands that read one also
take ``--disk-cache DIR`` and ``--disk-cache-size SIZE``, the on-disk record cache of a remote
bundle, and ``--store-timeout SECONDS``, what a read waits for a store that does not answer.
``cli.app`` adds them to a command as argparse parents (``PARENTS``), so each is defined once;
``remote_options`` turns what was given into the ``RemoteOptions`` of ``Bundle`` and ``verify``.
Also the value parsers ``pack`` and ``merge`` share: ``key_value_pairs``, ``parse_time``; and
``HelpFormatter``, every parser's.

May import: the library layers, ``bundlefs.cli.output``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import TYPE_CHECKING, Any

from bundlefs.cli.output import size
from bundlefs.errors import UsageError
from bundlefs.read.options import ReadOptions, RemoteOptions
from bundlefs.storage.location import merged_storage_options

if TYPE_CHECKING:
    from bundlefs.read.bundle import Bundle

STORAGE = "storage"
DISK_CACHE = "disk-cache"


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, with the terminal's width found without ``shutil``: argparse imports it for
    ``get_terminal_size`` in every parser's first ``add_argument``, and it loads bz2 and lzma,
    ~5 ms and two compiled modules of every command's start (a mount's included)."""

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
        width: int | None = None,
    ) -> None:  # fmt: skip
        if width is None:
            width = _terminal_columns() - 2  # as argparse
        super().__init__(prog, indent_increment, max_help_position, width)


def _terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``: $COLUMNS, else stdout's terminal, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def _storage_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, formatter_class=HelpFormatter)
    group = p.add_argument_group("bundles on object stores (BUNDLE may be a URL: s3://BUCKET/KEY)")
    group.add_argument(
        "--storage-option",
        dest="storage_option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the store's fsspec back-end, e.g. endpoint_url=http://host:9000, "
        "key=…, secret=…, profile=…, client_kwargs.region_name=… (repeatable; also "
        "BUNDLEFS_STORAGE_OPTIONS, a JSON object)",
    )
    group.add_argument(
        "--storage-options-file",
        dest="storage_options_file",
        action="append",
        default=[],
        metavar="FILE",
        help="storage options from FILE: a JSON object or KEY=VALUE lines; refused unless "
        "mode 0600 or stricter, owned by you or root (repeatable; --storage-option wins)",
    )
    return p


def _disk_cache_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, formatter_class=HelpFormatter)
    group = p.add_argument_group("the on-disk record cache of a bundle at a URL")
    group.add_argument(
        "--disk-cache",
        metavar="DIR",
        default=None,
        help="keep fetched records (and the index) here, across runs (default: "
        "$BUNDLEFS_CACHE_DIR, else $XDG_CACHE_HOME/bundlefs, else ~/.cache/bundlefs)",
    )
    group.add_argument(
        "--disk-cache-size",
        type=size,
        default=None,
        metavar="SIZE",
        help="bound the disk cache, e.g. 20GiB (default: 1GiB; 0 keeps no records on disk)",
    )
    group.add_argument(
        "--store-timeout",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="the longest a read waits for a store that does not answer (default 20); "
        "during an outage reads of records not cached then fail at once",
    )
    return p


def seconds(text: str) -> float:
    """A positive number of seconds, at most an hour (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 3600:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"{text} is not more than 0 and at most 3600 seconds")
    return value


def fraction(text: str) -> float:
    """A fraction from 0 to 1, as ``0.5`` or ``50%`` (argparse type: ``--min-live``)."""
    number = text[:-1] if text.endswith("%") else text
    try:
        value = float(number) / (100 if number is not text else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction (0.5 or 50%)") from None
    if not 0 <= value <= 1:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"{text} is not a fraction from 0 to 1 (0% to 100%)")
    return value


# Built once: argparse copies a parent's arguments into each parser that names it.
PARENTS: dict[str, argparse.ArgumentParser] = {
    STORAGE: _storage_parent(),
    DISK_CACHE: _disk_cache_parent(),
}


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--storage-options-file``s, then the ``--storage-option`` pairs, as one dict ({} when
    none were given). Read once per command: a file may be a pipe (``cli.scrub``)."""
    cached = getattr(args, "_storage_options", None)
    if cached is None:
        cached = merged_storage_options(
            getattr(args, "storage_options_file", None) or [],
            getattr(args, "storage_option", None) or [],
        )
        args._storage_options = cached
    return dict(cached)


def remote_options(args: argparse.Namespace) -> RemoteOptions:
    """The options of a bundle at a URL the user gave (for ``Bundle`` and ``verify``): only
    those, so a local bundle opens exactly as it always did."""
    return RemoteOptions(
        storage_options=storage_options(args) or None,
        disk_cache=getattr(args, "disk_cache", None),
        disk_cache_size=getattr(args, "disk_cache_size", None),
        store_timeout=getattr(args, "store_timeout", None),
    )


def open_bundle(path: str, args: argparse.Namespace, **keywords: Any) -> Bundle:
    """``Bundle(path, ...)`` with the location options of ``args`` (imported when called)."""
    from bundlefs.read.bundle import Bundle

    return Bundle(path, options=ReadOptions(remote=remote_options(args)), **keywords)


BUNDLE_HELP = "the bundle: its directory, or a URL (s3://BUCKET/KEY)"


def key_value_pairs(items: list[str], option: str) -> tuple[tuple[str, str], ...]:
    """``--meta``'s and ``--content-type``'s ``KEY=VALUE`` items as pairs (pack, merge)."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} {item!r}: expected {option[2:].upper()}=VALUE")
        pairs.append((key, value))
    return tuple(pairs)


def parse_time(text: str) -> int:
    """``--created``: seconds since the epoch (``1700000000``, ``1700000000.5``) or ISO 8601
    -> ns (pack, merge)."""
    try:
        return round(float(text) * 10**9) if re.fullmatch(r"-?\d+(\.\d+)?", text) else _iso(text)
    except ValueError:
        raise UsageError(
            f"--created {text!r} is neither seconds since the epoch nor an ISO 8601 time"
        ) from None


def _iso(text: str) -> int:
    import datetime

    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)  # a bare time is UTC, not local
    since = moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return (since.days * 86400 + since.seconds) * 10**9 + since.microseconds * 1000
