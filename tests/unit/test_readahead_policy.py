"""The object store's read-ahead policy and its failed-read accounting, without a network
(bundlefs/storage/objectstore/: pure units; the store that applies them is tested against a real
S3 server in tests/store/test_object_store*.py)."""

from __future__ import annotations

import random

from bundlefs.storage.objectstore.outage import FailedReads
from bundlefs.storage.objectstore.readahead import ReadAheadPolicy, ReadAheadSettings

KIB = 1024
MIB = 1024 * 1024
RECORD = 256 * KIB


def _stream_reads(policy: ReadAheadPolicy, size: int, read_size: int) -> list[tuple[int, int]]:
    """Read an object of ``size`` bytes front to back in ``read_size`` pieces, as whole 256 KiB
    records reach the store, with everything planned treated as arriving at once; the pieces
    planned."""
    planned: list[tuple[int, int]] = []
    covered = 0
    loaded = 0  # records below this are in the reader's record cache
    for offset in range(0, size, read_size):
        for start in range(loaded, min(offset + read_size, size), RECORD):
            end = min(start + RECORD, size)
            loaded = end
            stream = policy.observe("shard", start, end)
            if stream is None:
                covered = max(covered, end)  # fetched by the read itself
                continue
            pieces = policy.plan(stream, start, covered, size, budget=64 * MIB)
            planned += pieces
            if pieces:
                covered = max(covered, pieces[-1][1])
    return planned


def test_a_stream_of_small_reads_grows_to_full_size_pieces():
    planned = _stream_reads(ReadAheadPolicy(), 64 * MIB, 128 * KIB)
    sizes = [stop - start for start, stop in planned]
    assert max(sizes) == 8 * MIB
    assert sum(sizes) >= 63 * MIB  # all but the first records read ahead
    assert len(planned) <= 16  # a few growing pieces, then 8 MiB ones


def test_one_mib_reads_make_the_same_stream_as_small_ones():
    small = _stream_reads(ReadAheadPolicy(), 64 * MIB, 128 * KIB)
    large = _stream_reads(ReadAheadPolicy(), 64 * MIB, 1 * MIB)
    assert small == large


def test_planned_pieces_are_contiguous_and_never_overlap():
    planned = _stream_reads(ReadAheadPolicy(), 40 * MIB + 12345, 128 * KIB)
    for (_, stop), (start, _) in zip(planned, planned[1:], strict=False):
        assert start == stop
    assert planned[-1][1] == 40 * MIB + 12345  # up to the end of the object, not past it


def test_random_reads_are_almost_never_a_stream():
    policy = ReadAheadPolicy()
    rng = random.Random(3)
    records = 400 * MIB // RECORD
    streams = 0
    for _ in range(256):  # bench.object_store's random pass
        start = rng.randrange(0, records) * RECORD
        streams += policy.observe("shard", start, start + RECORD) is not None
    assert streams <= 2


def test_two_neighbouring_reads_are_not_yet_a_stream():
    policy = ReadAheadPolicy()
    assert policy.observe("shard", 0, RECORD) is None
    assert policy.observe("shard", RECORD, 2 * RECORD) is None
    assert policy.observe("shard", 2 * RECORD, 3 * RECORD) is not None


def test_a_repeated_read_does_not_move_a_stream():
    policy = ReadAheadPolicy()
    for _ in range(5):  # the mount's no-wait attempt, then the real read, and so on
        assert policy.observe("shard", 0, RECORD) is None


def test_reads_out_of_order_and_ahead_stay_in_one_stream():
    policy = ReadAheadPolicy()
    for i in range(3):
        stream = policy.observe("shard", i * RECORD, (i + 1) * RECORD)
    assert stream is not None
    policy.plan(stream, 2 * RECORD, 2 * RECORD, None, budget=64 * MIB)
    window = stream.window
    # The kernel's read-ahead: a READ 1 MiB ahead, then the ones it skipped.
    ahead = 3 * RECORD + 1 * MIB
    assert policy.observe("shard", ahead, ahead + RECORD) is stream
    assert policy.observe("shard", 3 * RECORD, 4 * RECORD) is stream
    assert stream.window == window


def test_the_memory_budget_holds_pieces_back():
    policy = ReadAheadPolicy()
    for i in range(3):
        stream = policy.observe("shard", i * RECORD, (i + 1) * RECORD)
    assert stream is not None
    stream.window = 32 * MIB
    assert policy.plan(stream, 0, 0, None, budget=4 * MIB) == []
    assert policy.plan(stream, 0, 0, None, budget=16 * MIB) == [(0, 8 * MIB), (8 * MIB, 16 * MIB)]


def test_settings_bounded_by_a_small_disk_cache_and_memory():
    bounded = ReadAheadSettings().bounded(memory=16 * MIB, disk=8 * MIB)
    assert bounded.max_window == 2 * MIB
    assert bounded.max_piece <= bounded.max_window
    assert ReadAheadSettings().bounded(memory=64 * MIB, disk=None).max_window == 32 * MIB


def test_a_disabled_policy_plans_nothing():
    policy = ReadAheadPolicy(ReadAheadSettings(max_window=0))
    for i in range(5):
        stream = policy.observe("shard", i * RECORD, (i + 1) * RECORD)
        if stream is not None:
            assert policy.plan(stream, i * RECORD, i * RECORD, None, 64 * MIB) == []


# -- failed reads during an outage -----------------------------------------------------------------


def test_the_kernels_retry_of_a_failed_read_is_counted_once():
    failed = FailedReads()
    assert failed.note(("a", 0, 0), "a", now=100.0)
    assert not failed.note(("a", 0, 0), "a", now=100.3)  # the synchronous retry
    assert failed.note(("a", 0, 0), "a", now=110.0)  # a later read of the same bytes
    assert failed.count == 2


def test_failed_files_are_named_at_most_once_per_interval():
    failed = FailedReads(interval=10.0, max_names=2)
    failed.note(("a", 0, 0), "a", now=0.0)
    assert failed.line(now=0.0) == "read failed with EIO (object store unreachable): a"
    for name in "bcd":
        failed.note((name, 0, 0), name, now=1.0)
    assert failed.line(now=5.0) is None  # within the interval
    line = failed.line(now=10.0)
    assert line == "read failed with EIO (object store unreachable): b, c and 1 more"
    assert failed.line(now=30.0) is None  # nothing new
    failed.note(("e", 0, 0), "e", now=31.0)
    assert failed.flush() == "read failed with EIO (object store unreachable): e"
