"""Archives as a source of a bundle: ``ArchiveSource`` reads tar and zip files (and a tar on stdin).

An archive is read ONCE, from start to end, and never extracted: ``load`` streams each regular
member's content into the shards in archive order (``ContentWriter.store_stream``) and keeps only
a small record per member (its metadata and where its content went) in a tree in memory; the
builder then walks that tree like any ``EntrySource``, each file item carrying its ``stored``.
Several archives (tar shards, WebDataset style) are read one after the other into one tree.

How members map (docs/archives.md has the whole story):
- names: a leading ``/`` is removed (as GNU tar does), ``.`` and empty components are dropped, a
  ``..`` component is refused; a member whose path leads through a symlink or a file is refused
  (never followed), so nothing can land outside the tree;
- implicit parent directories get mode 0755 and the owner and mtime of the first member below
  them; the root gets the metadata of a ``./`` member if the archive has one;
- a name given twice: the last member wins (as ``tar -x``), but a directory that already has
  children is never replaced by a non-directory (an error, as ``tar -x`` fails to remove it);
- hard link members become names of the file they link to (``st_nlink`` is the number of names,
  ``st_ino`` one per content), a hard link to a symlink becomes a copy of the symlink;
- device files, FIFOs and sockets are skipped with a warning, like in a directory pack.

Compression: tar plain, gzip, bzip2 and xz through ``tarfile``; zstd through the optional
``zstandard`` package (the ``zstd`` extra). A zip needs a seekable file (its directory is at its
end), so it cannot come on stdin.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.packing.sources``,
``bundlefs.packing.content``.
"""

from __future__ import annotations

import bz2
import dataclasses
import errno
import gzip
import io
import logging
import lzma
import os
import stat as statmod
import struct
import sys
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any, TypeVar

from bundlefs.core import format as fmt
from bundlefs.errors import PackError
from bundlefs.packing.sources import (
    READ_CHUNK,
    Content,
    SourceErrors,
    SourceItem,
    StoredContent,
    excluded_below,
)

if TYPE_CHECKING:
    from bundlefs.packing.content import ContentWriter

log = logging.getLogger(__name__)

STDIN = "-"
# What ``pack`` reads besides a directory, for the sentence that refuses anything else.
ARCHIVE_FORMATS = "tar, tar.gz, tar.bz2, tar.xz, tar.zst or zip"
_DIR_MODE = statmod.S_IFDIR | 0o755  # implicit directories (and a root no member describes)
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header; an empty zip's end record
_T = TypeVar("_T")
_ZIP_UNIX = 3  # ZipInfo.create_system of a zip made on Unix: external_attr holds st_mode


@dataclasses.dataclass(frozen=True, slots=True)
class ArchiveStat:
    """A synthesized ``Stat`` of an archive member (``sources.Stat``)."""

    st_mode: int
    st_uid: int
    st_gid: int
    st_mtime_ns: int
    st_size: int = 0
    st_nlink: int = 1
    st_dev: int = 0
    st_ino: int = 0
    st_rdev: int = 0  # a device member's number


class _Dir:
    __slots__ = ("st", "children")

    def __init__(self, st: ArchiveStat) -> None:
        self.st = st
        self.children: dict[bytes, _Node] = {}


class _Symlink:
    __slots__ = ("st", "target")

    def __init__(self, st: ArchiveStat, target: bytes) -> None:
        self.st = st
        self.target = target


class _File:
    """One content: every name of a hard-linked file is this same object in its directory."""

    __slots__ = ("stored",)

    def __init__(self, stored: StoredContent) -> None:
        self.stored = stored


class _Special:
    """A FIFO or device member: its status is all there is (its mode and device number)."""

    __slots__ = ("st",)

    def __init__(self, st: ArchiveStat) -> None:
        self.st = st


_Node = _Dir | _Symlink | _File | _Special
_TAR_SPECIAL_KINDS = {tarfile.FIFOTYPE: statmod.S_IFIFO, tarfile.CHRTYPE: statmod.S_IFCHR,
                      tarfile.BLKTYPE: statmod.S_IFBLK}  # fmt: skip


def is_archive_path(path: str) -> bool:
    """Whether ``path`` names an archive this module reads (``-``, or an existing regular file)."""
    return path == STDIN or os.path.isfile(path)


