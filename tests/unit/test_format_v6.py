"""Format version 6 in code (docs/format.md §3.9, the ``sources`` database): the encoder and
decoder of a source record, the databases each version has, and every value they must refuse."""

from __future__ import annotations

import struct

import pytest

from bundlefs.core import format as fmt
from bundlefs.errors import FormatError


def test_a_source_record_is_a_signed_ctime_then_an_inode_number_in_16_bytes() -> None:
    value = fmt.encode_source(-5, 2**64 - 1)
    assert value == struct.pack(">qQ", -5, 2**64 - 1) and len(value) == 16
    assert fmt.decode_source(7, value) == (-5, 2**64 - 1)


def test_a_source_record_keys_a_file_by_its_inode_number_as_entries_do() -> None:
    assert fmt.entry_key(7) == b"\x00\x00\x00\x07"  # the key IndexWriter.put_source writes


@pytest.mark.parametrize("length", [0, 8, 15, 17, 32])
def test_a_source_record_of_the_wrong_length_is_refused(length: int) -> None:
    with pytest.raises(FormatError, match="source record of inode 7 is"):
        fmt.decode_source(7, bytes(length))


@pytest.mark.parametrize("ctime_ns, st_ino", [(2**63, 1), (-(2**63) - 1, 1), (0, 2**64), (0, -1)])
def test_a_source_stat_out_of_range_is_not_encoded(ctime_ns: int, st_ino: int) -> None:
    with pytest.raises(FormatError, match="out of range"):
        fmt.encode_source(ctime_ns, st_ino)


def test_version_6_may_have_a_sources_database_and_older_versions_have_none() -> None:
    assert fmt.databases(6) == (*fmt.databases(5), fmt.DB_BASES)  # required: version 5's, bases
    assert fmt.databases(6, optional=True) == (fmt.DB_SOURCES,)
    assert all(fmt.databases(v, optional=True) == () for v in (1, 2, 3, 4, 5))
    assert fmt.DB_SOURCES in fmt.ALL_DBS  # a writer makes it (maybe empty)


def test_version_6_is_written_and_every_earlier_version_read() -> None:
    assert fmt.FORMAT_VERSION == 6 and fmt.SUPPORTED_VERSIONS == (1, 2, 3, 4, 5, 6)
