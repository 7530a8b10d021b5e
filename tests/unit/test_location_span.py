"""``fmt.location_span``: where a file entry's location (shard, offset) lies in its value, in
every layout, so that ``bundlefs diff`` can compare two entries without it."""

from __future__ import annotations

import dataclasses
import stat

import pytest

from bundlefs.core import format as fmt

FILE = fmt.Entry(
    ino=5,
    mode=stat.S_IFREG | 0o644,
    owner=0,
    mtime_ns=1_700_000_000 * 10**9,
    size=14,
    name=b"small.txt",
    shard=3,
    offset=4096,
    crc32c=0xB4712197,
)
# Every width the compact layout has: wide shard, wide offset, owner, nanoseconds, big size,
# optional parts after the location.
SHAPES = {
    "narrowest": {},
    "wide shard": {"shard": 300},
    "wide offset": {"offset": 2**40 + 7},
    "owner and ns mtime": {"owner": 2, "mtime_ns": -123_456_789},
    "large size": {"size": 2**33},
    "nlink, type and user data": {
        "nlink": 2,
        "flags": fmt.FLAG_NLINK,
        "content_type": 0,
        "user_data": b'{"a":1}',
    },
}


@pytest.mark.parametrize("version", [2, 4], ids=["v2", "v4"])
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_the_span_holds_the_location_and_nothing_else(version: int, shape: str) -> None:
    entry = dataclasses.replace(FILE, **SHAPES[shape])
    value = fmt.encode_entry(entry, version)
    start, end = fmt.location_span(version)(value)
    moved = dataclasses.replace(entry, offset=entry.offset + 1)
    other = fmt.encode_entry(moved, version)
    assert (value[:start], value[end:]) == (other[:start], other[end:])
    assert value[start:end] != other[start:end]


@pytest.mark.parametrize("version", [2, 4], ids=["v2", "v4"])
def test_a_changed_crc_shows_outside_the_span(version: int) -> None:
    value = fmt.encode_entry(FILE, version)
    other = fmt.encode_entry(dataclasses.replace(FILE, crc32c=1), version)
    start, end = fmt.location_span(version)(value)
    assert value[end:] != other[end:]


@pytest.mark.parametrize("version", [2, 4], ids=["v2", "v4"])
def test_entries_that_are_not_plain_files_have_no_span(version: int) -> None:
    link = dataclasses.replace(FILE, flags=fmt.FLAG_LINK, target=9, shard=0, offset=0)
    directory = fmt.Entry(
        ino=2, mode=stat.S_IFDIR | 0o755, owner=0, mtime_ns=0, size=0, name=b"d", parent=1
    )
    symlink = fmt.Entry(
        ino=3, mode=stat.S_IFLNK | 0o777, owner=0, mtime_ns=0, size=1, name=b"l", symlink=b"x"
    )
    span = fmt.location_span(version)
    for entry in (link, directory, symlink):
        assert span(fmt.encode_entry(entry, version)) is None
