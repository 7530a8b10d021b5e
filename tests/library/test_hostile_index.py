"""Hostile bundles: forged index values behind a valid checksum never crash, hang or lie (issue 5).

Each case rewrites index values through LMDB and re-seals ``COMPLETE`` (``hostile.forge``), so the
index checksum matches and the forged values reach the decoders and the readers. Every reader —
``Bundle`` open/walk/lookup/read, ``verify``, ``extract`` — runs in a worker subprocess with a
memory and a time limit (``hostile.Prober``) and must either work or raise a ``BundleError``;
``verify`` must report every forgery that makes the bundle invalid. A few cases go through a real
mount.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundlefs import Bundle, PackOptions, pack
from bundlefs.core import format as fmt
from bundlefs.errors import FormatError
from bundlefs.read.verify import verify
from tests.conftest import SAMPLE_FILES, SAMPLE_RECORD_SIZE
from tests.support.hostile import (
    U32,
    Prober,
    config_of,
    config_put,
    entry_put,
    entry_with_size,
    find_entry,
    forge,
    optional_parts_at,
    patch,
    raw_entry_put,
    read_values,
    record_put,
    report_line,
    shard_put,
    version_of,
)

EXAMPLES = int(os.environ.get("BUNDLEFS_FUZZ_EXAMPLES", "12"))


@pytest.fixture(scope="module")
def original(sample_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("hostile") / "original"
    pack(str(sample_tree), str(dest), PackOptions(record_size=SAMPLE_RECORD_SIZE))
    return dest


@pytest.fixture(scope="module")
def prober(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    p = Prober(tmp_path_factory.mktemp("hostile-probe"))
    yield p
    p.close()
    report_line(request, "fuzz (forged index values): " + p.summary())


def by_name(bundle: Path, name: bytes) -> fmt.Entry:
    return find_entry(bundle, lambda e: e.name == name)


def entry_value(bundle: Path, entry: fmt.Entry) -> bytes:
    return read_values(bundle, fmt.DB_ENTRIES)[fmt.entry_key(entry.ino)]


def first_record(bundle: Path, path: str, *, compressed: bool | None = None) -> fmt.Record:
    with Bundle(bundle) as b:
        entry = b.resolve(path)
        record = b.content.record_at(entry.shard, entry.offset)
    if compressed is not None:
        assert (record.flags == 0) == compressed
    return record


def config_value(bundle: Path, **changes) -> bytes:
    import dataclasses

    return fmt.encode_config(dataclasses.replace(config_of(bundle), **changes))


# --- the cases ------------------------------------------------------------------------------------
# name -> (forgery, expectation). A forgery returns forge() arguments. Expectations:
#   "invalid": verify must report a problem (the default);
#   "valid": the forged bundle is a valid bundle (verify may call it intact);
# and the probe's byte strictness: "whole" by default, "none" where names move files around.

Forgery = Callable[[Path], tuple[dict, list]]


def _f(puts: dict | None = None, deletes: list = ()) -> tuple[dict, list]:
    return puts or {}, list(deletes)


def _file(who: bytes = b"hello.txt", /, **changes) -> Forgery:
    return lambda b: _f(entry_put(by_name(b, who), **changes))


def _raw(name: bytes, edit: Callable[[bytes], bytes]) -> Forgery:
    def forgery(b: Path) -> tuple[dict, list]:
        entry = by_name(b, name)
        return _f(raw_entry_put(entry.ino, edit(entry_value(b, entry))))

    return forgery


def _optional_parts(name: bytes, flags: int, parts: bytes) -> Forgery:
    """Entry ``name`` with the flags byte ``flags`` and ``parts`` inserted where its optional
    parts begin, right after its kind's fixed part (§3.3)."""

    def forgery(b: Path) -> tuple[dict, list]:
        entry = by_name(b, name)
        value = patch(entry_value(b, entry), 2, bytes([flags]))
        at = optional_parts_at(entry, version_of(b))
        return _f(raw_entry_put(entry.ino, value[:at] + parts + value[at:]))

    return forgery


