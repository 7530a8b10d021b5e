"""Archives as a source of a bundle: ``ArchiveSource`` reads tar and zip files (and a tar on stdin).

An archive is read ONCE, from start to end, and never extracted: ``load`` streams each regular
member's content into the shards in archive order (``ContentSink.store_stream``) and keeps only
a small record per member (its metadata and where its content went) in a ``SyntheticTree``; the
builder then walks that tree like any ``EntrySource``, each file item carrying its ``stored``.
Several archives (tar shards, WebDataset style) are read one after the other into one tree.

How members map (docs/archives.md has the whole story):
- names: a leading ``/`` is removed (as GNU tar does), ``.`` and empty components are dropped, a
  ``..`` component is refused (``synthetic.name_problem``); a member whose path leads through a
  symlink or a file is refused (never followed), so nothing can land outside the tree;
- implicit parent directories get mode 0755 and the owner and mtime of the first member below
  them; the root gets the metadata of a ``./`` member if the archive has one;
- a name given twice: the last member wins (as ``tar -x``), but a directory that already has
  children is never replaced by a non-directory (an error, as ``tar -x`` fails to remove it);
- hard link members become names of the file they link to (``st_nlink`` is the number of names,
  ``st_ino`` one per content), a hard link to a symlink becomes a copy of the symlink;
- FIFOs and character and block devices are stored, a device with its major and minor numbers
  (format version 4), as in a directory pack; a tar holds no sockets, a zip none of these.

Compression (``streams``): tar plain, gzip, bzip2, xz and zstd (the ``zstd`` extra). A zip needs
a seekable file (its directory is at its end), so it cannot come on stdin.

On a base (``packing.delta_sink``) each member goes to the sink with how fine its mtime is (a tar
header's whole seconds, a pax mtime's own digits, a zip's extended timestamp's seconds; a DOS time
tells versions apart not at all: ``MtimeTick``), and a zip member with a way to read it again.

May import: ``bundlefs.errors``, ``bundlefs.packing.sources`` (``base``, ``streams``,
``synthetic``).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import os
import stat as statmod
import struct
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from typing import IO

from bundlefs.errors import PackError
from bundlefs.packing.sources.base import (
    READ_CHUNK,
    SECOND_MTIME,
    ContentSink,
    MtimeTick,
    SourceErrors,
    excluded_below,
)
from bundlefs.packing.sources.streams import (
    READ_ERRORS,
    STDIN,
    ZIP_MAGICS,
    Prefixed,
    ReadFailed,
    Unclosable,
    chunks,
    compression_of,
    decompressed,
    failure_reason,
    read_exactly,
    reading,
)
from bundlefs.packing.sources.synthetic import (
    Dir,
    File,
    LoadedTreeSource,
    Special,
    Symlink,
    SyntheticStat,
    SyntheticTree,
    name_problem,
)

log = logging.getLogger(__name__)

# What ``pack`` reads besides a directory, for the sentence that refuses anything else.
ARCHIVE_FORMATS = "tar, tar.gz, tar.bz2, tar.xz, tar.zst or zip"
_ZIP_UNIX = 3  # ZipInfo.create_system of a zip made on Unix: external_attr holds st_mode
_TAR_SPECIAL_KINDS = {tarfile.FIFOTYPE: statmod.S_IFIFO, tarfile.CHRTYPE: statmod.S_IFCHR,
                      tarfile.BLKTYPE: statmod.S_IFBLK}  # fmt: skip


def is_archive_path(path: str) -> bool:
    """Whether ``path`` names an archive this module reads (``-``, or an existing regular file)."""
    return path == STDIN or os.path.isfile(path)


class ArchiveSource(LoadedTreeSource):
    """The tree held by one or more archives (``-`` is a tar on stdin), in the order given.

    ``load`` must run (once) before the builder asks for ``root``: it reads every archive and
    stores file content through the content writer. ``errors`` is where refused and skipped
    members are reported (``PackError``, or with ``skip_errors`` a warning and a skipped name).
    """

    def __init__(
        self,
        paths: Sequence[str],
        errors: SourceErrors,
        *,
        excludes: tuple[str, ...] = (),
        stdin: IO[bytes] | None = None,
    ) -> None:
        if not paths:
            raise PackError("no archive to pack")
        if list(paths).count(STDIN) > 1:
            raise PackError("stdin ('-') can be given only once")
        self.paths = list(paths)
        self.errors = errors
        self._excludes = excludes
        self._stdin = stdin
        self._tree = SyntheticTree(self._refuse)
        self._loaded = False
        self._warned_absolute = False

    # -- reading the archives ----------------------------------------------------------------------

    def load(self, content: ContentSink) -> None:
        """Read every archive once, storing file content in archive order; then number contents."""
        if self._loaded:
            return
        for path in self.paths:
            self._load_one(path, content)
        self._loaded = True
        self._tree.finish()

    def _load_one(self, path: str, content: ContentSink) -> None:
        shown = "stdin" if path == STDIN else path
        try:
            raw = self._open_raw(path)
        except OSError as e:
            raise PackError(f"cannot open the archive {shown}: {e.strerror or e}") from e
        try:
            magic = reading(read_exactly, raw, 6)
            if magic[:4] in ZIP_MAGICS:
                if path == STDIN:
                    raise PackError(
                        "a zip cannot be read from stdin (its directory is at its end); "
                        "give its path"
                    )
                raw.close()
                self._load_zip(path, content)
                return
            stream: IO[bytes] = io.BufferedReader(Prefixed(magic, raw), READ_CHUNK)
            self._load_tar(decompressed(stream, magic), content, shown, compression_of(magic))
        except ReadFailed as e:
            # Only failures of reading the archive: a shard write that fails (a full disk) is
            # an OSError of the bundle, which pack() reports as such.
            why = failure_reason(e.cause)
            raise PackError(f"cannot read the archive {shown}: {why}") from e.cause
        finally:
            raw.close()

    def _open_raw(self, path: str) -> IO[bytes]:
        if path == STDIN:
            stdin = self._stdin if self._stdin is not None else sys.stdin.buffer
            return io.BufferedReader(Unclosable(stdin), READ_CHUNK)
        if not os.path.isfile(path):
            raise PackError(f"the archive {path} is not a regular file")
        return open(path, "rb")  # noqa: SIM115 - closed by _load_one

    def _load_tar(
        self, stream: IO[bytes], content: ContentSink, shown: str, compression: str | None
    ) -> None:
        # "r|": a stream (never seeks: stdin works). surrogateescape keeps names that are not
        # UTF-8 as the bytes they were.
        try:
            tar = tarfile.open(  # noqa: SIM115 - closed by the with below
                fileobj=stream, mode="r|", encoding="utf-8", errors="surrogateescape"
            )
        except tarfile.ReadError as e:
            # No tar header at the start: say what the file is not, rather than tarfile's
            # "invalid header" (a plain file given as SRC, most often).
            if compression is None:
                raise PackError(
                    f"{shown} is neither a directory nor an archive bundlefs reads "
                    f"({ARCHIVE_FORMATS})"
                ) from None
            raise PackError(f"{shown} is {compression} data, but not of a tar archive") from e
        except READ_ERRORS as e:
            raise ReadFailed(e) from e
        with tar:
            while (member := reading(tar.next)) is not None:
                self._tar_member(tar, member, content)
                # tarfile keeps every member it read (``getmembers``): ~0.5 KB each, which this
                # reader never asks for again (hard links are the tree's).
                tar.members.clear()  # type: ignore[attr-defined]  # not in typeshed
            # Read on to the end of the stream: tarfile stops at the end-of-archive blocks, and a
            # compressed stream cut after them would otherwise pass unnoticed (its trailer and
            # checksum are only checked at its end).
            rest = tar.fileobj
            assert rest is not None
            while reading(rest.read, READ_CHUNK):
                pass

    def _tar_member(
        self, tar: tarfile.TarFile, member: tarfile.TarInfo, content: ContentSink
    ) -> None:
        raw_name = member.name.encode("utf-8", "surrogateescape")
        parts = self._parts(raw_name)
        if parts is None:
            return
        rel = b"/".join(parts)
        mode = statmod.S_IMODE(member.mode)
        mtime, tick = _tar_mtime(member)
        if member.isreg():  # first: most members are files (one SyntheticStat each, ~1 µs)
            st = SyntheticStat(statmod.S_IFREG | mode, member.uid, member.gid, mtime, member.size)
            if not self._tree.placeable(parts, st):
                return  # refused before its content is stored; tarfile skips the content
            reader = tar.extractfile(member)
            assert reader is not None  # a regular member always has a reader
            stored = content.store_stream(rel, chunks(reader), st, tick=tick)  # no again: a stream
            self._tree.place(parts, File(stored), st)
            return
        st = SyntheticStat(0, member.uid, member.gid, mtime, member.size)
        if member.isdir():
            directory = Dir(dataclasses.replace(st, st_mode=statmod.S_IFDIR | mode))
            self._tree.place(parts, directory, st)
        elif member.issym():
            target = member.linkname.encode("utf-8", "surrogateescape")
            st = dataclasses.replace(st, st_mode=statmod.S_IFLNK | mode, st_size=len(target))
            self._tree.place(parts, Symlink(st, target), st)
        elif member.islnk():
            self._tree.link(parts, member.linkname.encode("utf-8", "surrogateescape"), st)
        elif member.type in _TAR_SPECIAL_KINDS:
            device = member.ischr() or member.isblk()
            rdev = os.makedev(member.devmajor, member.devminor) if device else 0
            kind = _TAR_SPECIAL_KINDS[member.type]
            st = dataclasses.replace(st, st_mode=kind | mode, st_size=0, st_rdev=rdev)
            self._tree.place(parts, Special(st), st)
        else:
            self.errors.skip(rel, "not a regular file, directory or symlink")

    def _load_zip(self, path: str, content: ContentSink) -> None:
        with reading(zipfile.ZipFile, path) as zf:
            for info in zf.infolist():
                self._zip_member(zf, info, content)

    def _zip_member(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo, content: ContentSink) -> None:
        # zipfile decoded the name (UTF-8 if flagged, else cp437): encode it back to its bytes.
        encoding = "utf-8" if info.flag_bits & 0x800 else "cp437"
        parts = self._parts(info.filename.encode(encoding, "surrogateescape"))
        if parts is None:
            return
        rel = b"/".join(parts)
        mode = info.external_attr >> 16 if info.create_system == _ZIP_UNIX else 0
        if not statmod.S_IFMT(mode):
            # No Unix mode (a zip made elsewhere): a name ending in "/" is a directory.
            kind = statmod.S_IFDIR if info.is_dir() else statmod.S_IFREG
            mode = kind | (statmod.S_IMODE(mode) or (0o755 if info.is_dir() else 0o644))
        uid, gid = _zip_owner(info.extra)
        mtime_ns, tick = _zip_mtime(info)
        st = SyntheticStat(mode, uid, gid, mtime_ns, info.file_size)
        if statmod.S_ISDIR(mode):
            self._tree.place(parts, Dir(st), st)
        elif statmod.S_ISREG(mode):
            if not self._tree.placeable(parts, st):
                return
            again = functools.partial(_zip_chunks, zf, info)
            stored = content.store_stream(rel, again(), st, tick=tick, again=again)
            self._tree.place(parts, File(stored), st)
        elif statmod.S_ISLNK(mode):
            target = reading(zf.read, info)  # Info-ZIP stores a symlink's target as its content
            st = dataclasses.replace(st, st_size=len(target))
            self._tree.place(parts, Symlink(st, target), st)
        else:
            self.errors.skip(rel, "not a regular file, directory or symlink")

    # -- names and the tree ------------------------------------------------------------------------

    def _parts(self, raw: bytes) -> list[bytes] | None:
        """The safe components of a member name; None if refused (reported) or excluded."""
        if raw.startswith(b"/") and not self._warned_absolute:
            log.warning("removing leading '/' from member names")  # as GNU tar says it
            self._warned_absolute = True
        # As GNU tar: empty and "." components are dropped; the rest must be a bundle path.
        parts = [p for p in raw.split(b"/") if p and p != b"."]
        why = name_problem(parts)
        if why is not None:
            self._refuse(b"/".join(parts), why)
            return None
        if self._excludes and excluded_below(parts, self._excludes):
            return None
        return parts

    def _refuse(self, rel: bytes, why: str) -> None:
        """A member the bundle will not hold: ``PackError``, or with ``skip_errors`` a warning."""
        shown = os.fsdecode(rel) or "/"
        if not self.errors.skip_errors:
            raise PackError(f"refusing the archive member {shown}: {why}")
        log.warning("skipping the archive member %s: %s", shown, why)
        self.errors.skipped.append(shown)


def _tar_mtime(member: tarfile.TarInfo) -> tuple[int, MtimeTick]:
    """The member's mtime in ns and how fine it is: a header's whole seconds, or a pax mtime's
    own digits (``1700000000.123`` is to the millisecond)."""
    exact = member.pax_headers.get("mtime")
    if exact is not None:
        # A pax mtime keeps nanoseconds; tarfile's float would round them.
        whole, _, fraction = exact.partition(".")
        try:
            seconds = int(whole)
            nanos = int((fraction + "000000000")[:9]) if fraction else 0
        except ValueError:
            return int(member.mtime) * 10**9, SECOND_MTIME
        negative = whole.startswith("-")
        tick = 10 ** (9 - min(len(fraction), 9))
        return (seconds * 10**9 - nanos if negative else seconds * 10**9 + nanos), tick
    return int(member.mtime) * 10**9, SECOND_MTIME


def _zip_mtime(info: zipfile.ZipInfo) -> tuple[int, MtimeTick]:
    """The extended timestamp (extra field 0x5455, what Info-ZIP writes on Unix: whole seconds,
    UTC) if present, else the DOS date and time read as local time (what unzip does), which
    is too coarse (2 s) and too local (a time zone, a DST hour) to tell versions apart: None."""
    for tag, data in _zip_extras(info.extra):
        if tag == 0x5455 and len(data) >= 5 and data[0] & 1:
            return int(struct.unpack("<i", data[1:5])[0]) * 10**9, SECOND_MTIME
    return int(time.mktime((*info.date_time, 0, 0, -1))) * 10**9, None


def _zip_chunks(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> Iterator[bytes]:
    """A zip member's bytes, from its start (a zip is a seekable file: it can be read again)."""
    with reading(zf.open, info) as f:
        yield from chunks(f)


def _zip_owner(extra: bytes) -> tuple[int, int]:
    """uid and gid from Info-ZIP's "new Unix" extra field (0x7875); 0 and 0 without one."""
    for tag, data in _zip_extras(extra):
        if tag == 0x7875 and len(data) >= 3 and data[0] == 1:
            uid_size = data[1]
            uid = int.from_bytes(data[2 : 2 + uid_size], "little")
            gid_size = data[2 + uid_size]
            gid = int.from_bytes(data[3 + uid_size : 3 + uid_size + gid_size], "little")
            return uid, gid
    return 0, 0


def _zip_extras(extra: bytes) -> Iterator[tuple[int, bytes]]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, size = struct.unpack("<HH", extra[pos : pos + 4])
        yield tag, extra[pos + 4 : pos + 4 + size]
        pos += 4 + size
