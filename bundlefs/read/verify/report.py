"""What ``verify`` finds: ``Problem``, ``VerifyReport``, ``VerifyProgress``, and ``Findings``,
the report being written with the progress it calls back; ``UnknownShard``, a shard asked for
that the bundle does not have.

May import: nothing of ``bundlefs``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


class UnknownShard(ValueError):
    """``verify(shards=…)`` named a shard number the bundle has no shard for."""


@dataclass(frozen=True)
class Problem:
    """One thing found wrong; ``kind`` is marker, index, config, shard, record, entry, totals
    (version 5) or file."""

    kind: str
    message: str
    path: str | None = None
    shard: int | None = None
    record: int | None = None

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, object]:
        """As ``bundlefs verify --json`` lists it (the record offset is in the message)."""
        return {"kind": self.kind, "message": self.message, "path": self.path, "shard": self.shard}


@dataclass(frozen=True)
class VerifyProgress:
    phase: str  # "index", "records", "entries", "files"
    done: int
    total: int
    bytes_checked: int
    started: float


@dataclass
class VerifyReport:
    bundle: str
    entries: int = 0
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    hardlinks: int = 0
    specials: int = 0  # FIFOs, sockets, devices
    shards: int = 0
    # The shards checked (``verify --shard``), in order; None: every shard.
    shards_checked: list[int] | None = None
    files_checked: int = 0  # regular files whose content was read (those in the shards checked)
    records: int = 0
    # Shard bytes read and found sound: each shard's header block and its records' stored
    # bytes (to the block boundary each is padded to). An intact bundle's equals
    # ``stored_bytes``, what ``info`` prints as "stored bytes"; it never exceeds it.
    bytes_checked: int = 0
    stored_bytes: int = 0  # the shard files' sizes by the shard table
    data_bytes: int | None = None  # the files' bytes, as ``info`` prints them; None: unopened
    index_bytes: int = 0  # the index file, checked whole (its CRC) before anything else
    seconds: float = 0.0
    problems: list[Problem] = field(default_factory=list)
    damaged_files: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, object]:
        """The report as ``bundlefs verify --json`` prints it."""
        return {
            "bundle": self.bundle,
            "ok": self.ok,
            "entries": self.entries,
            "files": self.files,
            "dirs": self.dirs,
            "symlinks": self.symlinks,
            "hardlinks": self.hardlinks,
            "specials": self.specials,
            "shards": self.shards,
            "shards_checked": self.shards_checked,
            "files_checked": self.files_checked,
            "records": self.records,
            "bytes_checked": self.bytes_checked,
            "stored_bytes": self.stored_bytes,
            "data_bytes": self.data_bytes,
            "index_bytes": self.index_bytes,
            "seconds": round(self.seconds, 3),
            "problems": [p.to_dict() for p in self.problems],
            "damaged_files": self.damaged_files,
        }


class Findings:
    """The report a scan writes, and its progress callback (at most five calls a second)."""

    def __init__(self, bundle: str, progress: Callable[[VerifyProgress], None] | None) -> None:
        self.report = VerifyReport(bundle)
        self.damaged_files: set[str] = set()
        self._progress = progress
        self._last_tick = 0.0
        self._started = time.monotonic()

    def problem(
        self,
        kind: str,
        message: str,
        *,
        path: str | None = None,
        shard: int | None = None,
        record: int | None = None,
    ) -> None:
        """Note one thing found wrong, and where."""
        self.report.problems.append(Problem(kind, message, path, shard, record))

    def tick(self, phase: str, done: int, total: int) -> None:
        """Say how far ``phase`` is (``total`` 0: unknown)."""
        if self._progress is None:
            return
        now = time.monotonic()
        if now - self._last_tick >= 0.2 or done == total:
            self._last_tick = now
            self._progress(
                VerifyProgress(phase, done, total, self.report.bytes_checked, self._started)
            )

    def finished(self) -> VerifyReport:
        """The report, with the damaged files named and the time taken."""
        self.report.damaged_files = sorted(self.damaged_files)
        self.report.seconds = time.monotonic() - self._started
        return self.report