def _size_field(name: bytes, size: int, width: int | None = None) -> Forgery:
    """Entry ``name`` with its size field saying ``size`` (version 3: ``width`` bytes wide)."""

    def forgery(b: Path) -> tuple[dict, list]:
        entry = by_name(b, name)
        value = entry_with_size(entry_value(b, entry), size, version_of(b), width)
        return _f(raw_entry_put(entry.ino, value))

    return forgery


def _layout(name: bytes, bits: int) -> Forgery:
    """Entry ``name`` with ``bits`` set in its layout byte (version 3, §3.3.1)."""
    return _raw(name, lambda v: patch(v, 3, bytes([v[3] | bits])))


def _shard(shard: int = 0, **changes) -> Forgery:
    """Shard ``shard``'s descriptor (the shard table, §3.5) with ``changes``."""
    return lambda b: _f(shard_put(b, shard, **changes))


def _dir(who: bytes = b"dir", /, **changes) -> Forgery:
    return _file(who, **changes)


def _link_target(target_name: bytes | None, target_ino: int | None = None) -> Forgery:
    def forgery(b: Path) -> tuple[dict, list]:
        link = by_name(b, b"hard2")
        target = target_ino if target_ino is not None else by_name(b, target_name).ino
        if target_name == b"hard2":
            target = link.ino
        return _f(entry_put(link, target=target))

    return forgery


def _symlink(target: bytes, name: bytes = b"link") -> Forgery:
    return lambda b: _f(entry_put(by_name(b, name), symlink=target, size=len(target)))


def _record(path: str = "big.bin", compressed: bool | None = None, **changes) -> Forgery:
    return lambda b: _f(record_put(first_record(b, path, compressed=compressed), **changes))


def _config(**changes) -> Forgery:
    return lambda b: _f(config_put(config_value(b, **changes)))


def _config_raw(offset: int, data: bytes) -> Forgery:
    return lambda b: _f(config_put(patch(config_value(b), offset, data)))


def _overlapping_dirs(b: Path) -> tuple[dict, list]:
    # emptydir lists dir's children too: "sub" becomes reachable from two directories.
    d, e = by_name(b, b"dir"), by_name(b, b"emptydir")
    return _f(entry_put(e, first_child=d.first_child, size=d.size, nlink=d.nlink))


def _dir_cycle_via_parent(b: Path) -> tuple[dict, list]:
    # "deeper" names "sub"'s child as its parent and sub names deeper as its parent.
    sub, deeper = by_name(b, b"sub"), by_name(b, b"deeper")
    return _f({**entry_put(sub, parent=deeper.ino), **entry_put(deeper, parent=deeper.ino)})


def _symlink_cycle(b: Path) -> tuple[dict, list]:
    a, d = by_name(b, b"link"), by_name(b, b"dirlink")
    return _f(
        {
            **entry_put(a, symlink=b"dirlink/x", size=9),
            **entry_put(d, symlink=b"link/y", size=6),
        }
    )


def _extra_record(b: Path) -> tuple[dict, list]:
    # A second record overlapping the first one's range, one byte further on.
    r = first_record(b, "big.bin")
    key = fmt.record_key(r.shard, r.offset + 1)
    return _f({(fmt.DB_RECORDS, key): fmt.encode_record(r)})


def _totals(name: bytes | None, edit: Callable[[bytes], bytes]) -> Forgery:
    """The totals of directory ``name`` (None: the root) rewritten by ``edit`` (version 5)."""

    def forgery(b: Path) -> tuple[dict, list]:
        key = fmt.totals_key(fmt.ROOT_INO if name is None else by_name(b, name).ino)
        return _f({(fmt.DB_TOTALS, key): edit(read_values(b, fmt.DB_TOTALS)[key])})

    return forgery


def _source(name: bytes, value: Callable[[bytes], bytes], key: bytes | None = None) -> Forgery:
    """The source record (version 6, §3.9) of the file ``name`` rewritten by ``value``, put under
    ``key`` instead when given (the file's own record stays)."""

    def forgery(b: Path) -> tuple[dict, list]:
        own = fmt.entry_key(by_name(b, name).ino)
        return _f({(fmt.DB_SOURCES, key or own): value(read_values(b, fmt.DB_SOURCES)[own])})

    return forgery


