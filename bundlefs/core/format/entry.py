"""The entry every version decodes to: ``Entry``, the name rule, and the validation all entry
layouts share (docs/format.md §3.3). The layouts themselves live in ``entry_v2`` (versions 1 and
2) and ``entry_v3`` (versions 3 to 6; version 4 adds the special files of §3.3.2, version 5 the
``DIGEST`` part, which follows the name-less optional parts here in every layout that has it).

May import: the standard library, ``bundlefs.errors``, ``bundlefs.core.format.constants``,
``bundlefs.core.format.keys``.
"""

from __future__ import annotations

import stat as statmod
from dataclasses import dataclass

from bundlefs.core.format.constants import (
    _KNOWN_ENTRY_FLAGS,
    DEVICE_KINDS,
    DIGEST_SIZE,
    FIRST_SPECIAL_VERSION,
    FIRST_V5_VERSION,
    FLAG_CONTENT_TYPE,
    FLAG_DIGEST,
    FLAG_LINK,
    FLAG_NLINK,
    FLAG_USER_DATA,
    KIND_DIR,
    KIND_FILE,
    KIND_SYMLINK,
    MAX_CONTENT_TYPES,
    MAX_ENTRIES,
    MAX_NAME,
    MAX_SHARD_STREAM,
    MAX_SHARDS,
    MAX_SYMLINK_TARGET,
    MAX_USER_DATA,
    NO_CONTENT_TYPE,
    ROOT_INO,
    SPECIAL_KINDS,
)
from bundlefs.core.format.keys import _U16, _U32
from bundlefs.errors import FormatError

# A file's location: the shard index in the top 16 bits, the offset in the low 48.
_LOCATION_SHIFT = 48
_LOCATION_MASK = (1 << 48) - 1


@dataclass(slots=True)
class Entry:
    """One decoded entry. Fields that do not apply to the entry's kind are zero or empty.

    Treat it as read-only. It is not frozen because a frozen dataclass of this size costs ~6 µs
    to construct against ~1.3 µs, and every lookup, getattr and read builds one.
    """

    ino: int
    mode: int
    owner: int
    mtime_ns: int
    size: int
    name: bytes
    flags: int = 0
    shard: int = 0  # file
    offset: int = 0  # file: first byte in the shard's uncompressed stream
    crc32c: int = 0  # file
    nlink: int = 1  # file or directory
    target: int = 0  # LINK entry: the inode holding content and attributes
    parent: int = 0  # directory
    first_child: int = 0  # directory
    symlink: bytes = b""  # symlink target
    user_data: bytes = b""
    content_type: int = NO_CONTENT_TYPE  # file: index into ``types`` (version 2)
    rdev: int = 0  # character or block device: its number, as os.makedev makes it (version 4)
    digest: bytes = b""  # file: DIGEST_NAME of its content, DIGEST_SIZE bytes (version 5), or b""

    @property
    def kind(self) -> int:
        return statmod.S_IFMT(self.mode)

    @property
    def is_dir(self) -> bool:
        return statmod.S_IFMT(self.mode) == KIND_DIR

    @property
    def is_file(self) -> bool:
        return statmod.S_IFMT(self.mode) == KIND_FILE

    @property
    def is_symlink(self) -> bool:
        return statmod.S_IFMT(self.mode) == KIND_SYMLINK

    @property
    def is_special(self) -> bool:
        """A FIFO, a socket or a device (version 4): no content, nothing below it."""
        return statmod.S_IFMT(self.mode) in SPECIAL_KINDS

    @property
    def is_link(self) -> bool:
        return bool(self.flags & FLAG_LINK)

    @property
    def blocks(self) -> int:
        """``st_blocks``: 512-byte units of a file's content (nothing is allocated for others)."""
        return (self.size + 511) // 512 if self.is_file else 0

    @property
    def child_count(self) -> int:
        return self.size if self.is_dir else 0


_DOTS = (b".", b"..")


def validate_name(name: bytes) -> None:
    if not name or len(name) > MAX_NAME or b"/" in name or b"\0" in name or name in _DOTS:
        raise FormatError(f"invalid entry name {name!r}")


# --- encoding: the checks every layout makes ------------------------------------------------------


def _check_mtime(e: Entry) -> None:
    if not -(2**63) <= e.mtime_ns < 2**63:
        raise FormatError(
            f"the mtime of {e.name.decode(errors='replace')!r} is outside what a bundle stores "
            "(nanoseconds in 64 bits: the years 1678 to 2262)"
        )


