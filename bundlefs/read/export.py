"""``export``: a bundle's tree as a deterministic tar stream, the one GNU tar would write.

It owns the tar writer: member order, header layout, long names, hard links, padding. The output
is byte-identical to ``tar --sort=name --format=gnu --numeric-owner -C TREE -cf OUT .`` (GNU tar
1.34, the default blocking factor) run on the tree the bundle holds, which this module reproduces
field by field (docs/archives.md lists what was measured):

- members ``./``, then each directory's names in bytewise order, depth first (``--sort=name``
  sorts with ``strcmp``, and a bundle's names are in that order already); a directory's name
  ends in ``/``;
- GNU headers (magic ``ustar  \\0``): mode (permission bits only), uid, gid, size and mtime in
  octal with a NUL, base-256 when a value does not fit (negative mtimes, uids over 2,097,151,
  files over 8 GiB); mtime in whole seconds (rounded down); empty user and group names (a bundle
  keeps numeric owners only); checksum ``%06o\\0 ``;
- a name or link target over 100 bytes: a ``././@LongLink`` member (``K`` for the target first,
  then ``L`` for the name), the header keeping the first 100 bytes;
- later names of a multiply-linked file: hard link members (type ``1``) naming the first name
  written; symlinks: type ``2``; FIFOs ``6``, character devices ``3`` and block devices ``4``
  with their major and minor numbers; a socket is left out (GNU tar: "socket ignored"), counted;
- two zero blocks, then zeros to a multiple of 10,240 bytes (20 blocks a record).

Content is read with ``bundle.content.iter_content`` (each file checked against its CRC32C); a
damaged file fails the export with ``CorruptDataError``.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.read``.
"""

from __future__ import annotations

import os
import stat as statmod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from bundlefs.core import format as fmt
from bundlefs.read.bundle import Bundle

BLOCK = 512
RECORD = 20 * BLOCK  # GNU tar's default blocking factor
_NAME_FIELD = 100
_GNU_MAGIC = b"ustar  \0"
_LONGLINK = b"././@LongLink"
_ZEROS = bytes(RECORD)
_SPECIAL_TYPES = {fmt.KIND_FIFO: b"6", fmt.KIND_CHAR_DEVICE: b"3", fmt.KIND_BLOCK_DEVICE: b"4"}


@dataclass
class ExportSummary:
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    hardlinks: int = 0
    specials: int = 0  # FIFOs and devices
    sockets_left_out: int = 0  # a tar cannot hold one
    bytes: int = 0  # of file content
    tar_bytes: int = 0  # of the tar stream

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def export_tar(
    bundle: Bundle,
    out: BinaryIO,
    *,
    progress: Callable[[ExportSummary], None] | None = None,
) -> ExportSummary:
    """Write the whole tree of ``bundle`` to ``out`` as a GNU tar; returns what it wrote."""
    writer = _TarWriter(bundle, out, progress)
    writer.write_tree()
    return writer.summary


def _number(value: int, width: int) -> bytes:
    """A numeric header field as GNU tar writes it: octal and NUL if it fits, else base-256."""
    digits = width - 1
    if 0 <= value < 8**digits:
        return b"%0*o\0" % (digits, value)
    if value >= 0:
        return b"\x80" + value.to_bytes(width - 1, "big")  # ValueError if even that is too small
    return value.to_bytes(width, "big", signed=True)  # two's complement: starts with 0xff


def header(
    name: bytes,
    *,
    mode: int = 0,
    uid: int = 0,
    gid: int = 0,
    size: int = 0,
    mtime: int = 0,
    kind: bytes = b"0",
    linkname: bytes = b"",
    device: tuple[int, int] | None = None,
) -> bytes:
    """One 512-byte GNU tar header (name and linkname already cut to 100 bytes by the caller)."""
    block = bytearray(BLOCK)
    block[0 : len(name[:_NAME_FIELD])] = name[:_NAME_FIELD]
    block[100:108] = _number(mode, 8)
    block[108:116] = _number(uid, 8)
    block[116:124] = _number(gid, 8)
    block[124:136] = _number(size, 12)
    block[136:148] = _number(mtime, 12)
    block[148:156] = b" " * 8
    block[156:157] = kind
    block[157 : 157 + len(linkname[:_NAME_FIELD])] = linkname[:_NAME_FIELD]
    block[257:265] = _GNU_MAGIC
    if device is not None:
        block[329:337] = _number(device[0], 8)
        block[337:345] = _number(device[1], 8)
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def _padding(size: int) -> bytes:
    return bytes(-size % BLOCK)


