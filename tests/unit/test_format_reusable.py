"""``fmt.reusable_file``: the fields of a plain file's entry value that the encoder would write
back byte for byte, and None for every value a pack on a base must decode and build anew."""

from __future__ import annotations

import dataclasses
import itertools
import struct

import pytest

from bundlefs.core import format as fmt

FILE = fmt.Entry(
    ino=5,
    mode=fmt.KIND_FILE | 0o644,
    owner=0,
    mtime_ns=1_700_000_000 * 10**9,
    size=1000,
    name=b"data.bin",
    shard=3,
    offset=123_456,
    crc32c=0xDEADBEEF,
    digest=bytes(range(16)),
)

VARIANTS = [
    dataclasses.replace(FILE, size=size, owner=owner, mtime_ns=mtime, shard=shard, offset=offset)
    for size, owner, mtime, shard, offset in itertools.product(
        (1, 300, 70_000, 2**33),
        (0, 7),
        (1_700_000_000 * 10**9, 1_700_000_000_123_456_789, -(10**9), 2**32 * 10**9),
        (0, 300),
        (0, 2**33),
    )
]


@pytest.mark.parametrize("entry", VARIANTS, ids=range(len(VARIANTS)))
def test_a_plain_files_value_gives_its_fields_and_encodes_back_to_itself(
    entry: fmt.Entry,
) -> None:
    value = fmt.encode_entry(entry)
    fields = fmt.reusable_file(value)
    assert fields == (
        entry.mode,
        entry.size,
        entry.mtime_ns,
        entry.owner,
        entry.shard,
        -1,
        entry.name,
    )
    decoded = fmt.decode_entry(entry.ino, value)
    assert fmt.encode_entry(decoded) == value


def test_a_content_type_index_is_given_and_a_file_without_a_digest_is_reusable() -> None:
    value = fmt.encode_entry(dataclasses.replace(FILE, content_type=9, digest=b""))
    assert fmt.reusable_file(value) == (FILE.mode, 1000, FILE.mtime_ns, 0, 3, 9, FILE.name)


@pytest.mark.parametrize(
    "entry",
    [
        dataclasses.replace(FILE, flags=fmt.FLAG_NLINK, nlink=2),
        dataclasses.replace(FILE, user_data=b"label"),
        dataclasses.replace(FILE, flags=fmt.FLAG_LINK, target=3, digest=b""),
        fmt.Entry(ino=2, mode=fmt.KIND_DIR | 0o755, owner=0, mtime_ns=0, size=0, name=b"d"),
        fmt.Entry(
            ino=2, mode=fmt.KIND_SYMLINK | 0o777, owner=0, mtime_ns=0, size=1, name=b"s",
            symlink=b"t",
        ),
    ],
    ids=["nlink", "user data", "LINK", "directory", "symlink"],
)  # fmt: skip
def test_anything_but_a_plain_file_with_content_is_not_reusable(entry: fmt.Entry) -> None:
    assert fmt.reusable_file(fmt.encode_entry(entry)) is None


def _widened(value: bytes, layout_bits: int, fixed: str) -> bytes:
    """``value`` (FILE's, owner 0) rewritten with ``layout_bits`` more and its fixed fields
    packed as ``fixed``: a value that decodes but that the encoder would write narrower."""
    mode, flags, layout = struct.unpack_from(">HBB", value)
    narrow = struct.Struct(">HIBII")  # FILE: size u16, mtime u32 seconds, shard u8, offset u32
    size, seconds, shard, offset, crc = narrow.unpack_from(value, 4)
    mtime = seconds * 10**9 if "q" in fixed else seconds
    fields = struct.pack(fixed, size, mtime, shard, offset, crc)
    rest = value[4 + narrow.size :]
    return struct.pack(">HBB", mode, flags, layout | layout_bits) + fields + rest


@pytest.mark.parametrize(
    ("bits", "fixed"),
    [
        (0x03, ">QIBII"),  # size u64 (would be u16)
        (0x04, ">HqBII"),  # mtime in nanoseconds (would be u32 seconds)
        (0x10, ">HIHII"),  # a wide shard (would be u8)
        (0x20, ">HIBQI"),  # a wide offset (would be u32)
    ],
    ids=["size", "mtime", "shard", "offset"],
)
def test_a_value_wider_than_the_encoder_writes_is_not_reusable(bits: int, fixed: str) -> None:
    value = fmt.encode_entry(FILE)
    widened = _widened(value, bits if bits != 0x03 else 0x02, fixed)
    decoded = fmt.decode_entry(FILE.ino, widened)
    assert dataclasses.replace(decoded, flags=0) == FILE  # the same fields (DIGEST aside)
    assert fmt.encode_entry(decoded) != widened
    assert fmt.reusable_file(widened) is None


def test_a_truncated_value_is_not_reusable() -> None:
    value = fmt.encode_entry(FILE)
    assert fmt.reusable_file(value[: -len(FILE.name)]) is None
    assert fmt.reusable_file(value[:3]) is None
