"""pyfuse3's main loop with no event loop under it: ``drive`` (in ``standing_in``), ``run_until``.

A worker that receives with a blocking read and loads inline (``worker``'s blocking mode) never
waits on anything but the read itself: every handler's coroutine completes without suspending.
trio would only schedule a task that never yields, and importing it costs ~170 ms of a mount's
~350 ms start (docs/performance.md, "Mount start without trio"). So the patched binding imports
trio on first use (third_party/pyfuse3/trio-lazily.patch), and here its loop runs with
``DirectTrio`` in trio's place: pyfuse3 reaches trio only through its module attribute ``trio``,
the attribute ``pyfuse3.asyncio`` replaces the same way, and ``main(blocking=True)`` calls only
what the stand-in offers. Its coroutine is driven by hand; one that suspends would need a real
event loop, and ends the run with ``SuspendedHandler`` (a programming error: a mount with load
threads serves under trio, ``worker.serve``).

May import: the standard library.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import ModuleType, TracebackType
from typing import Any


class SuspendedHandler(RuntimeError):
    """A request's coroutine waited for an event loop where none runs."""


class _Stopped(BaseException):
    """Raised at the loop's next checkpoint once ``run_until``'s condition holds: a
    BaseException, so that no handler's ``except Exception`` takes it."""


class _Task:
    name = "pyfuse3-direct"


class _Lowlevel:
    """What pyfuse3's blocking loop asks of ``trio.lowlevel``."""

    def __init__(self, stop: Callable[[], bool] | None) -> None:
        self._stop = stop

    def current_trio_token(self) -> None:
        return None  # pyfuse3.trio_token: nothing can call into this loop from a thread

    def current_task(self) -> _Task:
        return _Task()

    async def checkpoint(self) -> None:
        self._check()

    async def checkpoint_if_cancelled(self) -> None:
        self._check()

    def notify_closing(self, fd: int) -> None:
        pass  # ``terminate``: the blocking read is interrupted by the signal, not by trio

    def _check(self) -> None:
        if self._stop is not None and self._stop():
            raise _Stopped


class _Nursery:
    """Runs each started task to its end when the ``async with`` block ends."""

    async def __aenter__(self) -> _Nursery:
        self._started: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        return self

    def start_soon(self, fn: Callable[..., Any], *args: Any, name: str | None = None) -> None:
        self._started.append((fn, args))

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        while kind is None and self._started:
            fn, args = self._started.pop(0)
            await fn(*args)
        return False


class DirectTrio:
    """The stand-in for the ``trio`` module inside pyfuse3 while a direct loop runs."""

    class ClosedResourceError(Exception):
        pass

    def __init__(self, stop: Callable[[], bool] | None = None) -> None:
        self.lowlevel = _Lowlevel(stop)

    def open_nursery(self) -> _Nursery:
        return _Nursery()


@contextlib.contextmanager
def standing_in(binding: ModuleType, stop: Callable[[], bool] | None = None) -> Iterator[None]:
    """``DirectTrio`` as ``binding``'s trio for the block (and its previous trio after it)."""
    previous = getattr(binding, "trio")  # noqa: B009 - a binding's attribute the stubs omit
    setattr(binding, "trio", DirectTrio(stop))  # noqa: B010
    try:
        yield
    finally:
        setattr(binding, "trio", previous)  # noqa: B010


def drive(binding: ModuleType) -> bool:
    """Run ``binding.main`` with a blocking receive to its end, inside ``standing_in``; whether
    its ``stop`` ended it."""
    loop = binding.main(1, 1, blocking=True)
    try:
        loop.send(None)
    except StopIteration:
        return False
    except _Stopped:
        return True
    loop.close()
    raise SuspendedHandler("a FUSE request handler waited for an event loop in a direct loop")


def run_until(binding: ModuleType, done: Callable[[], bool]) -> bool:
    """Serve requests until ``done()`` holds at a checkpoint (checked before each receive);
    whether it did (False: the session ended first)."""
    with standing_in(binding, done):
        return drive(binding)
