"""The read-ahead policy of a bundle on an object store: which reads make a sequential stream,
how far ahead of its reader to fetch, and in which pieces. Pure: byte positions in, byte ranges
out; no network, no clock, no threads. ``RemoteShardStore`` (storage/objectstore/shard_store.py)
asks it under its lock and does the GETs.

A stream is found from the positions of the reads, whatever their size: a read starting near where
an earlier read of the same object ended continues that stream (the kernel turns a ``cat`` into 128
KiB FUSE READs, an application may read 1 MiB at a time; both arrive here as whole 256 KiB records,
sometimes out of order, sometimes twice (the mount's no-wait attempt, then the real read), and up
to the kernel's read-ahead ahead of the reader, which a sequential stream's window takes in). From
the third read that moves a stream forward (``min_run``) it is *sequential*: its window (bytes to
keep held or on their way ahead of the reader) starts at ``first_window`` and doubles each time
pieces are started, up to ``max_window``; the missing part of the window is fetched as pieces of up
to ``max_piece`` bytes, several GETs at once. A piece is started only when a whole one is missing
(or the object ends), so a stream costs few, large GETs. Reads that form no stream get nothing
ahead: they fetch only what they touch.

May import: the standard library.
"""

from __future__ import annotations

import dataclasses

KIB = 1024
MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class ReadAheadSettings:
    """The policy's numbers (defaults: docs/storage.md, "Reading")."""

    first_window: int = 1 * MIB  # the window of a stream that has just become sequential
    max_window: int = 32 * MIB  # bytes held or in flight ahead of one reader, at most
    max_piece: int = 8 * MIB  # one read-ahead GET, at most: ~4 in flight at the full window
    # A read starting up to ``gap`` after where a stream ended, or up to ``behind`` before it
    # (reads of one reader arrive out of order, and the same read may come twice), belongs to it.
    gap: int = 256 * KIB
    behind: int = 1 * MIB
    streams_per_object: int = 8  # concurrent sequential readers remembered per object
    # Reads that must move a stream forward before it is read ahead: 3, so that two random
    # reads that happen to be neighbours do not start a window (random reads then fetch no
    # more than they touch).
    min_run: int = 3

    def bounded(self, memory: int, disk: int | None) -> ReadAheadSettings:
        """These settings with the window kept within a memory bound (half of ``memory``: the
        other half holds what the readers are still reading) and a disk cache (a quarter of
        ``disk``, so that a window is not evicted before it is read; None: no disk cache)."""
        limit = min(self.max_window, memory // 2)
        if disk is not None:
            limit = min(limit, disk // 4)
        window = max(limit, 0)
        return dataclasses.replace(
            self,
            max_window=window,
            first_window=min(self.first_window, window),
            max_piece=min(self.max_piece, window) if window else self.max_piece,
        )


class Stream:
    """One reader's position in one object: the end of its furthest read, how many reads moved
    it forward, and its window."""

    __slots__ = ("next", "run", "window", "min_run")

    def __init__(self, next_offset: int, min_run: int = 3) -> None:
        self.next = next_offset
        self.run = 1
        self.window = 0
        self.min_run = min_run

    @property
    def sequential(self) -> bool:
        return self.run >= self.min_run

    def __repr__(self) -> str:
        return f"Stream(next={self.next}, run={self.run}, window={self.window})"


class ReadAheadPolicy:
    """Streams per object, and the pieces to fetch ahead of them. Not thread-safe: the caller
    holds its own lock around every call."""

    def __init__(self, settings: ReadAheadSettings | None = None) -> None:
        self.settings = settings or ReadAheadSettings()
        self._streams: dict[str, list[Stream]] = {}

    @property
    def enabled(self) -> bool:
        return self.settings.max_window > 0

    def observe(self, name: str, offset: int, end: int) -> Stream | None:
        """Note a read of bytes ``offset … end`` of object ``name``; the stream it belongs to
        if that stream is sequential, else None (a read that only repeats or revisits bytes
        behind a stream does not move it forward)."""
        s = self.settings
        streams = self._streams.setdefault(name, [])
        for i in range(len(streams) - 1, -1, -1):  # most recent first
            stream = streams[i]
            # A sequential stream also takes reads anywhere in its window: the kernel's own
            # read-ahead sends READs up to read_ahead_kb beyond the reader, in no set order.
            window = stream.window if stream.sequential else 0
            if stream.next - max(s.behind, window) <= offset <= stream.next + max(s.gap, window):
                if end > stream.next:
                    stream.next = end
                    stream.run += 1
                if i != len(streams) - 1:
                    del streams[i]
                    streams.append(stream)
                return stream if stream.sequential else None
        streams.append(Stream(end, s.min_run))
        if len(streams) > s.streams_per_object:
            del streams[0]
        return None

    def plan(
        self,
        stream: Stream,
        offset: int,
        covered: int,
        size: int | None,
        budget: int,
    ) -> list[tuple[int, int]]:
        """The ranges to start fetching for a sequential ``stream`` whose reader is at
        ``offset``, when the bytes ``offset … covered`` are held or on their way; ``size`` is
        the object's (None: unknown, nothing is planned past the reader's window), ``budget`` the
        bytes that may be put in flight now. Grows the window when it plans anything."""
        s = self.settings
        if not self.enabled:
            return []
        window = max(stream.window, s.first_window)
        target = offset + window
        if size is not None:
            target = min(target, size)
        covered = max(covered, offset)
        missing = target - covered
        if missing <= 0:
            return []
        piece = min(s.max_piece, max(window // 4, s.first_window))
        at_end = size is not None and target >= size
        if missing < piece and not at_end:
            return []  # wait until a whole piece is missing: few, large GETs
        out: list[tuple[int, int]] = []
        pos = covered
        while pos < target:
            stop = min(pos + piece, target)
            if stop - pos < piece and not at_end:
                break  # a remainder waits to be a whole piece
            if stop - pos > budget:
                break  # the memory bound: the rest when earlier pieces have been read
            out.append((pos, stop))
            budget -= stop - pos
            pos = stop
        if out:
            stream.window = min(window * 2, s.max_window)
        return out

    def forget(self, name: str) -> None:
        self._streams.pop(name, None)

    def clear(self) -> None:
        self._streams.clear()
