"""What format version 2 added, forged: content types, bundle metadata and zstd records.

Each case writes hostile values into a real bundle (LMDB rewrites the index, the marker vouches for
it again) and checks the rule every reader keeps: the bundle is refused at open or the read fails
with ``CorruptDataError``, ``verify`` reports it, the CLI says one sentence — never wrong bytes,
never a traceback, never an allocation the record's length does not bound.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from bundlefs import Bundle, FormatError
from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.read.verify import verify
from tests.support.hostile import entry_put, find_entry, forge
from tests.support.trees import run_cli

TEXT = b" ".join(b"alpha beta gamma delta %d" % i for i in range(4000))  # ~100 kB, compressible


@pytest.fixture(scope="module")
def zstd_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bundlefs import PackOptions, pack
    from tests.conftest import build_tree

    base = tmp_path_factory.mktemp("v2hostile")
    src = build_tree(base / "src", {"t.txt": TEXT, "a.png": b"\x89PNG\r\n\x1a\n" + bytes(100)})
    dest = base / "z.bundle"
    pack(str(src), str(dest), PackOptions(compression="zstd", record_size=16384, created_ns=0,
                                          meta=(("k", "v"),)))  # fmt: skip
    return dest


@pytest.fixture
def victim(zstd_bundle: Path, copy_bundle) -> Path:
    return copy_bundle(zstd_bundle)


def _refused_everywhere(bundle: Path) -> None:
    with pytest.raises(FormatError):
        Bundle(bundle)
    assert not verify(bundle).ok
    for command in ("info", "verify"):
        result = run_cli(command, bundle)
        assert result.returncode != 0 and b"Traceback" not in result.stderr, result.stderr


# --- content types and metadata: refused at open ----------------------------------------------


def test_a_types_key_beyond_the_configs_count_is_refused(victim: Path) -> None:
    forge(victim, {(fmt.DB_TYPES, fmt.content_type_key(7)): b"text/x-extra"})
    _refused_everywhere(victim)


@pytest.mark.parametrize("value", [b"t\xe9xt/plain", b"noslash", b"ab/", b"x" * 200 + b"/y"])
def test_a_types_value_that_is_not_a_media_type_is_refused(victim: Path, value: bytes) -> None:
    forge(victim, {(fmt.DB_TYPES, fmt.content_type_key(0)): value})
    _refused_everywhere(victim)


def test_a_file_naming_a_content_type_past_the_table_is_refused(victim: Path) -> None:
    entry = find_entry(victim, lambda e: e.content_type != fmt.NO_CONTENT_TYPE)
    forge(victim, entry_put(entry, content_type=500))
    with Bundle(victim) as b, pytest.raises(FormatError, match="content type 500"):
        b.stat(entry.name.decode())
    assert not verify(victim).ok


@pytest.mark.parametrize(
    "key, value",
    [(b"k", b"\xff\xfe"), (b"\xff", b"v"), (b"k\x00", b"v"), (b"k", b"v" * 65537)],
    ids=["value-not-utf8", "key-not-utf8", "nul-in-key", "value-too-long"],
)
def test_bad_bundle_metadata_is_refused_at_open(victim: Path, key: bytes, value: bytes) -> None:
    forge(victim, {(fmt.DB_META, key): value})
    _refused_everywhere(victim)


def test_more_metadata_items_than_the_format_allows_are_refused(victim: Path) -> None:
    items = {(fmt.DB_META, b"k%04d" % i): b"v" for i in range(fmt.MAX_META_KEYS + 1)}
    forge(victim, items)
    _refused_everywhere(victim)


# --- zstd records: a read fails, bounded ------------------------------------------------------


def _first_zstd_record(bundle: Path) -> fmt.Record:
    with Bundle(bundle) as b:
        return next(r for r in b.content.records(0) if r.flags == 0)


def _replace_record(bundle: Path, record: fmt.Record, stored: bytes) -> None:
    """Put ``stored`` in the record's padded slot, and the index entry that vouches for it."""
    with Bundle(bundle) as b:
        slot = fmt.pad_to(record.stored_length, b.config.block_size)
    assert len(stored) <= slot
    with open(bundle / fmt.shard_filename(record.shard), "r+b") as f:
        f.seek(record.stored_offset)
        f.write(stored + bytes(slot - len(stored)))
    forged = fmt.Record(record.shard, record.offset, record.stored_offset, len(stored),
                        record.length, crc32c(stored), 0)  # fmt: skip
    key = fmt.record_key(record.shard, record.offset)
    forge(bundle, {(fmt.DB_RECORDS, key): fmt.encode_record(forged)})


def _rle_frame(declared: int) -> bytes:
    """A 17-byte zstd frame claiming ``declared`` bytes: one RLE block of 'A'."""
    frame = bytearray(b"\x28\xb5\x2f\xfd\xe0") + declared.to_bytes(8, "little")
    return bytes(frame + ((128 * 1024) << 3 | 0b011).to_bytes(3, "little") + b"A")


def _original(record: fmt.Record) -> bytes:
    return TEXT[record.offset : record.offset + record.length]


@pytest.mark.parametrize(
    "make",
    [
        lambda r: _rle_frame(2**40),
        lambda r: zstandard.ZstdCompressor(write_content_size=False).compress(_original(r)),
        lambda r: zstandard.ZstdCompressor().compress(_original(r)) + b"GARBAGE",
        lambda r: zstandard.ZstdCompressor().compress(_original(r)[:-1]),
        lambda r: zstandard.ZstdCompressor().compress(_original(r) + b"x" * 1000),
    ],
    ids=["claims-1-TiB", "no-content-size", "trailing-bytes", "one-byte-short", "longer"],
)
def test_a_forged_zstd_record_fails_the_read_without_unbounded_memory(victim: Path, make) -> None:
    record = _first_zstd_record(victim)
    _replace_record(victim, record, make(record))
    # In a child whose address space is capped at 1 GiB: a reader that trusted the frame's
    # declared size would die of MemoryError there instead of raising CorruptDataError.
    script = f"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from bundlefs import Bundle, CorruptDataError
with Bundle({str(victim)!r}) as b:
    try:
        b.read("t.txt")
    except CorruptDataError as e:
        print("refused:", e)
        sys.exit(0)
sys.exit("read returned bytes")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert not verify(victim).ok
    cat = run_cli("cat", victim, "t.txt")
    assert cat.returncode != 0 and b"Traceback" not in cat.stderr


def test_the_unforged_zstd_bundle_reads_back(zstd_bundle: Path) -> None:
    # The control: everything above fails because of the forgery alone.
    with Bundle(zstd_bundle) as b:
        assert b.read("t.txt") == TEXT
        assert b.info().meta == {"k": "v"}
    assert verify(zstd_bundle).ok
