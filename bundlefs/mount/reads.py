"""``ReadScheduler``: where a FUSE read's record loads run, inline on the event loop or in threads.

A read whose records are cached, or whose bytes the page cache holds, is served inline: a thread
hop costs more than the read. A read that must wait for the disk is served inline too when
nothing else would be served meanwhile (no other load in flight, no request queued on
``/dev/fuse``), and otherwise in load threads (``ThreadOffload``), where pread, CRC and lz4
release the GIL and overlap with each other and with the requests the loop keeps answering. With
no load threads (the workers' default) every load runs inline. A bundle on an object store never
waits inline for a miss: a read may wait through retries there. docs/concurrency.md has the
measured policy.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.read``, ``bundlefs.mount.kernel``,
``bundlefs.mount.offload``.
"""

from __future__ import annotations

import select
from typing import TYPE_CHECKING

from bundlefs.core import format as fmt
from bundlefs.errors import WouldBlock
from bundlefs.mount import kernel
from bundlefs.read.content import ContentReader

if TYPE_CHECKING:
    from bundlefs.mount.offload import ThreadOffload


class ReadScheduler:
    """Reads of ``content`` for one event loop, with ``load_threads`` threads (0: all inline)."""

    def __init__(self, content: ContentReader, load_threads: int) -> None:
        self._content = content
        self._offload: ThreadOffload | None = None
        if load_threads:
            from bundlefs.mount.offload import ThreadOffload  # (imports trio: only where used)

            self._offload = ThreadOffload(load_threads)
        self._loads_in_flight = 0
        self._fuse_poll: select.poll | None = None  # set by watch_session(): the session exists

    @property
    def loads_inline(self) -> bool:
        """Whether record loads run on the event loop (no load threads)."""
        return self._offload is None

    def watch_session(self) -> None:
        """Look for this process's /dev/fuse session, to see whether requests wait in it."""
        self._fuse_poll = kernel.poll_fuse_device()

    async def read(self, entry: fmt.Entry, off: int, size: int) -> bytes | bytearray:
        """``size`` bytes of ``entry`` at ``off``, loaded where this module's policy says."""
        if self._offload is None:
            return self._content.read_at(entry, off, size, as_buffer=True)
        try:
            # Cached records and page-cached bytes are served inline: a thread hop costs more.
            return self._content.read_at(entry, off, size, nowait=True, as_buffer=True)
        except WouldBlock:
            pass
        if (
            not self._loads_in_flight
            and not self._content.reads_may_stall
            and self._kernel_queue_empty()
        ):
            # Nothing else to serve meanwhile: wait for the disk here, without the hop (never
            # for an object store, where a read may wait through retries).
            return self._content.read_at(entry, off, size, as_buffer=True)
        # A real disk read: in worker threads, pread + CRC + lz4 (which release the GIL) overlap
        # with each other and with the requests the event loop keeps answering.
        self._loads_in_flight += 1
        try:
            return await self._offload.run(self._read_buffer, entry, off, size)
        finally:
            self._loads_in_flight -= 1

    def _read_buffer(self, entry: fmt.Entry, off: int, size: int) -> bytes | bytearray:
        return self._content.read_at(entry, off, size, as_buffer=True)

    def _kernel_queue_empty(self) -> bool:
        """Whether no request waits in /dev/fuse (always False where we cannot tell)."""
        return self._fuse_poll is not None and not self._fuse_poll.poll(0)

    def close(self) -> None:
        """Stop the load threads (after the loop has ended)."""
        if self._offload is not None:
            self._offload.close()
