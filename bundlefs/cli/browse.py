"""Looking into a bundle: ``bundlefs info``, ``ls`` and ``cat``.

``info`` also takes a bundlefs mount point: it reads the mount table and the daemon's statistics
xattr (``bundlefs.mount.table``), never a FUSE binding.

May import: the library layers, ``bundlefs.mount.table``, ``bundlefs.cli.output``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
import time
from typing import TYPE_CHECKING

from bundlefs.cli.output import EXIT_FAILURE, EXIT_OK, error, out, out_json
from bundlefs.core.units import format_size
from bundlefs.errors import BundleError, IsADirectory

if TYPE_CHECKING:
    from bundlefs.core.format import Entry
    from bundlefs.read.bundle import Bundle


def _open_bundle(path: str) -> Bundle:
    from bundlefs.read.bundle import Bundle

    return Bundle(path)


# -- info -----------------------------------------------------------------------------------------


def add_info_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", help="a bundle, or a bundlefs mount point (adds daemon statistics)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_info(args: argparse.Namespace) -> int:
    from bundlefs.mount.table import daemon_stats, mounted_bundle

    daemon = None
    path = args.bundle
    served = mounted_bundle(path)
    if served is not None:
        daemon = daemon_stats(path)
        path = served
    with _open_bundle(path) as bundle:
        info = bundle.info()
    facts = info.to_dict()
    if daemon is not None:
        facts["daemon"] = daemon
    if args.json:
        out_json(facts)
        return EXIT_OK
    c = info.config
    rows = [
        ("bundle", info.path),
        ("bundle id", facts["bundle_id"]),
        ("format", f"version {facts['format_version']}"),
        ("files", f"{c.file_count:,}"),
        ("directories", f"{c.dir_count:,}"),
        ("symlinks", f"{c.symlink_count:,}"),
        ("hard links", f"{c.hardlink_count:,}"),
        ("bytes", f"{c.data_bytes:,} ({format_size(c.data_bytes)})"),
        ("stored bytes", f"{info.shard_bytes:,} ({format_size(info.shard_bytes)})"),
        ("ratio", f"{facts['ratio']:.2f}"),
        ("shards", f"{c.shard_count:,}"),
        ("index size", f"{info.index_bytes:,} ({format_size(info.index_bytes)})"),
        ("record size", format_size(c.record_size)),
        ("block size", format_size(c.block_size)),
        ("compression", c.compression_name),
    ]
    if c.created_ns:
        created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(c.created_ns // 10**9))
        rows.append(("created", created))
    if daemon is not None:
        for key, value in sorted(daemon.items()):
            rows.append((f"daemon {key.replace('_', ' ')}", _daemon_value(value)))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        out(f"{key:<{width}}  {value}")
    return EXIT_OK


def _daemon_value(value: object) -> str:
    if isinstance(value, dict):  # request counts: the ones that happened, busiest first
        counts = sorted(((n, k) for k, n in value.items() if n), reverse=True)
        return ", ".join(f"{k} {n:,}" for n, k in counts) or "none"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value) or "-"


# -- ls -------------------------------------------------------------------------------------------


def add_ls_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle")
    p.add_argument("paths", nargs="*", metavar="PATH", help="directories or files (default: /)")
    p.add_argument("-l", dest="long", action="store_true", help="long format, like ls -l")
    p.add_argument("-a", dest="all", action="store_true", help="show names starting with '.'")
    p.add_argument("-R", dest="recursive", action="store_true", help="list subdirectories too")


class _Names:
    """uid/gid → user/group names, looked up once each (numbers when the system has no name)."""

    def __init__(self) -> None:
        self._users: dict[int, str] = {}
        self._groups: dict[int, str] = {}

    def user(self, uid: int) -> str:
        if uid not in self._users:
            import pwd

            try:
                self._users[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                self._users[uid] = str(uid)
        return self._users[uid]

    def group(self, gid: int) -> str:
        if gid not in self._groups:
            import grp

            try:
                self._groups[gid] = grp.getgrgid(gid).gr_name
            except KeyError:
                self._groups[gid] = str(gid)
        return self._groups[gid]


def _long_line(bundle: Bundle, entry: Entry, name: bytes, names: _Names) -> bytes:
    st = bundle.stat_entry(entry)
    seconds = st.st_mtime_ns // 10**9
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))
    head = (
        f"{stat.filemode(st.st_mode)} {st.st_nlink:>3} {names.user(st.st_uid):<8} "
        f"{names.group(st.st_gid):<8} {st.st_size:>12} {when} "
    )
    line = os.fsencode(head) + name
    if entry.is_symlink:
        line += b" -> " + entry.symlink
    return line


def run_ls(args: argparse.Namespace) -> int:
    names = _Names()
    paths = [os.fsencode(p) for p in args.paths] or [b""]
    with _open_bundle(args.bundle) as bundle:

        def show(entry: Entry, name: bytes) -> None:
            out(_long_line(bundle, entry, name, names) if args.long else name)

        files: list[tuple[bytes, Entry]] = []
        dirs: list[tuple[bytes, Entry]] = []
        for raw in paths:
            entry = bundle.resolve(raw, follow_symlinks=False)
            if entry.is_symlink and (not args.long or raw.endswith(b"/")):
                # like ls: a symlink to a directory is listed through, unless -l
                with contextlib.suppress(BundleError):
                    entry = bundle.resolve(raw, follow_symlinks=True)
            (dirs if entry.is_dir else files).append((raw, entry))
        for raw, entry in files:
            show(entry, raw)
        headers = args.recursive or len(paths) > 1
        first = not files
        pending = list(reversed(dirs))
        while pending:
            raw, directory = pending.pop()
            if headers:
                if not first:
                    out()
                out((raw or b".") + b":")
            first = False
            subdirs = []
            for name, entry in bundle.tree.children(directory):
                if name.startswith(b".") and not args.all:
                    continue
                show(entry, name)
                if entry.is_dir:
                    subdirs.append((raw.rstrip(b"/") + b"/" + name if raw else name, entry))
            if args.recursive:
                pending.extend(reversed(subdirs))
    return EXIT_OK


# -- cat ------------------------------------------------------------------------------------------


def add_cat_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle")
    p.add_argument("paths", nargs="+", metavar="PATH", help="files to write to stdout, in order")


def run_cat(args: argparse.Namespace) -> int:
    result = EXIT_OK
    stdout = sys.stdout.buffer
    with _open_bundle(args.bundle) as bundle:
        for path in args.paths:
            try:
                entry = bundle.resolve(path)
                if entry.is_dir:
                    raise IsADirectory(f"{path!r} is a directory")
                for piece in bundle.content.iter_content(entry, path):
                    stdout.write(piece)
            except BundleError as e:
                stdout.flush()
                error(str(e))
                result = EXIT_FAILURE
        stdout.flush()
    return result