def _check_location(e: Entry) -> None:
    if not 0 <= e.shard < MAX_SHARDS or not 0 <= e.offset <= _LOCATION_MASK:
        raise FormatError("file location out of range")


def _file_tail(e: Entry) -> tuple[int, bytes]:
    """The flags and bytes that follow a file's fixed fields: its nlink, its content type."""
    flags, tail = 0, b""
    if e.flags & FLAG_NLINK:
        flags |= FLAG_NLINK
        tail += _U32.pack(e.nlink)
    if e.content_type != NO_CONTENT_TYPE:
        if not 0 <= e.content_type < MAX_CONTENT_TYPES:
            raise FormatError("content type index out of range")
        flags |= FLAG_CONTENT_TYPE
        tail += _U16.pack(e.content_type)
    return flags, tail


def _digest_part(e: Entry, version: int) -> tuple[int, bytes]:
    """The ``DIGEST`` flag and part of an entry (they follow its user data, before the name)."""
    if not e.digest:
        return 0, b""
    if version < FIRST_V5_VERSION or not e.is_file or e.is_link:
        raise FormatError(
            f"{e.name.decode(errors='replace')!r}: only a regular file (not a LINK) of format "
            f"version {FIRST_V5_VERSION} or later has a digest"
        )
    if len(e.digest) != DIGEST_SIZE:
        raise FormatError(f"a digest of {len(e.digest)} bytes, not {DIGEST_SIZE}")
    return FLAG_DIGEST, e.digest


def _device_numbers(e: Entry) -> tuple[int, ...]:
    """A device's (major, minor), each stored as a u32; nothing for a FIFO or a socket, whose
    rdev must be 0."""
    if e.kind not in DEVICE_KINDS:
        if e.rdev:
            raise FormatError(f"{e.name.decode(errors='replace')!r} has a device number")
        return ()
    if not 0 <= e.rdev < 2**64:
        raise FormatError(f"the device number of {e.name.decode(errors='replace')!r} is invalid")
    rdev = e.rdev
    return (rdev >> 32) & 0xFFFFF000 | (rdev >> 8) & 0xFFF, (rdev >> 12) & 0xFFFFFF00 | rdev & 0xFF


def makedev(major: int, minor: int) -> int:
    """``st_rdev`` of a device (major, minor), each a u32, packed as Linux's dev_t is (what
    ``os.makedev`` returns there; it takes C ints, so a major past 2^31 would overflow it)."""
    return (
        (major & 0xFFFFF000) << 32
        | (major & 0xFFF) << 8
        | (minor & 0xFFFFFF00) << 12
        | minor & 0xFF
    )


# --- decoding: the checks every layout makes ------------------------------------------------------

# What follows an entry's common fields, by its kind: a file with content, a LINK entry, a
# directory, a symlink (whose target and the optional parts are not fixed-size), a FIFO or socket
# (nothing), a device (its major and minor numbers).
_PART_FILE, _PART_LINK, _PART_DIR, _PART_SYMLINK, _PART_SPECIAL, _PART_DEVICE = range(6)
_PART_NAMES = ("file", "LINK entry", "directory", "symlink", "special file", "device")


def _part(ino: int, mode: int, flags: int, version: int) -> int:
    if flags & ~_KNOWN_ENTRY_FLAGS or (flags & FLAG_DIGEST and version < FIRST_V5_VERSION):
        raise FormatError(f"entry {ino} has unknown flags 0x{flags:x}")
    kind = mode & 0o170000
    if kind == KIND_FILE:
        if flags & FLAG_LINK and flags & FLAG_DIGEST:
            raise FormatError(f"entry {ino}: a LINK entry cannot carry a digest")
        return _PART_LINK if flags & FLAG_LINK else _PART_FILE
    if kind == KIND_DIR:
        part = _PART_DIR
    elif kind == KIND_SYMLINK:
        part = _PART_SYMLINK
    elif kind in SPECIAL_KINDS and version >= FIRST_SPECIAL_VERSION:
        part = _PART_DEVICE if kind in DEVICE_KINDS else _PART_SPECIAL
    else:
        raise FormatError(f"entry {ino} has unsupported file type 0o{kind:o}")
    if flags & (FLAG_LINK | FLAG_NLINK | FLAG_DIGEST):
        raise FormatError(f"entry {ino}: {_PART_NAMES[part]} with file-only flags")
    return part


