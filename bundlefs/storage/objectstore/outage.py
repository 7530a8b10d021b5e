"""Reads that failed because the object store was unreachable: counted once per failed read,
and named in a log line at most once per interval. Pure: the caller passes the time and logs the
line it is handed (``RemoteShardStore``, storage/objectstore/shard_store.py).

Once per failed read: the kernel retries a failed read-ahead with a synchronous read of the same
bytes, so one application read that fails reaches the mount as two failed FUSE READs of one
record within a moment; the second one (the same key within ``repeat_window`` seconds) is not
counted again.

``FailedRead`` (what a failed read was) is the store interface's (storage/store.py).

May import: the standard library.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

REPEAT_WINDOW = 2.0  # seconds within which the same record failing again is the same read
NAME_INTERVAL = 10.0  # at most one line naming the files per this many seconds
MAX_NAMES = 10  # files named in one line; the rest are counted
_REMEMBERED = 256  # recent keys kept for the repeat check


class FailedReads:
    """The count of reads failed by an outage, and the files still to be named in a line."""

    def __init__(
        self,
        *,
        repeat_window: float = REPEAT_WINDOW,
        interval: float = NAME_INTERVAL,
        max_names: int = MAX_NAMES,
    ) -> None:
        self.repeat_window = repeat_window
        self.interval = interval
        self.max_names = max_names
        self.count = 0
        self._recent: OrderedDict[Hashable, float] = OrderedDict()
        self._pending: list[str] = []  # files failed since the last line, in order, unique
        self._unnamed = 0  # failed reads since the last line beyond those named
        self._last_line: float | None = None

    def note(self, key: Hashable, name: str | None, now: float) -> bool:
        """A read of ``key`` (file and record) of file ``name`` failed; whether it counts (False:
        the same read retried by the kernel)."""
        seen = self._recent.pop(key, None)
        self._recent[key] = now
        while len(self._recent) > _REMEMBERED:
            self._recent.popitem(last=False)
        if seen is not None and now - seen <= self.repeat_window:
            return False
        self.count += 1
        label = name if name is not None else "?"
        if label in self._pending:
            return True
        if len(self._pending) < self.max_names:
            self._pending.append(label)
        else:
            self._unnamed += 1
        return True

    def line(self, now: float) -> str | None:
        """The line to log now, if there are failed reads not yet named and the last line is at
        least ``interval`` old (or there was none); None otherwise."""
        if not self._pending:
            return None
        if self._last_line is not None and now - self._last_line < self.interval:
            return None
        names = ", ".join(self._pending)
        more = f" and {self._unnamed} more" if self._unnamed else ""
        self._last_line = now
        self._pending, self._unnamed = [], 0
        return f"read failed with EIO (object store unreachable): {names}{more}"

    def flush(self) -> str | None:
        """The line for what is still pending whatever the interval (the outage ended)."""
        self._last_line = None
        return self.line(0.0)
