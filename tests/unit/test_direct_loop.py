"""pyfuse3's loop with no event loop under it (bundlefs/mount/direct.py).

``FakeBinding.main`` makes the calls the patched pyfuse3's ``main(blocking=True)`` makes, in its
order (third_party/pyfuse3/receive-blocking.patch): the token, a nursery starting one session
loop, and per request a checkpoint, then the receive and the handler's coroutine awaited. The
real loop runs under every multi-worker mount test (tests/mount/test_workers.py asserts that
such a mount never imports trio).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import types

import pytest

from bundlefs.mount import direct


class FakeBinding:
    """A binding whose session holds ``requests``; each is answered by awaiting ``handler``."""

    def __init__(self, requests: list[str], handler=None) -> None:
        self.trio = object()  # the lazily imported trio a patched binding holds
        self.requests = list(requests)
        self.answered: list[str] = []
        self.handler = handler
        self.exited = False

    def terminate(self) -> None:
        self.exited = True
        self.trio.lowlevel.notify_closing(3)

    async def _answer(self, request: str) -> None:
        if self.handler is not None:
            await self.handler(request)
        self.answered.append(request)

    async def _session_loop(self, nursery: object) -> None:
        served = 0
        while not self.exited:
            served += 1
            if served % 64 == 0:
                await self.trio.lowlevel.checkpoint()
            else:
                await self.trio.lowlevel.checkpoint_if_cancelled()
            if not self.requests:
                return  # the session ended (unmounted)
            await self._answer(self.requests.pop(0))

    async def main(self, min_tasks: int = 1, max_tasks: int = 99, blocking: bool = False) -> None:
        assert blocking
        self.token = self.trio.lowlevel.current_trio_token()
        assert self.trio.lowlevel.current_task().name
        async with self.trio.open_nursery() as nursery:
            nursery.start_soon(self._session_loop, nursery, name="pyfuse-02")


def test_a_direct_loop_answers_every_request_until_the_session_ends():
    binding = FakeBinding([f"req{i}" for i in range(200)])  # past a full checkpoint's 64
    before = binding.trio
    with direct.standing_in(binding):
        assert isinstance(binding.trio, direct.DirectTrio)
        assert direct.drive(binding) is False  # the session ended, nothing stopped it
    assert binding.answered == [f"req{i}" for i in range(200)]
    assert binding.trio is before


def test_terminate_ends_a_direct_loop_after_the_request_it_is_in():
    binding = FakeBinding(["a", "b", "c"])

    async def stop_at_b(request: str) -> None:
        if request == "b":
            binding.terminate()  # what a stop signal's handler calls

    binding.handler = stop_at_b
    with direct.standing_in(binding):
        assert direct.drive(binding) is False
    assert binding.answered == ["a", "b"]


def test_run_until_stops_at_the_first_checkpoint_after_its_condition_holds():
    binding = FakeBinding(["INIT", "LOOKUP", "READ"])
    assert direct.run_until(binding, lambda: "INIT" in binding.answered) is True
    assert binding.answered == ["INIT"]
    assert binding.requests == ["LOOKUP", "READ"]  # never received: left to the workers


def test_run_until_says_so_when_the_session_ends_first():
    binding = FakeBinding([])
    assert direct.run_until(binding, lambda: False) is False


def test_a_handler_that_waits_for_an_event_loop_ends_a_direct_loop_with_an_error():
    @types.coroutine
    def suspend():
        yield "an event loop's trap"

    async def waits(request: str) -> None:
        await suspend()

    binding = FakeBinding(["a"], handler=waits)
    before = binding.trio
    with pytest.raises(direct.SuspendedHandler), direct.standing_in(binding):
        direct.drive(binding)
    assert binding.trio is before


def test_a_handlers_exception_ends_a_direct_loop_as_it_would_under_trio():
    async def fails(request: str) -> None:
        raise OSError("the session failed")

    binding = FakeBinding(["a"], handler=fails)
    with pytest.raises(OSError, match="the session failed"), direct.standing_in(binding):
        direct.drive(binding)


class _TrioOutsideTheLoop:
    """A binding's lazily imported trio that must not be touched: touching it would import it."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"trio.{name} used outside the direct loop")


def test_a_stop_signal_after_a_blocking_workers_loop_ended_is_only_recorded():
    # The supervisor stops every worker when one sees the mount go; the others may be leaving
    # already, with their loop ended and the binding's trio back in place.
    from bundlefs.mount import worker

    binding = FakeBinding(["a"])
    binding.trio = _TrioOutsideTheLoop()
    before = signal.getsignal(signal.SIGTERM)
    try:
        ended = worker.serve(None, binding, stop_signals=(signal.SIGTERM,), blocking=True)
        assert ended == worker.ENDED_UNMOUNTED and binding.answered == ["a"]
        os.kill(os.getpid(), signal.SIGTERM)  # runs the handler serve left: nothing to stop
        assert not binding.exited
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_stop_signal_while_a_blocking_worker_serves_ends_its_loop_after_that_request():
    from bundlefs.mount import worker

    binding = FakeBinding(["a", "b"])
    before = signal.getsignal(signal.SIGTERM)
    try:

        async def stopped_first(request: str) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # while the loop runs: terminate()

        binding.handler = stopped_first
        ended = worker.serve(None, binding, stop_signals=(signal.SIGTERM,), blocking=True)
        assert ended == worker.ENDED_BY_SIGNAL and binding.exited
        assert binding.answered == ["a"]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_workers_path_of_a_patched_binding_imports_no_trio():
    from bundlefs.mount.bindings import binding

    if binding() != "patched":
        pytest.skip("a stock pyfuse3 imports trio with itself")
    code = (
        "import sys\n"
        "from bundlefs.mount import daemon, supervisor, worker, operations, direct\n"
        "from bundlefs.mount.bindings import pyfuse3\n"
        "print('trio' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]
