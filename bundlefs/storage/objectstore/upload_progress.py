"""How far an upload is: ``UploadProgress`` (what ``pack`` reports), and the count the upload
threads add to as the back-end reports bytes sent (``Upload``, ``ByteCounter``: fsspec's
``callback`` protocol). ``RemotePublisher`` (storage/objectstore/upload.py) uses them.

May import: the standard library.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class UploadProgress:
    """An upload under way (and, once ``publish`` returns, done): ``RemotePublisher.uploaded``."""

    total_bytes: int
    objects: int
    bytes_done: int = 0
    objects_done: int = 0
    started: float = dataclasses.field(default_factory=time.monotonic)
    seconds: float = 0.0  # set when every object (the marker included) is in the store


class ByteCounter:
    """fsspec's ``callback`` protocol (``set_size``, ``relative_update``, …) for one object,
    adding what the back-end reports to the upload's shared count. Never more than the object's
    size: a part sent again after a failure is not counted twice."""

    def __init__(self, upload: Upload, size: int) -> None:
        self.upload, self.size, self.done = upload, size, 0

    def set_size(self, size: int) -> None:
        pass

    def relative_update(self, inc: int = 1) -> None:
        self.absolute_update(self.done + inc)

    def absolute_update(self, value: int) -> None:
        value = min(value, self.size)
        self.upload.add(value - self.done)
        self.done = max(self.done, value)

    def branched(self, *args: Any, **kwargs: Any) -> None:
        return None  # no callbacks for the parts of a directory copy: we upload files

    def call(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


class Upload:
    """The shared count of one publish, reported to ``progress`` (from the upload threads)."""

    def __init__(self, progress: UploadProgress, report: Callable[[UploadProgress], None] | None):
        self.progress, self.report = progress, report
        self._lock = threading.Lock()

    def add(self, nbytes: int, objects: int = 0) -> None:
        if nbytes <= 0 and not objects:
            return
        with self._lock:
            self.progress.bytes_done += max(0, nbytes)
            self.progress.objects_done += objects
            if self.report is not None:
                self.report(self.progress)
