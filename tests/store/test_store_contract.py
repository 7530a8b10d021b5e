"""One contract, every ``ShardStore`` (storage/store.py): the same tests over the local store,
the remote store over S3 (moto's server, tests/support/s3server.py), over a web server that
answers range requests (tests/support/httpserver.py) and over fsspec's ``memory://``, and the
in-memory test store (tests/library/test_shard_store.py), in the style of zarr's ``StoreTests``.

Each class says how to make its store over a set of shard files (``make``); the tests say what
every store must do: exact bytes for any range, short reads past the end, ``read_into``,
``prefetch`` that never raises, a missing shard as ``ShardUnavailable``, ``close``, stated
capabilities and what they promise (``holds_copies``: ``discard`` drops a held copy;
``reads_may_stall``: ``nowait`` answers only from what is held), ``stats``, ``failed_read``,
``forked``, and threads reading at once. A new store (or object-store back-end) is one class here.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bundlefs.errors import BundleClosedError, ShardUnavailable, WouldBlock
from bundlefs.storage.location import parse_location
from bundlefs.storage.store import FailedRead, LocalShardStore, ShardStore
from tests.conftest import pseudo_random_bytes
from tests.library.test_shard_store import MemoryShardStore
from tests.support.httpserver import HTTPServer, http_server
from tests.support.s3server import S3Server, s3_server

BIG, SMALL, MISSING = "shard-00000000", "shard-00000001", "shard-00000002"
FILES = {
    BIG: pseudo_random_bytes(300_000, 1, compressible=False),
    SMALL: pseudo_random_bytes(5_000, 2),
}
RANGES = [(0, 32), (1, 4095), (4096, 65536), (123_457, 100_000), (299_000, 1000), (0, 300_000)]
_prefixes = itertools.count()

__all__ = ["http_server", "s3_server"]  # fixtures, imported to be found

MakeStore = Callable[[dict[str, bytes]], ShardStore]


class StoreContract:
    """The tests every store passes. Subclasses provide ``make``."""

    @pytest.fixture
    def make(self) -> Iterator[MakeStore]:
        raise NotImplementedError

    @pytest.fixture
    def store(self, make: MakeStore) -> Iterator[ShardStore]:
        store = make(FILES)
        yield store
        store.close()

    @pytest.fixture
    def replace(self) -> Callable[[ShardStore, str, bytes], None] | None:
        """Put new bytes under a name where a store reads from (stores that hold copies)."""
        return None

    # -- reading ---------------------------------------------------------------------------------

    @pytest.mark.parametrize(("offset", "length"), RANGES)
    def test_a_range_reads_exactly_its_bytes(self, store, offset, length):
        assert store.read(BIG, offset, length) == FILES[BIG][offset : offset + length]

    def test_a_range_past_the_end_comes_back_short(self, store):
        size = len(FILES[SMALL])
        assert store.read(SMALL, size - 10, 100) == FILES[SMALL][-10:]
        assert store.read(SMALL, size + 100, 100) == b""

    def test_a_zero_length_read_is_empty(self, store):
        assert store.read(BIG, 1000, 0) == b""

    @pytest.mark.parametrize(("offset", "length"), RANGES)
    def test_read_into_fills_the_buffer(self, store, offset, length):
        buffer = bytearray(length)
        assert store.read_into(BIG, offset, buffer) == length
        assert bytes(buffer) == FILES[BIG][offset : offset + length]

    def test_read_into_past_the_end_says_how_much_it_read(self, store):
        buffer = bytearray(100)
        size = len(FILES[SMALL])
        assert store.read_into(SMALL, size - 10, memoryview(buffer)) == 10
        assert bytes(buffer[:10]) == FILES[SMALL][-10:]

    def test_a_missing_shard_is_unavailable(self, store):
        with pytest.raises(ShardUnavailable):
            store.read(MISSING, 0, 100)

    def test_prefetch_never_raises_and_changes_no_byte(self, store):
        for name, offset, length in [(BIG, 0, 65536), (BIG, 299_999, 10), (MISSING, 0, 10)]:
            store.prefetch(name, offset, length)
        store.prefetch(SMALL, 10**12, 1)
        assert store.read(BIG, 0, 65536) == FILES[BIG][:65536]

    def test_threads_reading_at_once_each_get_their_bytes(self, store):
        errors: list[BaseException] = []

        def reader(seed: int) -> None:
            try:
                for i in range(20):
                    offset = (seed * 7919 + i * 15_013) % 290_000
                    assert store.read(BIG, offset, 4096) == FILES[BIG][offset : offset + 4096]
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=reader, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []

    def test_a_nowait_read_gives_the_bytes_or_would_block(self, store):
        for _ in range(2):  # cold, then after a blocking read of the same bytes
            with contextlib.suppress(WouldBlock):
                assert store.read(BIG, 4096, 4096, nowait=True) == FILES[BIG][4096:8192]
            store.read(BIG, 4096, 4096)

    def test_a_shard_shorter_in_the_store_reads_short(self, make):
        store = make({BIG: FILES[BIG][:1000]})
        try:
            assert store.read(BIG, 500, 1000) == FILES[BIG][500:1000]
            assert store.read(BIG, 2000, 10) == b""
        finally:
            store.close()

    # -- capabilities ----------------------------------------------------------------------------

    def test_the_capabilities_are_stated(self, store):
        for name in ("partial_reads_cheap", "reads_may_stall", "holds_copies"):
            assert isinstance(getattr(store, name), bool), name

    def test_a_store_that_may_stall_never_waits_for_bytes_it_does_not_hold(self, store):
        if not store.reads_may_stall:
            pytest.skip("reads of this store do not stall")
        with pytest.raises(WouldBlock):
            store.read(BIG, 200_000, 4096, nowait=True)

    def test_discard_drops_a_held_copy(self, store, replace):
        assert store.read(SMALL, 0, 1000) == FILES[SMALL][:1000]
        changed = bytes(b ^ 0xFF for b in FILES[SMALL])
        if not store.holds_copies:
            store.discard(SMALL, 0, 1000)  # nothing held: a no-op that never raises
            assert store.read(SMALL, 0, 1000) == FILES[SMALL][:1000]
            return
        replace(store, SMALL, changed)
        assert store.read(SMALL, 0, 1000) == FILES[SMALL][:1000]  # the held copy
        store.discard(SMALL, 0, 1000)
        assert store.read(SMALL, 0, 1000) == changed[:1000]

    def test_stats_are_none_or_counters(self, store):
        store.read(BIG, 0, 100)
        stats = store.stats()
        if stats is not None:
            assert isinstance(stats, dict)
            assert stats["reads"] >= 1

    def test_a_failed_read_is_damage_unless_the_store_says_outage(self, store):
        failed = store.failed_read("a/file", 0, 0)
        assert isinstance(failed, FailedRead)
        if not store.reads_may_stall:
            assert failed is FailedRead.DAMAGE

    def test_a_forked_store_reads_on(self, store):
        store.read(BIG, 0, 100)
        store.forked()  # what a child after fork() calls; here, in the same process
        assert store.read(BIG, 100_000, 5000) == FILES[BIG][100_000:105_000]

    def test_a_closed_store_refuses_reads(self, make):
        store = make(FILES)
        store.read(BIG, 0, 10)
        store.close()
        with pytest.raises(BundleClosedError):
            store.read(BIG, 0, 10)


class TestLocalShardStore(StoreContract):
    @pytest.fixture
    def make(self, tmp_path: Path) -> Iterator[MakeStore]:
        def make(files: dict[str, bytes]) -> ShardStore:
            directory = tmp_path / f"b{next(_prefixes)}"
            directory.mkdir()
            for name, data in files.items():
                (directory / name).write_bytes(data)
            return LocalShardStore(str(directory))

        yield make


class TestMemoryShardStore(StoreContract):
    @pytest.fixture
    def make(self) -> Iterator[MakeStore]:
        yield lambda files: MemoryShardStore(dict(files))


class RemoteContract(StoreContract):
    """``RemoteShardStore`` over some fsspec back-end; subclasses give its ``storage_options``,
    where objects go (``url``) and how one is put there (``put``)."""

    url = ""

    @pytest.fixture
    def make(
        self, tmp_path: Path, storage_options: dict, put: Callable[[str, bytes], None]
    ) -> Iterator[MakeStore]:
        from bundlefs.storage.objectstore.shard_store import RemoteShardStore

        def make(files: dict[str, bytes]) -> ShardStore:
            url = f"{self.url}/t{os.getpid()}-{next(_prefixes)}"
            for name, data in files.items():
                put(f"{url}/{name}", data)
            location = parse_location(url, storage_options)
            return RemoteShardStore(
                location,
                bytes(16),
                shard_sizes={name: len(data) for name, data in files.items()},
                disk_cache=str(tmp_path / "cache"),
                store_timeout=10,
            )

        yield make

    @pytest.fixture
    def replace(
        self, put: Callable[[str, bytes], None]
    ) -> Callable[[ShardStore, str, bytes], None]:
        return lambda store, name, data: put(store.location.child(name), data)  # type: ignore[attr-defined]


class TestRemoteShardStoreOverS3(RemoteContract):
    url = "s3://contract"

    @pytest.fixture(autouse=True)
    def _needs_s3(self) -> None:
        pytest.importorskip("s3fs")
        pytest.importorskip("moto")

    @pytest.fixture
    def storage_options(self, s3_server: S3Server) -> dict:
        s3_server.create_bucket("contract")
        return s3_server.storage_options

    @pytest.fixture
    def put(self, s3_server: S3Server) -> Callable[[str, bytes], None]:
        return s3_server.put


class TestRemoteShardStoreOverHTTP(RemoteContract):
    @pytest.fixture(autouse=True)
    def _served(self, http_server: HTTPServer) -> None:
        pytest.importorskip("aiohttp")
        self.url = f"{http_server.endpoint}/contract"

    @pytest.fixture
    def storage_options(self) -> dict:
        return {}

    @pytest.fixture
    def put(self, http_server: HTTPServer) -> Callable[[str, bytes], None]:
        return http_server.put


class TestRemoteShardStoreOverFsspecMemory(RemoteContract):
    url = "memory://contract"

    @pytest.fixture
    def storage_options(self) -> dict:
        return {}

    @pytest.fixture
    def put(self) -> Callable[[str, bytes], None]:
        fsspec = pytest.importorskip("fsspec")
        return fsspec.filesystem("memory").pipe