def long_name_members(name: bytes, linkname: bytes) -> bytes:
    """The ``././@LongLink`` members a name or link target over 100 bytes needs (K, then L)."""
    out = b""
    for value, kind in ((linkname, b"K"), (name, b"L")):
        if len(value) > _NAME_FIELD:
            data = value + b"\0"
            out += header(_LONGLINK, mode=0o644, size=len(data), kind=kind) + data
            out += _padding(len(data))
    return out


class _TarWriter:
    def __init__(
        self, bundle: Bundle, out: BinaryIO, progress: Callable[[ExportSummary], None] | None
    ) -> None:
        self.bundle = bundle
        self.tree = bundle.tree
        self.out = out
        self.progress = progress
        self.summary = ExportSummary()
        self._first_name: dict[int, bytes] = {}  # file inode -> its first member name

    def write_tree(self) -> None:
        root = self.tree.root
        self._directory(b"./", root)
        for name, entry in self._depth_first(root):
            if entry.is_dir:
                self._directory(name + b"/", entry)
            elif entry.is_symlink:
                self._member(name, entry, kind=b"2", linkname=entry.symlink)
                self.summary.symlinks += 1
            elif entry.is_special:
                self._special(name, entry)
            elif entry.nlink > 1 and entry.ino in self._first_name:
                self._member(name, entry, kind=b"1", linkname=self._first_name[entry.ino])
                self.summary.hardlinks += 1
            else:
                self._file(name, entry)
            if self.progress is not None:
                self.progress(self.summary)
        self._write(bytes(2 * BLOCK))
        self._write(_ZEROS[: -self.summary.tar_bytes % RECORD])

    def _depth_first(self, root: fmt.Entry) -> Iterator[tuple[bytes, fmt.Entry]]:
        """(member name, entry) in GNU tar's --sort=name order: each directory's children in
        name order, a subdirectory's whole tree before its next sibling. One open listing per
        level of depth, never the whole tree."""
        stack: list[tuple[bytes, Iterator[tuple[bytes, fmt.Entry]]]] = [
            (b"./", self.tree.children(root))
        ]
        while stack:
            prefix, children = stack[-1]
            item = next(children, None)
            if item is None:
                stack.pop()
                continue
            name, entry = item
            path = prefix + name
            yield path, entry
            if entry.is_dir:
                stack.append((path + b"/", self.tree.children(entry)))

    def _directory(self, name: bytes, entry: fmt.Entry) -> None:
        self._member(name, entry, kind=b"5")
        self.summary.dirs += 1

    def _special(self, name: bytes, entry: fmt.Entry) -> None:
        kind = _SPECIAL_TYPES.get(entry.kind)
        if kind is None:
            self.summary.sockets_left_out += 1
            return
        device = (
            (os.major(entry.rdev), os.minor(entry.rdev)) if entry.kind != fmt.KIND_FIFO else None
        )
        self._member(name, entry, kind=kind, device=device)
        self.summary.specials += 1

    def _file(self, name: bytes, entry: fmt.Entry) -> None:
        self._member(name, entry, kind=b"0", size=entry.size)
        path = os.fsdecode(name[2:])
        written = 0
        for piece in self.bundle.content.iter_content(entry, path):
            self._write(piece)
            written += len(piece)
        self._write(_padding(written))
        if entry.nlink > 1:
            self._first_name[entry.ino] = name
        self.summary.files += 1
        self.summary.bytes += written

    def _member(
        self,
        name: bytes,
        entry: fmt.Entry,
        *,
        kind: bytes,
        size: int = 0,
        linkname: bytes = b"",
        device: tuple[int, int] | None = None,
    ) -> None:
        uid, gid = self.tree.owner(entry)
        self._write(long_name_members(name, linkname))
        self._write(
            header(
                name,
                mode=statmod.S_IMODE(entry.mode),
                uid=uid,
                gid=gid,
                size=size,
                mtime=entry.mtime_ns // 10**9,
                kind=kind,
                linkname=linkname,
                device=device,
            )
        )

    def _write(self, data: bytes) -> None:
        if data:
            self.out.write(data)
            self.summary.tar_bytes += len(data)
