"""The read path reads shard bytes through ``ShardStore`` alone: a second store is a second
implementation of that small interface, not a fork of the read path (issue 10; object storage
is the next store)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from bundlefs import Bundle, CorruptDataError
from bundlefs.core import format as fmt
from bundlefs.errors import ShardUnavailable, WouldBlock
from bundlefs.read.cache import RecordCache
from bundlefs.read.content import ContentReader
from bundlefs.storage.index import IndexReader
from bundlefs.storage.shards import ShardSet


class MemoryShardStore:
    """Shard files held as bytes: the whole ShardStore interface, and nothing of the disk."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.reads = 0

    def read(self, name: str, offset: int, length: int, *, nowait: bool = False) -> bytes:
        self.reads += 1
        try:
            return self.files[name][offset : offset + length]
        except KeyError:
            raise ShardUnavailable(errno.ENOENT, "no such shard in memory", name) from None

    def read_into(
        self, name: str, offset: int, buffer: bytearray | memoryview, *, nowait: bool = False
    ) -> int:
        data = self.read(name, offset, len(buffer))
        memoryview(buffer)[: len(data)] = data
        return len(data)

    def prefetch(self, name: str, offset: int, length: int) -> None:
        pass

    def close(self) -> None:
        self.files = {}


@pytest.fixture
def memory_reader(sample_bundle_path: Path):
    """A content reader of the sample bundle whose shard bytes come from memory."""
    index = IndexReader(str(sample_bundle_path))
    names = [fmt.shard_filename(i) for i in range(index.config.shard_count)]
    store = MemoryShardStore({n: (sample_bundle_path / n).read_bytes() for n in names})
    shards = ShardSet(store, index.marker, index.shard_info)
    reader = ContentReader(
        index, shards, RecordCache(1 << 20), bundle_path="memory", path_of=lambda ino: f"#{ino}"
    )
    try:
        yield reader, store
    finally:
        shards.close()
        index.close()


def test_every_file_reads_the_same_through_a_memory_store(memory_reader, sample_bundle_path):
    reader, store = memory_reader
    with Bundle(sample_bundle_path) as bundle:
        files = [(path, entry) for path, entry in bundle.tree if entry.is_file]
        assert files
        for path, entry in files:
            assert bytes(reader.read_at(entry, 0, entry.size, path=path)) == bundle.read(path)
            middle = entry.size // 3
            part = bytes(reader.read_at(entry, middle, 5000, path=path))
            assert part == bundle.read(path)[middle : middle + 5000]
    assert store.reads > 0


def test_a_shard_the_store_cannot_open_is_damage_to_the_files_in_it(
    memory_reader, sample_bundle_path
):
    reader, store = memory_reader
    store.files.pop(fmt.shard_filename(0))
    with Bundle(sample_bundle_path) as bundle:
        entry = bundle.resolve("big.bin")
    with pytest.raises(CorruptDataError, match="cannot open shard file"):
        reader.read_at(entry, 0, entry.size, path="big.bin")


def test_a_short_shard_in_the_store_is_a_truncated_shard(memory_reader, sample_bundle_path):
    reader, store = memory_reader
    name = fmt.shard_filename(0)
    store.files[name] = store.files[name][: os.path.getsize(sample_bundle_path / name) // 2]
    with Bundle(sample_bundle_path) as bundle:
        entry = bundle.resolve("big.bin")
    with pytest.raises(CorruptDataError):
        reader.read_at(entry, 0, entry.size, path="big.bin")


class NetworkLikeStore(MemoryShardStore):
    """A store whose misses would wait on a network: ``nowait`` reads of uncached bytes raise
    WouldBlock, and every blocking read is recorded."""

    reads_may_stall = True
    partial_reads_cheap = False

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(files)
        self.blocking: list[tuple[str, int, int]] = []
        self.advised: list[str] = []

    def read(self, name: str, offset: int, length: int, *, nowait: bool = False) -> bytes:
        if nowait:
            raise WouldBlock
        self.blocking.append((name, offset, length))
        return super().read(name, offset, length)

    def prefetch(self, name: str, offset: int, length: int) -> None:
        self.advised.append(name)


def test_prefetch_never_waits_on_a_store_whose_reads_may_stall(sample_bundle_path: Path) -> None:
    # The mount prefetches from lookup, on its event loop: the first use of a shard checks its
    # header, which on an object store is a GET. Advice must skip it rather than wait for it.
    index = IndexReader(str(sample_bundle_path))
    names = [fmt.shard_filename(i) for i in range(index.config.shard_count)]
    store = NetworkLikeStore({n: (sample_bundle_path / n).read_bytes() for n in names})
    shards = ShardSet(store, index.marker, index.shard_info)
    try:
        assert shards.reads_may_stall and not shards.partial_reads_cheap
        shards.prefetch(0, 4096, 65536)
        assert store.blocking == [] and store.advised == []
        record = next(index.iter_records(0))
        shards.load(record)  # a real read checks the header, blocking, off the event loop
        shards.prefetch(0, 4096, 65536)
        assert store.advised == [names[0]]
    finally:
        shards.close()
        index.close()
