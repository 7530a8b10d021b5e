"""``bundlefs info``: what a bundle holds, and what serves it.

It also takes a bundlefs mount point: it reads the mount table and asks the daemon, through
xattrs of the mount root, what it serves and its statistics (``bundlefs.mount.table``), never
through a FUSE binding. It mentions what killed packs left beside a bundle (``bundlefs gc``),
and warns of a shard whose size is not its table's (``Bundle.damaged_shards``).
A bundle at a URL (docs/storage.md) adds where it lives and its store's counters.

May import: the library layers, ``bundlefs.mount.table``, ``bundlefs.cli.output``,
``bundlefs.cli.options``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING, Any

from bundlefs.cli.options import BUNDLE_HELP, fraction, open_bundle, storage_options
from bundlefs.cli.output import EXIT_OK, count, out, out_json, ratio, warn
from bundlefs.core.units import format_size
from bundlefs.errors import BundleError, NotABundleError
from bundlefs.storage.liveness import DEFAULT_MIN_LIVE
from bundlefs.storage.location import has_scheme, parse_location

if TYPE_CHECKING:
    from bundlefs.storage.publish import Partial


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "bundle",
        metavar="BUNDLE",
        help=BUNDLE_HELP + ", or a bundlefs mount point (adds daemon statistics)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--dead",
        action="store_true",
        help="also the stored bytes no file of the bundle uses (dead: 'bundlefs compact' drops "
        "them), from one pass over the index",
    )
    p.add_argument(
        "--min-live",
        type=fraction,
        default=DEFAULT_MIN_LIVE,
        metavar="FRACTION",
        help="with --dead, count the shards less live than this (default: 0.5)",
    )


def run(args: argparse.Namespace) -> int:
    from bundlefs.mount.table import daemon_stats, mounted_bundle, served_bundle

    path = args.bundle
    remote = has_scheme(path) and not parse_location(path).is_local
    source = None if remote else mounted_bundle(path)
    if source is not None:
        # Ask the daemon: a pack --force since the mount put a new bundle at the path, while the
        # daemon still serves the one it opened. (A daemon too old to say: read the path.)
        daemon = daemon_stats(path)
        facts = served_bundle(path) or _bundle_facts(source, args)
        if args.dead and "dead_bytes" not in facts:  # the daemon's facts say no liveness
            on_disk = _bundle_facts(source, args)
            if on_disk["bundle_id"] == facts["bundle_id"]:  # else an "on disk" line says so
                facts.update({k: v for k, v in on_disk.items() if k in _LIVENESS_KEYS})
        facts["daemon"] = daemon
        replaced_by = _replaced_by(source, facts, args)
        if replaced_by is not None:
            facts["replaced_on_disk_by"] = replaced_by
    else:
        facts = _bundle_facts(path, args)
        # A URL has no local directory where killed packs leave partials.
        leftovers = [] if remote else _leftover_partials(os.path.dirname(os.path.abspath(path)))
        if leftovers:
            facts["stale_partials"] = [p.to_dict() for p in leftovers]
    damaged: list[dict[str, object]] = facts.get("damaged_shards", [])  # type: ignore[assignment]
    for damage in damaged:
        warn(
            f"{path}: {damage['message']}; files stored in what it lacks do not read "
            f"('bundlefs verify {path}' names them)"
        )
    if args.json:
        out_json(facts)
        return EXIT_OK
    rows = _info_rows(facts)
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        out(f"{key:<{width}}  {value}")
    return EXIT_OK


_LIVENESS_KEYS = frozenset(
    [
        "live_bytes",
        "dead_bytes",
        "live_records",
        "dead_records",
        "sparse_shards",
        "dead_shards",
        "min_live",
    ]
)


def _bundle_facts(path: str, args: argparse.Namespace) -> dict[str, object]:
    """``info --json`` of the bundle at ``path``. A directory that is not one but holds what
    killed packs left says so, and how to remove it."""
    try:
        with open_bundle(path, args) as bundle:
            facts = bundle.info(dead=args.dead, min_live=args.min_live).to_dict()
            if bundle.damaged_shards:
                facts["damaged_shards"] = [d.to_dict() for d in bundle.damaged_shards]
            return facts
    except NotABundleError as e:
        leftovers = _leftover_partials(path) if os.path.isdir(path) else []
        if not leftovers:
            raise
        size = format_size(sum(p.size for p in leftovers))
        raise NotABundleError(
            f"{e}; it holds {count(len(leftovers), 'partial bundle')} left by killed packs "
            f"({size}), "
            f"which 'bundlefs gc {path}' removes"
        ) from None


def _leftover_partials(directory: str) -> list[Partial]:
    """The partials in ``directory`` nobody is writing (what killed packs left); [] if unknown."""
    from bundlefs.storage.publish import find_partials

    try:
        return [p for p in find_partials(directory) if not p.in_use]
    except OSError:
        return []


def _replaced_by(path: str, served: dict[str, object], args: argparse.Namespace) -> str | None:
    """What is at ``path`` now if it is not the bundle served (its id), else None."""
    from bundlefs.storage.marker import read_marker

    if has_scheme(path) and not parse_location(path).is_local:
        return _remote_replaced_by(path, served, args)
    try:
        on_disk = read_marker(path).bundle_id.hex()
    except (OSError, BundleError):
        return "something that is not a bundle"
    return None if on_disk == served.get("bundle_id") else f"bundle {on_disk}"


def _remote_replaced_by(
    url: str, served: dict[str, object], args: argparse.Namespace
) -> str | None:
    """The same for a mounted URL: its completion marker, fetched once with bounded waits.

    Only with storage options (``--storage-option``, ``BUNDLEFS_STORAGE_OPTIONS``): the daemon's
    stay in the daemon, and asking the default endpoint instead (AWS) could find another bucket
    of that name and say something false. None when the store cannot be asked now: an
    unreachable store is not a replaced bundle.
    """
    from bundlefs.core import format as fmt
    from bundlefs.core.checksum import crc32c
    from bundlefs.storage.objectstore.index_fetch import fetch_marker

    location = parse_location(url, storage_options(args))
    if not location.storage_options:
        return None
    try:
        data = fetch_marker(location)
    except NotABundleError:
        return "nothing that opens (no completion marker: a pack --force is uploading?)"
    except BundleError:  # unreachable, refused, no back-end: we cannot tell, so say nothing
        return None
    try:
        on_store = fmt.decode_marker(data, crc32c).bundle_id.hex()
    except BundleError:
        return "something that is not a bundle"
    return None if on_store == served.get("bundle_id") else f"bundle {on_store}"


def _info_rows(facts: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("bundle", str(facts["path"]))]
    rows += _location_rows(facts)
    rows += [
        ("bundle id", str(facts["bundle_id"])),
        ("format", f"version {facts['format_version']}"),
        ("files", f"{facts['files']:,}"),
        ("directories", f"{facts['dirs']:,}"),
        ("symlinks", f"{facts['symlinks']:,}"),
        ("hard links", f"{facts['hardlinks']:,}"),
        *([("special files", f"{facts['specials']:,}")] if facts.get("specials") else []),
        ("bytes", f"{facts['bytes']:,} ({format_size(facts['bytes'])})"),
        ("stored bytes", f"{facts['stored_bytes']:,} ({format_size(facts['stored_bytes'])})"),
        *_liveness_rows(facts),
        ("ratio", ratio(facts["bytes"], facts["stored_bytes"])),
        ("shards", f"{facts['shards']:,}"),
        ("index size", f"{facts['index_bytes']:,} ({format_size(facts['index_bytes'])})"),
        ("record size", format_size(facts["record_size"])),
        ("block size", format_size(facts["block_size"])),
        ("compression", str(facts["compression"])),
    ]
    if facts.get("created_ns"):
        seconds = facts["created_ns"] // 10**9
        rows.append(("created", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))))
    if facts.get("content_types"):
        rows.append(("content types", f"{facts['content_types']:,}"))
    if facts.get("digests"):
        rows.append(("digests", str(facts["digests"])))
    for key, value in facts.get("meta", {}).items():
        rows.append((f"meta {key}", value))
    for base in facts.get("bases", []):  # version 6: shards read from other bundles
        rows.append(("base", f"{base['location']} (bundle id {base['bundle_id'][:12]}…)"))
    if "replaced_on_disk_by" in facts:
        replaced = f"replaced by {facts['replaced_on_disk_by']} since it was mounted"
        where = "on store" if facts.get("location") else "on disk"
        rows.append((where, replaced + " (remount to serve that)"))
    rows += _daemon_rows(dict(facts.get("daemon", {})))
    leftovers = facts.get("stale_partials", [])
    if leftovers:
        where = os.path.dirname(leftovers[0]["path"])
        size = format_size(sum(p["bytes"] for p in leftovers))
        rows.append(
            (
                "partials",
                f"{len(leftovers)} left by killed packs in {where} ({size}): "
                f"'bundlefs gc {where}' removes them",
            )
        )
    return rows


def _liveness_rows(facts: dict[str, Any]) -> list[tuple[str, str]]:
    """``--dead``: the stored bytes some file uses, the rest, and the sparse shards."""
    if "dead_bytes" not in facts:
        return []
    stored, live, dead = facts["stored_bytes"], facts["live_bytes"], facts["dead_bytes"]
    share = f"{dead / stored:.1%}" if stored else "0%"
    sparse = facts["sparse_shards"]
    shared = facts.get("shared_files", 0)
    dedup = [
        (
            "dedup",
            f"{count(shared, 'file')} ({format_size(facts['shared_bytes'])}) share an earlier "
            "file's content",
        )
    ]
    return [
        ("live bytes", f"{live:,} ({format_size(live)})"),
        (
            "dead bytes",
            f"{dead:,} ({format_size(dead)}, {share} of stored): "
            f"{count(facts['dead_records'], 'record')} no file uses",
        ),
        (
            "sparse shards",
            f"{sparse:,} of {facts['shards']:,} less than {facts['min_live']:.0%} live"
            + (" ('bundlefs compact' rewrites them)" if sparse else ""),
        ),
        *(dedup if shared else []),
    ]


def _daemon_rows(daemon: dict[str, Any]) -> list[tuple[str, str]]:
    """The serving daemon's figures (a mount point's ``info``): the whole mount's counters, how
    many processes serve it (and why one, where that is so), then each worker process."""
    workers = daemon.pop("worker_processes", [])
    options = daemon.pop("options", None)
    if isinstance(options, dict):  # the effective mount options, as k=v
        daemon["options"] = " ".join(f"{k}={v}" for k, v in sorted(options.items()))
    reason = daemon.pop("single_process_reason", "")
    if "workers" in daemon:
        count = daemon.pop("workers")
        daemon["workers"] = f"{count} ({reason})" if reason else count
    if "pid" in daemon:
        daemon["pid"] = str(daemon["pid"])  # a number to type into kill, not a count
    rows = [(f"daemon {k.replace('_', ' ')}", _daemon_value(v)) for k, v in sorted(daemon.items())]
    for w in workers:
        resident = "?" if w.get("rss_bytes") is None else format_size(w["rss_bytes"])
        rows.append(
            (
                f"daemon worker {w['slot']}",
                f"pid {w['pid']}, {resident} resident, {w['requests']:,} requests, "
                f"{format_size(w['cache_bytes'])} cached, restarted {w['restarts']} times",
            )
        )
    return rows


def _location_rows(facts: dict[str, Any]) -> list[tuple[str, str]]:
    """Where a bundle at a URL lives and its store's figures (docs/storage.md): requests, bytes
    fetched, cache hits, the disk cache. Nothing for a local bundle."""
    location = facts.get("location")
    if not location:
        return []
    rows = [("location", str(location))]
    for key, value in (facts.get("storage") or {}).items():
        if key != "location":
            rows.append((f"storage {key.replace('_', ' ')}", _storage_value(key, value)))
    return rows


def _storage_value(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and ("bytes" in key or key.endswith("_size")):
        return f"{value:,} ({format_size(value)})"
    if value is None:
        return "-"
    return _daemon_value(value)


def _daemon_value(value: object) -> str:
    if isinstance(value, dict):  # request counts: the ones that happened, busiest first
        counts = sorted(((n, k) for k, n in value.items() if n), reverse=True)
        return ", ".join(f"{k} {n:,}" for n, k in counts) or "none"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value) or "-"
