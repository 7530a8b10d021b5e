"""Looking into a bundle by path: ``bundlefs ls`` and ``cat``.

``ls`` lists as GNU ls does (``-l``, ``-a``, ``-R``), a name with a control character in it quoted
in ls's shell-escape style unless ``-N`` or ``-0``, or for programs with ``--json``/``--csv``
(cli/listing.py); ``cat`` writes files to stdout, each checked
against its CRC as it streams.

May import: the library layers, ``bundlefs.cli.output``, ``bundlefs.cli.options``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import stat
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from bundlefs.cli.listing import listing_writer
from bundlefs.cli.options import BUNDLE_HELP, open_bundle
from bundlefs.cli.output import EXIT_FAILURE, EXIT_OK, error, out
from bundlefs.errors import BundleError, IsADirectory

if TYPE_CHECKING:
    from typing import BinaryIO

    from bundlefs.core.format import Entry
    from bundlefs.read.bundle import Bundle


# -- ls -------------------------------------------------------------------------------------------


def add_ls_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE_HELP)
    p.add_argument("paths", nargs="*", metavar="PATH", help="directories or files (default: /)")
    p.add_argument("-l", dest="long", action="store_true", help="long format, like ls -l")
    p.add_argument("-a", dest="all", action="store_true", help="show names starting with '.'")
    p.add_argument("-R", dest="recursive", action="store_true", help="list subdirectories too")
    names = p.add_mutually_exclusive_group()
    names.add_argument(
        "-0",
        "--zero",
        dest="zero",
        action="store_true",
        help="end each line with NUL, not newline, and print names as they are (for scripts: "
        "xargs -0)",
    )
    names.add_argument(
        "-N",
        "--literal",
        dest="literal",
        action="store_true",
        help="print names as they are, even with a newline or other control character in them "
        "(default: such a name is quoted as ls's shell-escape style does, 'a'$'\\n''b')",
    )
    names.add_argument(
        "--json",
        action="store_true",
        help="for programs: one JSON object per entry per line (JSON Lines): path, type, size, "
        "mode, mtime_ns, uid, gid, content_type, shard, offset, stored_offset, crc32c, target",
    )
    names.add_argument(
        "--csv", action="store_true", help="for programs: CSV with a header row, the --json fields"
    )


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


def _long_fields(bundle: Bundle, entry: Entry, names: _Names) -> list[str]:
    st = bundle.stat_entry(entry)
    seconds = st.st_mtime_ns // 10**9
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))
    # The content type is a column of its own after the time, as ls -Z adds the security
    # context: "-" where there is none (directories, symlinks, version-1 bundles).
    return [
        stat.filemode(st.st_mode),
        str(st.st_nlink),
        names.user(st.st_uid),
        names.group(st.st_gid),
        # A device shows its number where a file shows its size ("1, 3"), as ls -l does.
        f"{os.major(st.st_rdev)}, {os.minor(st.st_rdev)}"
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
        else str(st.st_size),
        when,
        st.content_type or "-",
    ]


# Columns of ls -l: the numbers right-aligned, the words left-aligned (as GNU ls).
_RIGHT = (False, True, False, False, True, False, False)


def _aligned(rows: list[list[str]]) -> list[bytes]:
    """The long-format heads of one listing, each column as wide as its widest cell (GNU ls
    aligns per directory, so a long content type shifts its listing's names, never one line)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(_RIGHT))]
    return [
        os.fsencode(
            " ".join(
                cell.rjust(width) if right else cell.ljust(width)
                for cell, width, right in zip(row, widths, _RIGHT, strict=True)
            )
            + " "
        )
        for row in rows
    ]


_PLAIN = re.compile(rb"[^\x00-\x1f\x7f]*")


def shell_escaped(name: bytes) -> bytes:
    """``name`` as one line: unchanged unless it holds a control character (a newline, a tab,
    an escape), then quoted as GNU ls's shell-escape style does, ``'a'$'\\n''b'``: pasted into a
    shell, it is the name again. Bytes that are not UTF-8 stay as they are."""
    if _PLAIN.fullmatch(name):
        return name
    pieces = re.split(rb"([\x00-\x1f\x7f]+)", name)
    quoted = []
    for i, piece in enumerate(pieces):
        if not piece:
            continue
        if i % 2:  # a run of control characters
            quoted.append(b"$'" + b"".join(_ESCAPES.get(c, b"\\%03o" % c) for c in piece) + b"'")
        else:
            quoted.append(b"'" + piece.replace(b"'", b"'\\''") + b"'")
    return b"".join(quoted)


_ESCAPES = {
    7: b"\\a",
    8: b"\\b",
    9: b"\\t",
    10: b"\\n",
    11: b"\\v",
    12: b"\\f",
    13: b"\\r",
    27: b"\\E",
}


# One listing: a directory's header (None for the files named as arguments, or where no headers
# are shown) and its (entry, name, path below the root) rows.
_Listing = tuple[bytes | None, list[tuple["Entry", bytes, bytes]]]


def _listings(bundle: Bundle, args: argparse.Namespace, paths: list[bytes]) -> Iterator[_Listing]:
    """What ``ls`` lists, in its order: the files named, then each directory (depth first with
    ``-R``), its names in bundle order."""
    long = args.long or args.json or args.csv
    files: list[tuple[Entry, bytes, bytes]] = []
    dirs: list[tuple[bytes, Entry]] = []
    for raw in paths:
        entry = bundle.resolve(raw, follow_symlinks=False)
        if entry.is_symlink and (not long or raw.endswith(b"/")):
            # like ls: a symlink to a directory is listed through, unless -l
            with contextlib.suppress(BundleError):
                entry = bundle.resolve(raw, follow_symlinks=True)
        if entry.is_dir:
            dirs.append((raw, entry))
        else:
            files.append((entry, raw, raw.strip(b"/")))
    yield None, files
    headers = args.recursive or len(paths) > 1
    pending = list(reversed(dirs))
    while pending:
        raw, directory = pending.pop()
        rows, subdirs = [], []
        for name, entry in bundle.tree.children(directory):
            if name.startswith(b".") and not args.all:
                continue
            path = raw.strip(b"/") + b"/" + name if raw.strip(b"/") else name
            rows.append((entry, name, path))
            if entry.is_dir:
                subdirs.append((raw.rstrip(b"/") + b"/" + name if raw else name, entry))
        yield (raw or b".") if headers else None, rows
        if args.recursive:
            pending.extend(reversed(subdirs))


def run_ls(args: argparse.Namespace) -> int:
    paths = [os.fsencode(p) for p in args.paths] or [b""]
    with open_bundle(args.bundle, args) as bundle:
        if args.json or args.csv:
            write_row = listing_writer(bundle, "json" if args.json else "csv")
            for _header, rows in _listings(bundle, args, paths):
                for entry, _name, path in rows:
                    write_row(entry, path)
            return EXIT_OK
        names = _Names()
        end = b"\0" if args.zero else b"\n"
        shown = (lambda name: name) if args.zero or args.literal else shell_escaped
        first = True
        for header, rows in _listings(bundle, args, paths):
            if header is not None:
                if not first:
                    out(end=end)
                out(shown(header) + b":", end=end)
            first = first and not rows and header is None
            heads = [b""] * len(rows)
            if args.long and rows:
                heads = _aligned([_long_fields(bundle, entry, names) for entry, _, _ in rows])
            for head, (entry, name, _path) in zip(heads, rows, strict=True):
                line = head + shown(name)
                if args.long and entry.is_symlink:
                    line += b" -> " + shown(entry.symlink)
                out(line, end=end)
    return EXIT_OK


# -- cat ------------------------------------------------------------------------------------------


def add_cat_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE_HELP)
    p.add_argument("paths", nargs="+", metavar="PATH", help="files to write to stdout, in order")
    p.add_argument(
        "--salvage",
        action="store_true",
        help="write zeros for bytes of a damaged file that cannot be read, name each lost range "
        "on stderr, and go on (exit status 1 if anything was lost)",
    )


