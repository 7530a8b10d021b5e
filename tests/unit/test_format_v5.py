"""Format version 5 in code (docs/format.md §3.3 ``DIGEST``, §3.8 directory totals): the
encoders and decoders, the rules of core/integrity.py, and every value they must refuse."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from bundlefs.core import format as fmt
from bundlefs.core import integrity
from bundlefs.core.checksum import ContentDigest
from bundlefs.errors import FormatError

DIGEST = bytes(range(16))
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
    digest=DIGEST,
)
DIRECTORY = fmt.Entry(
    ino=2, mode=fmt.KIND_DIR | 0o755, owner=0, mtime_ns=0, size=3, name=b"d", parent=1,
    first_child=6, nlink=3,
)  # fmt: skip
SYMLINK = fmt.Entry(
    ino=4, mode=fmt.KIND_SYMLINK | 0o777, owner=0, mtime_ns=0, size=1, name=b"s", symlink=b"t"
)
LINK = fmt.Entry(
    ino=8, mode=FILE.mode, owner=0, mtime_ns=0, size=FILE.size, name=b"l", flags=fmt.FLAG_LINK,
    target=5,
)  # fmt: skip


def _decoded(entry: fmt.Entry) -> fmt.Entry:
    flags = entry.flags | (fmt.FLAG_DIGEST if entry.digest else 0)
    flags |= fmt.FLAG_USER_DATA if entry.user_data else 0
    flags |= fmt.FLAG_CONTENT_TYPE if entry.content_type != fmt.NO_CONTENT_TYPE else 0
    return dataclasses.replace(entry, flags=flags)


V5_FILES = {
    "digest": FILE,
    "digest-user-data": dataclasses.replace(FILE, user_data=b'{"a":1}'),
    "digest-everything": dataclasses.replace(
        FILE, flags=fmt.FLAG_NLINK, nlink=2, content_type=7, user_data=b"u" * 300
    ),
    "no-digest": dataclasses.replace(FILE, digest=b""),
}


@pytest.mark.parametrize("entry", V5_FILES.values(), ids=V5_FILES.keys())
def test_a_version_5_file_entry_round_trips_with_its_digest(entry: fmt.Entry) -> None:
    data = fmt.encode_entry(entry, 5)
    assert fmt.decode_entry(entry.ino, data, 5) == _decoded(entry)
    assert fmt.entry_name(data, 5) == entry.name


def test_the_digest_comes_after_the_user_data_right_before_the_name() -> None:
    entry = dataclasses.replace(FILE, user_data=b"ud")
    data = fmt.encode_entry(entry, 5)
    assert data.endswith(b"\x00\x02ud" + DIGEST + b"data.bin")
    assert data[2] == fmt.FLAG_USER_DATA | fmt.FLAG_DIGEST


def test_a_file_without_a_digest_has_the_same_bytes_in_versions_4_and_5() -> None:
    entry = dataclasses.replace(FILE, digest=b"")
    assert fmt.encode_entry(entry, 5) == fmt.encode_entry(entry, 4)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_a_digest_flag_in_an_older_version_is_refused(version: int) -> None:
    data = bytearray(fmt.encode_entry(dataclasses.replace(FILE, digest=b""), max(version, 2)))
    data[2] |= fmt.FLAG_DIGEST
    with pytest.raises(FormatError, match="flags"):
        fmt.decode_entry(FILE.ino, bytes(data) + DIGEST, version)


@pytest.mark.parametrize("version", [2, 3, 4])
def test_an_older_version_cannot_encode_a_digest(version: int) -> None:
    with pytest.raises(FormatError, match="digest"):
        fmt.encode_entry(FILE, version)


@pytest.mark.parametrize("length", [1, 15, 17, 32])
def test_a_digest_of_the_wrong_length_is_not_encoded(length: int) -> None:
    with pytest.raises(FormatError, match="digest"):
        fmt.encode_entry(dataclasses.replace(FILE, digest=bytes(length)), 5)


@pytest.mark.parametrize("entry", [DIRECTORY, SYMLINK, LINK], ids=["dir", "symlink", "link"])
def test_a_digest_on_anything_but_a_plain_file_is_not_encoded(entry: fmt.Entry) -> None:
    with pytest.raises(FormatError, match="digest"):
        fmt.encode_entry(dataclasses.replace(entry, digest=DIGEST), 5)


@pytest.mark.parametrize("entry", [DIRECTORY, SYMLINK, LINK], ids=["dir", "symlink", "link"])
def test_a_digest_flag_on_anything_but_a_plain_file_is_refused(entry: fmt.Entry) -> None:
    data = bytearray(fmt.encode_entry(entry, 5))
    data[2] |= fmt.FLAG_DIGEST
    name_at = len(data) - len(entry.name)
    forged = bytes(data[:name_at]) + DIGEST + entry.name
    with pytest.raises(FormatError, match="flags|digest"):
        fmt.decode_entry(entry.ino, forged, 5)


def test_a_digest_cut_short_is_refused() -> None:
    data = fmt.encode_entry(dataclasses.replace(FILE, name=b"n"), 5)
    for cut in range(len(data) - 1 - fmt.DIGEST_SIZE, len(data)):
        with pytest.raises(FormatError):
            fmt.decode_entry(FILE.ino, data[:cut], 5)


def test_unknown_entry_flags_are_still_refused_in_version_5() -> None:
    data = bytearray(fmt.encode_entry(FILE, 5))
    data[2] |= 0x20
    with pytest.raises(FormatError, match="flags"):
        fmt.decode_entry(FILE.ino, bytes(data), 5)


def test_the_content_digest_is_sha256_cut_to_16_bytes() -> None:
    digest = ContentDigest(b"hello, ")
    digest.update(b"bundle\n")
    assert digest.digest() == hashlib.sha256(b"hello, bundle\n").digest()[: fmt.DIGEST_SIZE]
    assert len(digest.digest()) == fmt.DIGEST_SIZE == 16 and fmt.DIGEST_NAME == "sha256-128"
    assert ContentDigest().digest().hex() == "e3b0c44298fc1c149afbf4c8996fb924"  # docs §3.3


# --- directory totals (§3.8) ----------------------------------------------------------------------


def test_totals_round_trip_as_four_big_endian_u64() -> None:
    totals = fmt.TreeTotals(files=3, dirs=1, bytes=2**40 + 5, entries=7)
    data = fmt.encode_totals(totals)
    assert data == (3).to_bytes(8, "big") + (1).to_bytes(8, "big") + (2**40 + 5).to_bytes(
        8, "big"
    ) + (7).to_bytes(8, "big")
    assert fmt.decode_totals(2, data) == totals
    assert fmt.totals_key(2) == fmt.entry_key(2)


@pytest.mark.parametrize("length", [0, 31, 33, 64])
def test_totals_of_the_wrong_length_are_refused(length: int) -> None:
    with pytest.raises(FormatError, match="totals of directory 9"):
        fmt.decode_totals(9, bytes(length))


@pytest.mark.parametrize("field", ["files", "dirs", "bytes", "entries"])
def test_totals_out_of_range_are_not_encoded(field: str) -> None:
    with pytest.raises(FormatError, match="out of range"):
        fmt.encode_totals(fmt.TreeTotals(**{field: 2**64}))


def test_version_5_adds_the_totals_database_and_older_versions_lack_it() -> None:
    assert fmt.DB_TOTALS in fmt.databases(5)
    assert all(fmt.DB_TOTALS not in fmt.databases(v) for v in (1, 2, 3, 4))
    assert len(fmt.databases(5)) == 8 and len(fmt.databases(4)) == 7


def test_each_kind_of_child_adds_what_the_document_says() -> None:
    assert integrity.child_totals(FILE) == fmt.TreeTotals(files=1, bytes=1000, entries=1)
    assert integrity.child_totals(LINK) == fmt.TreeTotals(entries=1)
    assert integrity.child_totals(SYMLINK) == fmt.TreeTotals(entries=1)
    below = fmt.TreeTotals(files=2, dirs=1, bytes=10, entries=4)
    assert integrity.child_totals(DIRECTORY, below) == fmt.TreeTotals(2, 2, 10, 5)


def test_totals_that_do_not_add_up_are_named() -> None:
    summed = fmt.TreeTotals(1, 0, 5, 1)
    assert integrity.directory_totals(2, summed, summed) is None
    message = integrity.directory_totals(2, fmt.TreeTotals(1, 0, 6, 1), summed)
    assert message is not None and "directory 2" in message


def test_the_roots_totals_are_the_configs_counts() -> None:
    config = fmt.Config(entry_count=10, file_count=5, dir_count=3, data_bytes=99)
    assert integrity.root_totals(config, fmt.TreeTotals(5, 2, 99, 9)) is None
    assert integrity.root_totals(config, fmt.TreeTotals(5, 3, 99, 9)) is not None