class ArchiveSource:
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
        self._root: _Dir | None = None
        self._root_described = False  # a "./" member gave the root its metadata
        self._loaded = False
        self._warned_absolute = False

    # -- reading the archives ----------------------------------------------------------------------

    def load(self, content: ContentWriter) -> None:
        """Read every archive once, storing file content in archive order; then number contents."""
        if self._loaded:
            return
        for path in self.paths:
            self._load_one(path, content)
        self._loaded = True
        if self._root is None:  # an empty archive: an empty root, owned by nobody in particular
            self._root = _Dir(ArchiveStat(_DIR_MODE, 0, 0, 0))
        self._finish()

    def _load_one(self, path: str, content: ContentWriter) -> None:
        shown = "stdin" if path == STDIN else path
        try:
            raw = self._open_raw(path)
        except OSError as e:
            raise PackError(f"cannot open the archive {shown}: {e.strerror or e}") from e
        try:
            magic = _reading(_read_exactly, raw, 6)
            if magic[:4] in _ZIP_MAGICS:
                if path == STDIN:
                    raise PackError(
                        "a zip cannot be read from stdin (its directory is at its end); "
                        "give its path"
                    )
                raw.close()
                self._load_zip(path, content)
                return
            stream: IO[bytes] = io.BufferedReader(_Prefixed(magic, raw), READ_CHUNK)
            self._load_tar(_decompressed(stream, magic), content, shown, _compression(magic))
        except _ReadFailed as e:
            # Only failures of reading the archive: a shard write that fails (a full disk) is
            # an OSError of the bundle, which pack() reports as such.
            raise PackError(f"cannot read the archive {shown}: {_reason(e.cause)}") from e.cause
        finally:
            raw.close()

    def _open_raw(self, path: str) -> IO[bytes]:
        if path == STDIN:
            stdin = self._stdin if self._stdin is not None else sys.stdin.buffer
            return io.BufferedReader(_Unclosable(stdin), READ_CHUNK)
        if not os.path.isfile(path):
            raise PackError(f"the archive {path} is not a regular file")
        return open(path, "rb")  # noqa: SIM115 - closed by _load_one

    def _load_tar(
        self, stream: IO[bytes], content: ContentWriter, shown: str, compression: str | None
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
        except _READ_ERRORS as e:
            raise _ReadFailed(e) from e
        with tar:
            members = iter(tar)
            while (member := _reading(next, members, None)) is not None:
                self._tar_member(tar, member, content)
            # Read on to the end of the stream: tarfile stops at the end-of-archive blocks, and a
            # compressed stream cut after them would otherwise pass unnoticed (its trailer and
            # checksum are only checked at its end).
            rest = tar.fileobj
            assert rest is not None
            while _reading(rest.read, READ_CHUNK):
                pass

    def _tar_member(self, tar: tarfile.TarFile, member: tarfile.TarInfo, content) -> None:
        raw_name = member.name.encode("utf-8", "surrogateescape")
        parts = self._parts(raw_name)
        if parts is None:
            return
        rel = b"/".join(parts)
        mode = statmod.S_IMODE(member.mode)
        st = ArchiveStat(0, member.uid, member.gid, _tar_mtime_ns(member), member.size)
        if member.isdir():
            self._place(parts, _Dir(dataclasses.replace(st, st_mode=statmod.S_IFDIR | mode)), st)
        elif member.isreg():
            st = dataclasses.replace(st, st_mode=statmod.S_IFREG | mode)
            if not self._placeable(parts, st):
                return  # refused before its content is stored; tarfile skips the content
            reader = tar.extractfile(member)
            assert reader is not None  # a regular member always has a reader
            self._place(parts, _File(content.store_stream(rel, _chunks(reader), st)), st)
        elif member.issym():
            target = member.linkname.encode("utf-8", "surrogateescape")
            st = dataclasses.replace(st, st_mode=statmod.S_IFLNK | mode, st_size=len(target))
            self._place(parts, _Symlink(st, target), st)
        elif member.islnk():
            self._hard_link(parts, member.linkname.encode("utf-8", "surrogateescape"), st)
        elif member.type in _TAR_SPECIAL_KINDS:
            kind = _TAR_SPECIAL_KINDS[member.type]
            device = member.ischr() or member.isblk()
            rdev = os.makedev(member.devmajor, member.devminor) if device else 0
            st = dataclasses.replace(st, st_mode=kind | mode, st_size=0, st_rdev=rdev)
            self._place(parts, _Special(st), st)
        else:
            self.errors.skip(rel, "not a regular file, directory or symlink")

    def _load_zip(self, path: str, content: ContentWriter) -> None:
        with _reading(zipfile.ZipFile, path) as zf:
            for info in zf.infolist():
                self._zip_member(zf, info, content)

    def _zip_member(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo, content) -> None:
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
        st = ArchiveStat(mode, uid, gid, _zip_mtime_ns(info), info.file_size)
        if statmod.S_ISDIR(mode):
            self._place(parts, _Dir(st), st)
        elif statmod.S_ISREG(mode):
            if not self._placeable(parts, st):
                return
            with _reading(zf.open, info) as f:
                stored = content.store_stream(rel, _chunks(f), st)
            self._place(parts, _File(stored), st)
        elif statmod.S_ISLNK(mode):
            target = _reading(zf.read, info)  # Info-ZIP stores a symlink's target as its content
            st = dataclasses.replace(st, st_size=len(target))
            self._place(parts, _Symlink(st, target), st)
        else:
            self.errors.skip(rel, "not a regular file, directory or symlink")

    # -- names and the tree ------------------------------------------------------------------------

    def _parts(self, raw: bytes) -> list[bytes] | None:
        """The safe components of a member name; None if refused (reported) or excluded."""
        if raw.startswith(b"/") and not self._warned_absolute:
            log.warning("removing leading '/' from member names")  # as GNU tar says it
            self._warned_absolute = True
        parts = [p for p in raw.split(b"/") if p and p != b"."]
        rel = b"/".join(parts)
        if b".." in parts:
            self._refuse(raw, "its name contains '..'")
            return None
        for part in parts:
            if len(part) > fmt.MAX_NAME:
                self._refuse(rel, f"a name in it is longer than {fmt.MAX_NAME} bytes")
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

    def _placeable(self, parts: list[bytes], st: ArchiveStat) -> bool:
        """Whether a non-directory member can go at ``parts`` (reported if not)."""
        if not parts:
            self._refuse(b"/", "it names the root, which is a directory")
            return False
        directory = self._parent(parts, st)
        if directory is None:
            return False
        old = directory.children.get(parts[-1])
        if isinstance(old, _Dir) and old.children:
            self._refuse(b"/".join(parts), "it would replace a directory that has children")
            return False
        return True

    def _parent(self, parts: list[bytes], st: ArchiveStat) -> _Dir | None:
        """The directory to hold ``parts[-1]``, implicit directories created; None if refused."""
        directory = self._root_for(st)
        for i, part in enumerate(parts[:-1]):
            child = directory.children.get(part)
            if child is None:
                child = directory.children[part] = _Dir(
                    ArchiveStat(_DIR_MODE, st.st_uid, st.st_gid, st.st_mtime_ns)
                )
            if not isinstance(child, _Dir):
                what = "symbolic link" if isinstance(child, _Symlink) else "file"
                self._refuse(
                    b"/".join(parts),
                    f"it leads through the {what} {os.fsdecode(b'/'.join(parts[: i + 1]))}, "
                    "which is never followed",
                )
                return None
            directory = child
        return directory

    def _root_for(self, st: ArchiveStat) -> _Dir:
        if self._root is None:  # implied by the first member, like any implicit directory
            self._root = _Dir(ArchiveStat(_DIR_MODE, st.st_uid, st.st_gid, st.st_mtime_ns))
        return self._root

    def _place(self, parts: list[bytes], node: _Node, st: ArchiveStat) -> None:
        if not parts:  # "./" or "/": the root itself
            if isinstance(node, _Dir):
                root = self._root_for(st)
                root.st = node.st
                self._root_described = True
            else:
                self._refuse(b"/", "it names the root, which is a directory")
            return
        directory = self._parent(parts, st)
        if directory is None:
            return
        name = parts[-1]
        old = directory.children.get(name)
        if isinstance(old, _Dir):
            if isinstance(node, _Dir):
                old.st = node.st  # the same directory described again: the last one's metadata
                return
            if old.children:
                self._refuse(b"/".join(parts), "it would replace a directory that has children")
                return
        directory.children[name] = node  # the last member of a name wins

    def _hard_link(self, parts: list[bytes], linkname: bytes, st: ArchiveStat) -> None:
        rel = b"/".join(parts)
        target_parts = [p for p in linkname.split(b"/") if p and p != b"."]
        if b".." in target_parts:
            self._refuse(rel, "its hard link target contains '..'")
            return
        node: _Node | None = self._root
        for part in target_parts:
            node = node.children.get(part) if isinstance(node, _Dir) else None
        if isinstance(node, _File | _Symlink | _Special):
            # A hard link to a symlink or a special file becomes a copy of it (a bundle links
            # regular files only).
            self._place(parts, node, st)
        else:
            why = "is a directory" if isinstance(node, _Dir) else "is not in the archive before it"
            self._refuse(rel, f"it is a hard link to {os.fsdecode(linkname)}, which {why}")

    def _finish(self) -> None:
        """Give each content its names count and inode number (in tree order: deterministic)."""
        assert self._root is not None
        names: dict[int, int] = {}
        files: list[_File] = []
        pending = [self._root]
        while pending:
            directory = pending.pop()
            for name in sorted(directory.children):
                node = directory.children[name]
                if isinstance(node, _Dir):
                    pending.append(node)
                elif isinstance(node, _File):
                    if id(node) not in names:
                        names[id(node)] = 0
                        files.append(node)
                    names[id(node)] += 1
        for ino, node in enumerate(files, 1):
            st = dataclasses.replace(
                node.stored.st,  # type: ignore[type-var]  # always an ArchiveStat here
                st_size=node.stored.size,
                st_nlink=names[id(node)],
                st_ino=ino,
            )
            node.stored = dataclasses.replace(node.stored, st=st)

    # -- EntrySource -------------------------------------------------------------------------------

    def root(self) -> SourceItem:
        if self._root is None:
            raise PackError("the archive source was not loaded")
        return SourceItem(b"", b"", self._root.st)

    def children(self, rel: bytes) -> Iterator[SourceItem]:
        directory = self._root
        for part in rel.split(b"/") if rel else ():
            assert isinstance(directory, _Dir)
            directory = directory.children[part]  # type: ignore[assignment]
        assert isinstance(directory, _Dir)
        for name in sorted(directory.children):
            node = directory.children[name]
            child_rel = rel + b"/" + name if rel else name
            if isinstance(node, _File):
                yield SourceItem(child_rel, name, node.stored.st, stored=node.stored)
            else:
                yield SourceItem(child_rel, name, node.st)

    def readlink(self, item: SourceItem) -> bytes:
        directory = self._root
        parts = item.rel.split(b"/")
        for part in parts[:-1]:
            assert isinstance(directory, _Dir)
            directory = directory.children[part]  # type: ignore[assignment]
        assert isinstance(directory, _Dir)
        node = directory.children[parts[-1]]
        if not isinstance(node, _Symlink):
            raise OSError(errno.EINVAL, "not a symbolic link")
        return node.target

    def open(self, item: SourceItem) -> Content:
        # Every regular file item carries ``stored``: the builder never asks.
        raise OSError(errno.EINVAL, "archive content was stored while the archive was read")


# -- helpers ---------------------------------------------------------------------------------------


# What reading an archive raises when it is damaged: tarfile's and zipfile's own errors, and the
# decompressors' (gzip, bz2, lzma and zstandard say OSError, EOFError, ValueError or zlib.error);
# zipfile says RuntimeError for an encrypted member, NotImplementedError for a method it lacks.
_READ_ERRORS = (
    tarfile.TarError,
    zipfile.BadZipFile,
    EOFError,
    zlib.error,
    OSError,
    ValueError,
    RuntimeError,
    NotImplementedError,
)


class _ReadFailed(Exception):
    """Reading the archive failed (``cause``); never a failure of writing the bundle."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _reading(function: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``function(*args, **kwargs)``, a call that reads the archive: its errors are _ReadFailed."""
    try:
        return function(*args, **kwargs)
    except _READ_ERRORS as e:
        raise _ReadFailed(e) from e


def _chunks(reader: IO[bytes]) -> Iterator[bytes]:
    while chunk := _reading(reader.read, READ_CHUNK):
        yield chunk


def _read_exactly(f: IO[bytes], size: int) -> bytes:
    """Up to ``size`` bytes (fewer only at the end): a pipe may hand them over in pieces."""
    data = b""
    while len(data) < size:
        chunk = f.read(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


class _Prefixed(io.RawIOBase):
    """A stream whose first bytes were already read (to sniff the format): they come first."""

    def __init__(self, prefix: bytes, rest: IO[bytes]) -> None:
        self._prefix = prefix
        self._rest = rest

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._prefix:
            if size < 0:
                data, self._prefix = self._prefix + self._rest.read(), b""
                return data
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            return data
        return self._rest.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class _Unclosable(io.RawIOBase):
    """stdin, which the pack reads but does not close."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        return self._f.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self._f.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _decompressed(stream: IO[bytes], magic: bytes) -> IO[bytes]:
    """The tar inside ``stream``, by its magic bytes. Not tarfile's own "r|*": it never checks a
    gzip stream's length and CRC, so a truncated .tar.gz could pass for a shorter archive."""
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[return-value]
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(stream)
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(stream)
    if magic.startswith(_ZSTD_MAGIC):
        return _zstd_reader(stream)
    return stream


def _compression(magic: bytes) -> str | None:
    """The compressed format ``_decompressed`` recognises by ``magic``, or None (plain)."""
    for prefix, name in (
        (b"\x1f\x8b", "gzip"),
        (b"BZh", "bzip2"),
        (b"\xfd7zXZ\x00", "xz"),
        (_ZSTD_MAGIC, "zstd"),
    ):
        if magic.startswith(prefix):
            return name
    return None


def _zstd_reader(stream: IO[bytes]) -> IO[bytes]:
    try:
        import zstandard
    except ImportError:
        raise PackError(
            "reading a zstd archive needs the zstandard package: pip install 'bundlefs[zstd]'"
        ) from None
    return io.BufferedReader(_ZstdStream(stream, zstandard), READ_CHUNK)


class _ZstdStream(io.RawIOBase):
    """The frames of a zstd stream, decompressed one after the other (pzstd and appended streams
    are one tar). A stream that ends inside a frame is an ``EOFError``, and zstandard's
    ``ZstdError`` (damaged data) an ``OSError``, as the other decompressors say."""

    def __init__(self, stream: IO[bytes], zstandard: Any) -> None:
        self._stream = stream
        self._zstd = zstandard
        self._frame = zstandard.ZstdDecompressor().decompressobj()
        self._in_frame = False  # input given to the current frame, which has not ended
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            compressed = self._frame.unused_data if self._frame.eof else b""
            if self._frame.eof:
                self._frame = self._zstd.ZstdDecompressor().decompressobj()
                self._in_frame = False
            if not compressed:
                compressed = self._stream.read(READ_CHUNK)
                if not compressed:
                    if self._in_frame:
                        raise EOFError("the zstd stream ends inside a frame")
                    return 0
            self._in_frame = True
            try:
                self._pending = self._frame.decompress(compressed)
            except self._zstd.ZstdError as e:
                raise OSError(f"zstd: {e}") from e
        data, self._pending = self._pending[: len(buffer)], self._pending[len(buffer) :]
        buffer[: len(data)] = data
        return len(data)


def _tar_mtime_ns(member: tarfile.TarInfo) -> int:
    exact = member.pax_headers.get("mtime")
    if exact is not None:
        # A pax mtime keeps nanoseconds; tarfile's float would round them.
        whole, _, fraction = exact.partition(".")
        try:
            seconds = int(whole)
            nanos = int((fraction + "000000000")[:9]) if fraction else 0
        except ValueError:
            return int(member.mtime) * 10**9
        negative = whole.startswith("-")
        return seconds * 10**9 - nanos if negative else seconds * 10**9 + nanos
    return int(member.mtime) * 10**9


def _zip_mtime_ns(info: zipfile.ZipInfo) -> int:
    """The extended timestamp (extra field 0x5455, what Info-ZIP writes on Unix) if present, else
    the DOS date and time read as local time (what unzip does)."""
    for tag, data in _zip_extras(info.extra):
        if tag == 0x5455 and len(data) >= 5 and data[0] & 1:
            return int(struct.unpack("<i", data[1:5])[0]) * 10**9
    return int(time.mktime((*info.date_time, 0, 0, -1))) * 10**9


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


def _reason(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if isinstance(e, EOFError) or "unexpected end" in text:
        return "it is truncated"
    return text.rstrip(".")