def run_cat(args: argparse.Namespace) -> int:
    result = EXIT_OK
    stdout = sys.stdout.buffer
    with open_bundle(args.bundle, args) as bundle:
        for path in args.paths:
            try:
                entry = bundle.resolve(path)
                if entry.is_dir:
                    raise IsADirectory(f"{path!r} is a directory", path)
                if args.salvage:
                    result = _cat_salvaged(bundle, entry, path, stdout) or result
                    continue
                for piece in bundle.content.iter_content(entry, path):
                    stdout.write(piece)
            except BundleError as e:
                stdout.flush()
                error(str(e))
                result = EXIT_FAILURE
        stdout.flush()
    return result


def _cat_salvaged(bundle: Bundle, entry: Entry, path: str, stdout: BinaryIO) -> int:
    """Write a file's good bytes and zeros for each lost range, named on stderr; 1 if any."""
    from bundlefs.read.salvage import LostRange, salvage_content

    lost = 0
    for piece in salvage_content(bundle.content, entry, path):
        if isinstance(piece, LostRange):
            stdout.flush()
            error(str(piece))
            lost += 1
            for at in range(0, piece.length, 1 << 20):
                stdout.write(bytes(min(1 << 20, piece.length - at)))
        else:
            stdout.write(piece)
    return EXIT_FAILURE if lost else EXIT_OK
