"""lz4 records decompressed into buffers of ours: a whole-file read stops at the file's end, and a
read covering whole records decompresses them straight into its reply.

The compiled step (``native.lz4_decompress``/``lz4_decompress_into``) must give exactly what
python-lz4 gives and decline what python-lz4 would report; the reader built on it (a prefix in the
record cache, replaced by the whole record when a later read needs more; covered records not
cached) must serve the same bytes as before, with and without the compiled step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import lz4.block
import pytest

from bundlefs import Bundle
from bundlefs.core import format as fmt
from bundlefs.errors import CorruptDataError, WouldBlock
from bundlefs.read.cache import RecordCache
from bundlefs.storage import codec, native
from tests.conftest import pseudo_random_bytes

RECORD = 256 * 1024
needs_lz4_step = pytest.mark.skipif(
    not native.lz4_compiled, reason=f"the compiled lz4 step is not here: {native.status}"
)

# Forty 20 KiB files over four records; ``big`` spans several records whole.
SMALL = {f"f{i:02}.txt": pseudo_random_bytes(20_000, seed=i) for i in range(40)}
BIG = pseudo_random_bytes(5 * RECORD + 12_345, seed=99)


@pytest.fixture
def bundle(pack_tree: Callable[..., Path]) -> Iterator[Bundle]:
    with Bundle(pack_tree({"a": SMALL, "z": {"big.bin": BIG}})) as b:
        yield b


def _record_of(b: Bundle, path: str) -> tuple[fmt.Entry, fmt.Record]:
    entry = b.resolve(path)
    return entry, b.content.record_at(entry.shard, entry.offset)


def _cached(b: Bundle, record: fmt.Record) -> bytes | None:
    return b.cache.get((record.shard, record.offset))


def _lz4(data: bytes) -> bytes:
    return lz4.block.compress(data, store_size=False)


def _read(b: Bundle, name: str) -> None:
    assert b.read(f"a/{name}") == SMALL[name]


@needs_lz4_step
@pytest.mark.parametrize("upto", [1, 4095, 100_000, RECORD - 1, RECORD, RECORD + 5])
def test_the_compiled_step_gives_what_python_lz4_gives(upto: int) -> None:
    data = pseudo_random_bytes(RECORD, seed=7)
    got = native.lz4_decompress(_lz4(data), RECORD, upto)
    assert got == data[: min(upto, RECORD)]
    view = bytearray(RECORD)
    assert native.lz4_decompress_into(_lz4(data), memoryview(view))
    assert view == data


@needs_lz4_step
def test_the_compiled_step_declines_a_block_of_another_length_or_a_malformed_one() -> None:
    data = pseudo_random_bytes(RECORD, seed=8)
    block = _lz4(data)
    assert native.lz4_decompress(block, RECORD + 1, RECORD + 1) is None
    assert native.lz4_decompress(block, RECORD - 1, RECORD - 1) is None
    assert native.lz4_decompress(block[:-9], RECORD, RECORD) is None
    assert native.lz4_decompress(b"\xff" * 64, RECORD, 1000) is None
    assert not native.lz4_decompress_into(block, memoryview(bytearray(RECORD - 1)))
    assert not native.lz4_decompress_into(block[:-9], memoryview(bytearray(RECORD)))


def test_a_malformed_block_is_reported_as_a_damaged_record() -> None:
    record = fmt.Record(shard=0, offset=0, stored_offset=4096, stored_length=64, length=RECORD,
                        crc32c=0, flags=0)  # fmt: skip
    with pytest.raises(CorruptDataError, match="does not decompress"):
        codec.decode_record_payload(record, b"\xff" * 64, fmt.COMPRESSION_LZ4, upto=100)


@needs_lz4_step
def test_a_whole_file_read_decompresses_its_record_only_to_the_files_end(bundle: Bundle) -> None:
    entry, record = _record_of(bundle, "a/f20.txt")  # in the second record, not at its end
    _read(bundle, "f20.txt")
    prefix = _cached(bundle, record)
    assert prefix is not None
    assert len(prefix) == entry.offset + entry.size - record.offset < record.length


def test_a_file_beyond_the_cached_prefix_gets_the_whole_record(bundle: Bundle) -> None:
    _entry, record = _record_of(bundle, "a/f20.txt")
    for name in ("f20.txt", "f05.txt", "f25.txt"):  # f25 further into f20's record, not next
        _read(bundle, name)
    whole = _cached(bundle, record)
    assert whole is not None and len(whole) == record.length
    assert all(bundle.read(f"a/{name}") == data for name, data in SMALL.items())


def test_reads_in_stream_order_decompress_each_record_once(bundle: Bundle) -> None:
    records = {_record_of(bundle, f"a/{name}")[1].offset for name in SMALL}
    for name in sorted(SMALL):
        _read(bundle, name)
    assert bundle.cache_stats().misses == len(records)


def test_a_range_read_after_a_prefix_gets_the_whole_record(bundle: Bundle) -> None:
    _read(bundle, "f20.txt")
    entry = bundle.resolve("a/f24.txt")
    assert bundle.content.read_at(entry, 100, 5000) == SMALL["f24.txt"][100:5100]


def test_records_a_read_covers_whole_are_decompressed_into_it_and_not_cached(
    bundle: Bundle,
) -> None:
    entry = bundle.resolve("z/big.bin")
    assert bundle.read("z/big.bin") == BIG
    records = [bundle.content.record_at(entry.shard, at) for at in range(entry.offset,
               entry.offset + entry.size, RECORD)]  # fmt: skip
    records = list({(r.shard, r.offset): r for r in records}.values())
    assert len(records) >= 5
    covered = [
        r for r in records
        if entry.offset <= r.offset and r.end <= entry.offset + entry.size
    ]  # fmt: skip
    assert covered and all(_cached(bundle, r) is None for r in covered)
    # Reads that cover records only in part still go through the cache, and agree.
    assert bundle.content.read_at(entry, RECORD - 100, 300) == BIG[RECORD - 100 : RECORD + 200]


def test_a_read_tried_again_after_would_block_decides_the_same(
    bundle: Bundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The mount tries a read without waiting first, then again in a thread: both attempts of a
    # read out of order must ask for the same prefix (the first must not count as "read").
    asked: list[tuple[bool, int | None]] = []
    load = bundle.content._shards.load

    def would_block_once(record, *, nowait=False, upto=None):
        asked.append((nowait, upto))
        if nowait:
            raise WouldBlock
        return load(record, nowait=nowait, upto=upto)

    monkeypatch.setattr(bundle.content._shards, "load", would_block_once)
    entry = bundle.resolve("a/f20.txt")
    with pytest.raises(WouldBlock):
        bundle.content.read_at(entry, 0, entry.size, nowait=True)
    assert bundle.content.read_at(entry, 0, entry.size) == SMALL["f20.txt"]
    (_, first), (_, again) = asked
    assert first == again is not None and again < RECORD


def test_records_decompressed_into_a_reply_are_counted(bundle: Bundle) -> None:
    assert bundle.read("z/big.bin") == BIG
    assert bundle.cache_stats().bytes_loaded >= len(BIG) - 2 * RECORD


def test_without_the_compiled_step_the_same_bytes_and_whole_records(
    bundle: Bundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native, "lz4_compiled", False)
    _entry, record = _record_of(bundle, "a/f20.txt")
    _read(bundle, "f20.txt")
    whole = _cached(bundle, record)
    assert whole is not None and len(whole) == record.length
    assert bundle.read("z/big.bin") == BIG


def test_a_cached_value_shorter_than_asked_for_is_a_miss() -> None:
    cache = RecordCache(1 << 20)
    cache.put("k", b"abc")
    assert cache.get("k", 4) is None
    assert cache.get("k", 3) == b"abc"
    assert (cache.hits, cache.misses) == (1, 1)


def test_a_prefix_never_replaces_a_whole_record_in_the_cache() -> None:
    # Two threads loaded one record, one only a prefix: whichever is put last, the whole stays.
    cache = RecordCache(1 << 20)
    cache.put("r", b"whole record")
    cache.put("r", b"whole")
    assert cache.get("r") == b"whole record" and cache.size == len(b"whole record")
