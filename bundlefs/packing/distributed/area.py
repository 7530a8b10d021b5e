"""The staging area of a distributed pack, as the driver and the tasks share it: its token (how a
task on another machine knows it sees the driver's area), its abort marker (how running tasks
learn the pack failed elsewhere), and its removal.

May import: ``bundlefs.errors``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time

from bundlefs.errors import PackError

_TOKEN = "TOKEN"  # in the staging area: what a task checks to know it sees the driver's area
_ABORT = "ABORT"  # in the staging area: the pack failed; running tasks stop at their next tick


class PackCancelled(PackError):
    """A partition's pack stopped because the distributed pack it belongs to failed."""


def write_token(area: str, token: str) -> None:
    """Mark ``area`` as the driver's, with ``token``."""
    with open(os.path.join(area, _TOKEN), "w", encoding="ascii") as f:
        f.write(token)


def check_area(area: str, token: str) -> None:
    """``PackCancelled`` once the driver has marked the area aborted; ``PackError`` if the area
    is not the driver's (not visible here, or gone)."""
    if os.path.exists(os.path.join(area, _ABORT)):
        raise PackCancelled("the distributed pack failed elsewhere; this partition stopped")
    try:
        with open(os.path.join(area, _TOKEN), encoding="ascii") as f:
            seen = f.read()
    except OSError:
        seen = None
    if seen != token:
        raise PackError(
            f"the staging area {area} is not visible on worker host {os.uname().nodename}: "
            "give --staging a directory on storage the driver and every worker share"
        )


def abort(area: str) -> None:
    """Mark the staging area aborted: running tasks stop at their next progress tick, tasks
    that have not started stop at once."""
    with contextlib.suppress(OSError), open(os.path.join(area, _ABORT), "w"):
        pass


def remove_area(area: str, attempts: int = 5) -> None:
    """Remove the staging area; retried, in case a task that was stopping still wrote in it."""
    for _ in range(attempts):
        shutil.rmtree(area, ignore_errors=True)
        if not os.path.lexists(area):
            return
        time.sleep(0.2)