def _decode_rest(
    ino: int,
    data: bytes,
    pos: int,
    part: int,
    mode: int,
    flags: int,
    owner: int,
    mtime_ns: int,
    size: int,
    fixed: tuple[int, ...],
) -> Entry:
    """Validate the kind-specific ``fixed`` fields, then read the optional parts and the name
    (the same in every version; ``_part`` refused flags the version or kind does not have)."""
    shard = offset = crc = target = parent = first_child = 0
    nlink = 1
    symlink = user_data = digest = b""
    content_type = NO_CONTENT_TYPE
    if flags & FLAG_CONTENT_TYPE and part != _PART_FILE:
        raise FormatError(f"entry {ino}: only a regular file (not a LINK) has a content type")
    if part == _PART_FILE:
        shard, offset, crc = fixed
        if offset + size > MAX_SHARD_STREAM:
            raise FormatError(f"entry {ino}: file extends past the shard stream limit")
        if flags & FLAG_NLINK:
            (nlink,) = _U32.unpack_from(data, pos)
            pos += 4
            if nlink < 1:
                raise FormatError(f"entry {ino}: nlink 0")
        if flags & FLAG_CONTENT_TYPE:
            (content_type,) = _U16.unpack_from(data, pos)
            pos += 2
    elif part == _PART_LINK:
        if flags & FLAG_NLINK:
            raise FormatError(f"entry {ino}: a LINK entry cannot carry NLINK")
        (target,) = fixed
    elif part == _PART_DIR:
        parent, first_child, nlink = fixed
        _check_children(ino, size, first_child)
    elif part == _PART_SYMLINK:
        symlink = _symlink_target(ino, data, pos, size)
        pos += size
    elif size:
        raise FormatError(f"entry {ino}: a {_PART_NAMES[part]} of size {size}")
    if flags & FLAG_USER_DATA:
        user_data = _user_data(ino, data, pos)
        pos += 2 + len(user_data)
    if flags & FLAG_DIGEST:
        digest, pos = _digest(ino, data, pos), pos + DIGEST_SIZE
    name = data[pos:]
    if ino == ROOT_INO:
        if name or part != _PART_DIR:
            raise FormatError("the root entry must be a nameless directory")
    else:
        validate_name(name)
    rdev = makedev(*fixed) if part == _PART_DEVICE else 0
    return Entry(
        ino, mode, owner, mtime_ns, size, name, flags, shard, offset, crc, nlink, target,
        parent, first_child, symlink, user_data, content_type, rdev, digest,
    )  # fmt: skip


def _check_children(ino: int, size: int, first_child: int) -> None:
    """A directory's children are the ``size`` entries from ``first_child`` on, after it."""
    if size and first_child <= ino:
        raise FormatError(f"directory entry {ino}: children must follow their directory")
    if not size and first_child:
        raise FormatError(f"directory entry {ino}: first child without children")
    if size > MAX_ENTRIES or first_child + size - 1 > MAX_ENTRIES:
        raise FormatError(f"directory entry {ino}: child range out of bounds")


def _symlink_target(ino: int, data: bytes, pos: int, size: int) -> bytes:
    if not 1 <= size <= MAX_SYMLINK_TARGET or pos + size > len(data):
        raise FormatError(f"symlink entry {ino}: target length {size} is invalid")
    symlink = data[pos : pos + size]
    if b"\0" in symlink:
        raise FormatError(f"symlink entry {ino}: target contains NUL")
    return symlink


def _digest(ino: int, data: bytes, pos: int) -> bytes:
    """The digest at ``pos`` (version 5): DIGEST_SIZE bytes, a name after them."""
    if pos + DIGEST_SIZE > len(data):
        raise FormatError(f"entry {ino}: its digest is truncated")
    return data[pos : pos + DIGEST_SIZE]


def _user_data(ino: int, data: bytes, pos: int) -> bytes:
    """The user data at ``pos``: a u16 length, then that many bytes."""
    (length,) = _U16.unpack_from(data, pos)
    pos += 2
    if not 1 <= length <= MAX_USER_DATA or pos + length > len(data):
        raise FormatError(f"entry {ino}: user data length {length} is invalid")
    return data[pos : pos + length]