def _source_of(name: bytes) -> Forgery:
    """A well-formed source record given to the entry ``name``, which is not a file's own."""
    return lambda b: _f({(fmt.DB_SOURCES, fmt.entry_key(by_name(b, name).ino)): bytes(16)})


def _delete(db: bytes, key: Callable[[Path], bytes]) -> Forgery:
    return lambda b: _f(deletes=[(db, key(b))])


def _entry_past_the_count(b: Path) -> tuple[dict, list]:
    n = config_of(b).entry_count
    return _f(raw_entry_put(n + 1, entry_value(b, by_name(b, b"hello.txt"))))


def _marker_shard_count(b: Path) -> tuple[dict, list]:
    return _f(config_put(config_value(b, shard_count=3)))


def _special(kind: int, flags: int = 0, size: int = 0, numbers: bytes = bytes(8)) -> bytes:
    """A version-4 special entry named hello.txt (§3.3.2): a device carries ``numbers``."""
    fixed = struct.pack(">HBBBI", kind | 0o644, flags, 0, size, 1_700_000_000)
    return fixed + (numbers if kind in fmt.DEVICE_KINDS else b"") + b"hello.txt"


HUGE = 2**32 - 1
CASES: dict[str, tuple[Forgery, str, str]] = {
    # file location, size and checksum
    "file offset past the shard stream": (_file(offset=2**47), "invalid", "whole"),
    "file end past the 48-bit stream limit": (
        _file(offset=2**48 - 10, size=100),
        "invalid",
        "whole",
    ),
    "file in a shard that does not exist": (_file(shard=7), "invalid", "whole"),
    "file in shard 65535": (_file(shard=65535), "invalid", "whole"),
    "file size of a terabyte": (_file(size=2**40), "invalid", "whole"),
    "file size spanning the next files": (_file(b"big.bin", size=200_000), "invalid", "whole"),
    "file size zero with content": (_file(size=0), "invalid", "whole"),
    "file checksum wrong": (_file(crc32c=0), "invalid", "whole"),
    "file nlink flag with nlink 0": (
        _optional_parts(b"hello.txt", fmt.FLAG_NLINK, b"\0\0\0\0"),
        "invalid",
        "whole",
    ),
    "entry with unknown flags": (
        _raw(b"hello.txt", lambda v: patch(v, 2, b"\x80")),
        "invalid",
        "whole",
    ),
    "entry of a device file type": (
        _raw(b"hello.txt", lambda v: patch(v, 0, struct.pack(">H", stat.S_IFCHR | 0o644))),
        "invalid",
        "whole",
    ),
    "entry of file type zero": (
        _raw(b"hello.txt", lambda v: patch(v, 0, b"\x01\xa4")),
        "invalid",
        "whole",
    ),
    "entry naming an owner that does not exist": (_file(owner=999), "invalid", "whole"),
    "entry with user data longer than the value": (
        _optional_parts(b"hello.txt", fmt.FLAG_USER_DATA, b"\xff\xff"),
        "invalid",
        "whole",
    ),
    "entry truncated to 10 bytes": (_raw(b"hello.txt", lambda v: v[:10]), "invalid", "whole"),
    "entry value empty": (_raw(b"hello.txt", lambda v: b""), "invalid", "whole"),
    "mtime at the i64 extremes": (_file(mtime_ns=-(2**63)), "valid", "whole"),
    # digests and directory totals (version 5, §3.3 and §3.8)
    "file whose digest is not its content's": (_file(digest=bytes(16)), "invalid", "whole"),
    "digest flag on a directory": (
        _optional_parts(b"dir", fmt.FLAG_DIGEST, bytes(16)),
        "invalid",
        "whole",
    ),
    "directory totals one byte off": (
        _totals(b"dir", lambda v: v[:23] + bytes([v[23] ^ 1]) + v[24:]),
        "invalid",
        "whole",
    ),
    "directory totals of 31 bytes": (_totals(b"dir", lambda v: v[:31]), "invalid", "whole"),
    "root totals counting one file more": (
        _totals(None, lambda v: (int.from_bytes(v[:8], "big") + 1).to_bytes(8, "big") + v[8:]),
        "invalid",
        "whole",
    ),
    "root totals missing": (
        _delete(fmt.DB_TOTALS, lambda b: fmt.totals_key(fmt.ROOT_INO)),
        "invalid",
        "whole",
    ),
    # source records (version 6, §3.9): readers ignore them, verify checks them
    "source record of 15 bytes": (_source(b"hello.txt", lambda v: v[:15]), "invalid", "whole"),
    "source record of 17 bytes": (_source(b"hello.txt", lambda v: v + b"x"), "invalid", "whole"),
    "source record under a 3-byte key": (
        _source(b"hello.txt", lambda v: v, key=b"\0\0\x02"),
        "invalid",
        "whole",
    ),
    "source record of a directory": (_source_of(b"dir"), "invalid", "whole"),
    "source record of a symlink": (_source_of(b"link"), "invalid", "whole"),
    "source record of a hard link's later name": (_source_of(b"hard2"), "invalid", "whole"),
    "source record past the entry count": (
        lambda b: _f({(fmt.DB_SOURCES, fmt.entry_key(HUGE)): bytes(16)}),
        "invalid",
        "whole",
    ),
    "source record with another ctime and inode": (
        _source(b"hello.txt", lambda v: b"\xff" * 16),
        "valid",  # what the source said: no reader checks it against anything
        "whole",
    ),
    "source record missing": (
        _delete(fmt.DB_SOURCES, lambda b: fmt.entry_key(by_name(b, b"hello.txt").ino)),
        "valid",  # optional: another writer records none
        "whole",
    ),
    # special files (version 4, §3.3.2)
    # (Not into a FIFO: opening one blocks until a writer comes, on a mount as anywhere.)
    "file turned into a socket": (
        _raw(b"hello.txt", lambda v: _special(stat.S_IFSOCK)),
        "invalid",
        "whole",
    ),
    "FIFO with a size": (
        _raw(b"hello.txt", lambda v: _special(stat.S_IFIFO, size=3)),
        "invalid",
        "whole",
    ),
    "socket with a content type": (
        _raw(b"hello.txt", lambda v: _special(stat.S_IFSOCK, flags=fmt.FLAG_CONTENT_TYPE)),
        "invalid",
        "whole",
    ),
    "device whose numbers are cut short": (
        _raw(b"hello.txt", lambda v: _special(stat.S_IFCHR)[:12]),
        "invalid",
        "whole",
    ),
    "device with the largest numbers": (
        _raw(b"hello.txt", lambda v: _special(stat.S_IFBLK, numbers=b"\xff" * 8)),
        "invalid",  # a valid entry, but the config counts hello.txt as a file
        "whole",
    ),
    # the compact entry's layout byte (version 3)
    "entry layout with an unknown bit": (_layout(b"hello.txt", 0x40), "invalid", "whole"),
    "directory layout with a wide shard": (
        _layout(b"dir", fmt.LAYOUT_WIDE_SHARD),
        "invalid",
        "whole",
    ),
    "symlink layout with a wide offset": (
        _layout(b"link", fmt.LAYOUT_WIDE_OFFSET),
        "invalid",
        "whole",
    ),
    "hard link layout with a wide shard": (
        _layout(b"hard2", fmt.LAYOUT_WIDE_SHARD),
        "invalid",
        "whole",
    ),
    "file size written wider than it needs": (
        _size_field(b"big.bin", len(SAMPLE_FILES["big.bin"]), width=8),
        "valid",  # a reader accepts any width that holds the value
        "whole",
    ),
    # names
    "name with a slash": (_file(b"hello.txt", name=b"a/b"), "invalid", "none"),
    "name with NUL": (_file(b"hello.txt", name=b"a\0b"), "invalid", "none"),
    "empty name": (_file(b"hello.txt", name=b""), "invalid", "none"),
    "name dot": (_file(b"hello.txt", name=b"."), "invalid", "none"),
    "name dot-dot": (_dir(b"dir", name=b".."), "invalid", "none"),
    "name of 256 bytes": (_file(b"hello.txt", name=b"h" * 256), "invalid", "none"),
    "duplicate name in a directory": (_file(b"hello.txt", name=b"hard1"), "invalid", "none"),
    "names out of order": (_file(b"big.bin", name=b"zzz"), "invalid", "none"),
    "root with a name": (lambda b: _f(entry_put(by_name(b, b""), name=b"root")), "invalid", "none"),
    # directories
    "directory whose children start at itself": (
        lambda b: _f(entry_put(d := by_name(b, b"dir"), first_child=d.ino)),
        "invalid",
        "none",
    ),
    "directory whose children include the root": (_dir(first_child=1), "invalid", "none"),
    "directory with children past the entry count": (_dir(first_child=10_000), "invalid", "none"),
    "directory with 2^32-1 children": (_dir(size=HUGE), "invalid", "none"),
    "directory with a million children": (_dir(size=1_000_000), "invalid", "none"),
    "directory range ending past the last entry": (
        lambda b: _f(entry_put(d := by_name(b, b"deeper"), size=d.size + 5)),
        "invalid",
        "none",
    ),
    "two directories sharing children": (_overlapping_dirs, "invalid", "none"),
    "directory parent is a file": (
        lambda b: _f(entry_put(by_name(b, b"sub"), parent=by_name(b, b"hello.txt").ino)),
        "invalid",
        "whole",
    ),
    "directory parent zero": (_dir(parent=0), "invalid", "whole"),
    "directory parent out of range": (_dir(parent=HUGE), "invalid", "whole"),
    "directory parents forming a cycle": (_dir_cycle_via_parent, "invalid", "whole"),
    "directory nlink zero": (_dir(nlink=0), "invalid", "whole"),
    "root is a file": (
        lambda b: _f(raw_entry_put(1, entry_value(b, by_name(b, b"hello.txt"))[:-9])),
        "invalid",
        "none",
    ),
    "missing entry in the middle": (
        _delete(fmt.DB_ENTRIES, lambda b: fmt.entry_key(by_name(b, b"hello.txt").ino)),
        "invalid",
        "none",
    ),
    "entry past the entry count": (_entry_past_the_count, "invalid", "whole"),
    # hard links
    "hard link to itself": (_link_target(b"hard2"), "invalid", "whole"),
    "hard link to a directory": (_link_target(b"sub"), "invalid", "whole"),
    "hard link to a symlink": (_link_target(b"link"), "invalid", "whole"),
    "hard link to inode 0": (_link_target(None, 0), "invalid", "whole"),
    "hard link past the entry count": (_link_target(None, HUGE), "invalid", "whole"),
    # symlinks
    "symlink target of 4096 bytes": (_symlink(b"x" * 4096), "invalid", "whole"),
    "symlink target length beyond the value": (_size_field(b"link", 4000), "invalid", "whole"),
    "symlink target length zero": (_size_field(b"link", 0), "invalid", "whole"),
    "symlink target with NUL": (_symlink(b"hello\0.txt"), "invalid", "whole"),
    "absolute symlink": (_symlink(b"/etc/passwd"), "valid", "whole"),
    "symlink climbing out of the root": (_symlink(b"../../../../../etc/passwd"), "valid", "whole"),
    "symlink to itself": (_symlink(b"link"), "valid", "whole"),
    "two symlinks through each other": (_symlink_cycle, "valid", "whole"),
    # records
    "record stored past the end of the shard": (_record(stored_offset=2**40), "invalid", "whole"),
    "record stored at offset 0 (the header)": (_record(stored_offset=0), "invalid", "whole"),
    "record stored off a block boundary": (_record(stored_offset=4097), "invalid", "whole"),
    "record stored length 2^32-1": (_record("noise.bin", stored_length=HUGE), "invalid", "whole"),
    "record length past record_size": (_record(length=SAMPLE_RECORD_SIZE + 1), "invalid", "whole"),
    "record length zero": (_record(length=0), "invalid", "whole"),
    "record claiming a 2 GiB lz4 expansion": (
        _record("big.bin", compressed=True, length=2**31),
        "invalid",
        "whole",
    ),
    "record claiming more lz4 output than it holds": (
        lambda b: _f(
            record_put(r := first_record(b, "lines.txt", compressed=True), length=r.length + 1)
        ),
        "invalid",
        "whole",
    ),
    "compressed record holding garbage": (
        lambda b: _f(
            record_put(
                r := first_record(b, "big.bin", compressed=True),
                stored_offset=first_record(b, "noise.bin").stored_offset,
                crc32c=first_record(b, "noise.bin").crc32c,
                stored_length=min(r.stored_length, first_record(b, "noise.bin").stored_length),
            )
        ),
        "invalid",
        "whole",
    ),
    "stored record marked ZEROS": (
        _record("big.bin", compressed=True, flags=fmt.RECORD_ZEROS, stored_length=0, crc32c=0),
        "invalid",
        "whole",
    ),
    "raw record with a short stored length": (
        _record("noise.bin", stored_length=100),
        "invalid",
        "whole",
    ),
    "record with unknown flags": (_record(flags=0x40), "invalid", "whole"),
    # A consistent forgery of record descriptors can send a partial read to other stored bytes
    # (only whole reads are covered by the file CRC): bytes are checked, placement is trusted.
    "overlapping records": (_extra_record, "invalid", "none"),
    "missing record": (
        _delete(fmt.DB_RECORDS, lambda b: fmt.record_key(0, first_record(b, "big.bin").offset)),
        "invalid",
        "whole",
    ),
    "record of a shard that does not exist": (
        lambda b: _f({(fmt.DB_RECORDS, fmt.record_key(9, 0)): b"\0" * 21}),
        "valid",  # no reader ever looks at it
        "whole",
    ),
    # shard descriptors: the shard table
    "shard file size wrong": (
        _shard(0, file_size=1, uncompressed_size=2, record_count=3),
        "invalid",
        "whole",
    ),
    "shard stream size past 2^48": (
        _shard(0, file_size=1, uncompressed_size=2**60, record_count=3),
        "invalid",
        "whole",
    ),
    "shard descriptor of version 2's 20 bytes": (
        lambda b: _f(
            {
                (fmt.DB_SHARDS, fmt.shard_key(0)): read_values(b, fmt.DB_SHARDS)[fmt.shard_key(0)][
                    :20
                ]
            }
        ),
        "invalid",
        "whole",
    ),
    "shard table codec unknown": (_shard(0, codec=7), "invalid", "whole"),
    "shard table codec none for compressed records": (
        _shard(0, codec=fmt.COMPRESSION_NONE),
        "invalid",
        "whole",
    ),
    "shard table codec zstd for lz4 records": (
        _shard(0, codec=fmt.COMPRESSION_ZSTD),
        "invalid",
        "whole",
    ),
    "shard table naming another bundle's header": (
        _shard(0, header_id=b"\xab" * 16),
        "invalid",
        "whole",
    ),
    "shard table naming another bundle's shard 5": (
        _shard(0, header_id=b"\xab" * 16, header_index=5),
        "invalid",
        "whole",
    ),
    "shard table header version past the bundle's": (
        _shard(0, header_version=7, header_id=b"\xab" * 16),
        "invalid",
        "whole",
    ),
    "shard table own shard with version 2's header": (
        _shard(0, header_version=2),
        "invalid",
        "whole",
    ),
    "shard table own shard with another index": (_shard(0, header_index=1), "invalid", "whole"),
    "shard table version-1 shard that is not lz4": (
        _shard(0, header_version=1, codec=fmt.COMPRESSION_NONE, header_id=b"\xab" * 16),
        "invalid",
        "whole",
    ),
    "shard descriptor missing": (
        _delete(fmt.DB_SHARDS, lambda b: fmt.shard_key(0)),
        "invalid",
        "whole",
    ),
    # config and owners
    "config with the wrong magic": (_config_raw(0, b"NOTMAGIC"), "invalid", "whole"),
    "config version 7": (_config_raw(8, b"\0\x07"), "invalid", "whole"),
    "config version 1 in a version-6 bundle": (_config_raw(8, b"\0\x01"), "invalid", "whole"),
    "config version 2 in a version-6 bundle": (_config_raw(8, b"\0\x02"), "invalid", "whole"),
    "config version 3 in a version-6 bundle": (_config_raw(8, b"\0\x03"), "invalid", "whole"),
    "config version 4 in a version-6 bundle": (_config_raw(8, b"\0\x04"), "invalid", "whole"),
    "config version 5 in a version-6 bundle": (_config_raw(8, b"\0\x05"), "invalid", "whole"),
    "config with an unknown incompatible feature": (
        _config_raw(12, U32.pack(1)),
        "invalid",
        "whole",
    ),
    "config block size 3": (_config_raw(16, U32.pack(3)), "invalid", "whole"),
    "config record size 1 GiB": (_config_raw(20, U32.pack(2**30)), "invalid", "whole"),
    "config compression 7": (_config_raw(28, b"\x07"), "invalid", "whole"),
    "config entry count 0": (_config(entry_count=0), "invalid", "whole"),
    "config entry count 2^32-1": (_config(entry_count=HUGE), "invalid", "whole"),
    "config entry count one too many": (
        lambda b: _f(config_put(config_value(b, entry_count=config_of(b).entry_count + 1))),
        "invalid",
        "whole",
    ),
    "config entry count one too few": (
        lambda b: _f(config_put(config_value(b, entry_count=config_of(b).entry_count - 1))),
        "invalid",
        "none",
    ),
    "config shard count disagreeing with the marker": (_marker_shard_count, "invalid", "whole"),
    "config owner count 65536": (_config(owner_count=65536), "invalid", "whole"),
    "config file count wrong": (_config(file_count=1), "invalid", "whole"),
    "config truncated": (lambda b: _f(config_put(config_value(b)[:50])), "invalid", "whole"),
    "config missing": (_delete(fmt.DB_CONFIG, lambda b: fmt.CONFIG_KEY), "invalid", "whole"),
    "owner value of 3 bytes": (
        lambda b: _f({(fmt.DB_OWNERS, fmt.owner_key(0)): b"abc"}),
        "invalid",
        "whole",
    ),
    "owner missing": (_delete(fmt.DB_OWNERS, lambda b: fmt.owner_key(0)), "invalid", "whole"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_forged_index_value_is_refused_or_read_correctly(
    case, original, prober, sample_tree, tmp_path
):
    forgery, expectation, strictness = CASES[case]
    bundle = tmp_path / "forged"
    shutil.copytree(original, bundle)
    forge(bundle, *forgery(bundle))
    violations = prober.probe(bundle, sample_tree, strict=strictness)
    assert violations == [], "\n".join(violations)
    if expectation == "invalid":
        assert prober.last_outcomes.get("verify", "ok") != "ok" or "open" in prober.last_outcomes, (
            f"verify calls the forged bundle intact: {prober.last_outcomes}"
        )


def test_a_reseal_alone_keeps_the_bundle_intact(original, tmp_path):
    bundle = tmp_path / "resealed"
    shutil.copytree(original, bundle)
    forge(bundle)  # rewrite nothing: LMDB rewrites the file, reseal vouches for it
    assert verify(bundle).ok
    with Bundle(bundle) as b:
        assert b.read("big.bin") == SAMPLE_FILES["big.bin"]


# --- random values in random fields ---------------------------------------------------------------

_FIELDS = st.one_of(
    st.tuples(
        st.just("entry"), st.integers(1, 23), st.integers(0, 60), st.binary(min_size=1, max_size=8)
    ),
    st.tuples(
        st.just("record"), st.integers(0, 40), st.integers(0, 20), st.binary(min_size=1, max_size=8)
    ),
    st.tuples(st.just("config"), st.just(0), st.integers(0, 95), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("shard"), st.just(0), st.integers(0, 43), st.binary(min_size=1, max_size=8)),
)


@settings(
    max_examples=EXAMPLES * 4,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(edits=st.lists(_FIELDS, min_size=1, max_size=4))
def test_random_bytes_in_index_values_never_crash_hang_or_lie(
    original, prober, sample_tree, tmp_path_factory, edits
):
    bundle = tmp_path_factory.mktemp("random-forge") / "b"
    shutil.copytree(original, bundle)
    puts: dict = {}
    dbs = {"entry": fmt.DB_ENTRIES, "record": fmt.DB_RECORDS, "config": fmt.DB_CONFIG}
    dbs["shard"] = fmt.DB_SHARDS
    for kind, which, offset, data in edits:
        values = sorted(read_values(bundle, dbs[kind]).items())
        key, value = values[which % len(values)]
        value = puts.get((dbs[kind], key), value)
        puts[(dbs[kind], key)] = patch(value, offset % max(1, len(value)), data)[: len(value) + 8]
    forge(bundle, puts)
    try:
        violations = prober.probe(bundle, sample_tree, strict="none", seed=len(edits))
    finally:
        shutil.rmtree(bundle.parent, ignore_errors=True)
    assert violations == [], "\n".join(violations)


# --- the library directly: each of these was a bug ------------------------------------------------


def test_a_forged_entry_count_is_refused_at_open(original, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(original, bundle)
    forge(bundle, *_config(entry_count=HUGE)(bundle))
    with pytest.raises(FormatError, match="entr"):
        Bundle(bundle)


def test_a_directory_reachable_from_two_parents_is_refused_by_lookup(original, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(original, bundle)
    forge(bundle, *_overlapping_dirs(bundle))
    with Bundle(bundle) as b:
        assert b.read("dir/sub/deep.txt") == SAMPLE_FILES["dir/sub/deep.txt"]
        with pytest.raises(FormatError, match="parent"):
            b.resolve("emptydir/sub")


def test_dot_dot_of_a_directory_whose_parent_is_a_file_is_refused(original, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(original, bundle)
    forge(bundle, *CASES["directory parent is a file"][0](bundle))
    with Bundle(bundle) as b, pytest.raises(FormatError):
        b.tree.parent_of(b.resolve("dir/sub"))


# --- through the CLI and a real mount -------------------------------------------------------------


def _forged(original: Path, tmp_path: Path, case: str) -> Path:
    bundle = tmp_path / "forged"
    shutil.copytree(original, bundle)
    forge(bundle, *CASES[case][0](bundle))
    return bundle


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bundlefs", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_verify_of_a_forged_bundle_exits_1_without_a_traceback(original, tmp_path):
    bundle = _forged(original, tmp_path, "two directories sharing children")
    result = _cli("verify", "-q", str(bundle))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith("bundlefs: error: ")


def test_cli_cat_of_a_file_with_a_forged_location_is_one_line(original, tmp_path):
    bundle = _forged(original, tmp_path, "file in a shard that does not exist")
    result = _cli("cat", str(bundle), "hello.txt")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("bundlefs: error: ")


@pytest.mark.mount
def test_mounting_a_bundle_with_a_forged_config_fails_with_one_clear_line(original, tmp_path):
    bundle = _forged(original, tmp_path, "config with an unknown incompatible feature")
    (tmp_path / "mnt").mkdir()
    result = _cli("mount", "--foreground", str(bundle), str(tmp_path / "mnt"))
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "unknown features" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.mount
@pytest.mark.parametrize(
    "case, path, error",
    [
        ("file in a shard that does not exist", "hello.txt", errno.EIO),
        ("record claiming more lz4 output than it holds", "lines.txt", errno.EIO),
        ("hard link to a directory", "dir/hard2", errno.EIO),
        ("two directories sharing children", "emptydir/sub/deep.txt", errno.EIO),
    ],
)
def test_a_mounted_forged_bundle_answers_eio_and_keeps_serving(
    original, tmp_path, mount_bundle, case, path, error
):
    bundle = _forged(original, tmp_path, case)
    m = mount_bundle(bundle, allowed_log=[r"ERROR .*(damaged data|lookup|read|getattr|open)"])
    with pytest.raises(OSError) as raised:
        (m.mountpoint / path).read_bytes()
    assert raised.value.errno == error
    for healthy in ("dir/a.txt", "dir/sub/deeper/deepest.txt", "zeros.bin"):
        assert (m.mountpoint / healthy).read_bytes() == SAMPLE_FILES[healthy]
    assert m.process.poll() is None
    assert "Traceback" not in m.log_text()


def test_forged_cases_cover_every_kind_of_value():
    kinds = " ".join(CASES)
    words = ("file", "name", "directory", "hard link", "symlink", "record", "shard", "config")
    for word in (*words, "layout", "shard table"):
        assert word in kinds
    assert len(CASES) >= 80
