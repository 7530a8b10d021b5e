"""``ThreadOffload`` and ``ResidentMapping``: the mount's cold-path helpers, in process."""

from __future__ import annotations

import os
import threading

import pytest
import trio

from bundlefs.core.libc import ResidentMapping
from bundlefs.mount.offload import ThreadOffload


@pytest.mark.trio
async def test_offload_runs_calls_on_worker_threads_and_returns_their_results():
    offload = ThreadOffload(2)
    try:
        loop_thread = threading.get_ident()
        result = await offload.run(lambda a, b: (a + b, threading.get_ident()), 2, 3)
        assert result[0] == 5
        assert result[1] != loop_thread
    finally:
        offload.close()


@pytest.mark.trio
async def test_offload_raises_the_calls_exception_on_the_loop():
    offload = ThreadOffload(1)
    try:
        with pytest.raises(ZeroDivisionError):
            await offload.run(lambda: 1 / 0)
        assert await offload.run(lambda: "still serving") == "still serving"
    finally:
        offload.close()


@pytest.mark.trio
async def test_offload_overlaps_blocking_calls():
    # Two calls that each wait for the other can only finish if they run at the same time.
    offload = ThreadOffload(2)
    barrier = threading.Barrier(2, timeout=10)
    results = []

    async def call(n: int) -> None:
        results.append(await offload.run(lambda: (barrier.wait(), n)[1]))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, 1)
            nursery.start_soon(call, 2)
    finally:
        offload.close()
    assert sorted(results) == [1, 2]


def test_offload_needs_a_thread():
    with pytest.raises(ValueError):
        ThreadOffload(0)


def test_resident_mapping_maps_a_whole_file_and_closes_once(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(3 * 4096 + 17))
    fd = os.open(path, os.O_RDONLY)
    try:
        mapping = ResidentMapping(fd, path.stat().st_size)
    finally:
        os.close(fd)
    assert mapping.size == 3 * 4096 + 17
    mapping.close()
    mapping.close()  # harmless


def test_resident_mapping_of_a_bad_descriptor_is_an_oserror():
    with pytest.raises(OSError):
        ResidentMapping(-1, 4096)
