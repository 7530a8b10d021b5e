"""Running the command line paused at a chosen point, to act on it there: send it a real signal
(``interrupted``), or change its source under it (``paused``).

A library function is wrapped, in the subprocess only, to announce by a file that its Nth call has
begun and to wait until the test removes that file (at most 60 s) or a signal interrupts it: the
same moment every run, without timing guesses.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

# The command line with one library function paused: argv is MODULE ATTRIBUTE N READY_FILE,
# then the command's own arguments. ATTRIBUTE may be Class.method.
_PAUSED = """
import importlib, os, signal, sys, threading, time
# As a terminal starts a command: a test run launched in the background (``make test &``) has
# SIGINT ignored, which its children inherit, and the CLI rightly leaves an ignored signal alone.
signal.signal(signal.SIGINT, signal.default_int_handler)
module, attribute, nth, ready = sys.argv[1:5]
owner = importlib.import_module(module)
*path, name = attribute.split(".")
for part in path:
    owner = getattr(owner, part)
original = getattr(owner, name)
calls, lock = [0], threading.Lock()
def paused(*args, **kwargs):
    with lock:
        calls[0] += 1
        now = calls[0]
    if now == int(nth):  # paused until the test removes the file (or a signal comes)
        open(ready, "w").close()
        deadline = time.monotonic() + 60
        while os.path.exists(ready) and time.monotonic() < deadline:
            time.sleep(0.01)
    return original(*args, **kwargs)
setattr(owner, name, paused)
from bundlefs.cli import main
sys.exit(main(sys.argv[5:]))
"""


@contextlib.contextmanager
def paused(
    tmp_path: Path,
    where: str,
    nth: int,
    *args: str | os.PathLike,
    env: dict[str, str] | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``bundlefs ARGS`` in a subprocess, paused at the ``nth`` call of ``where``
    (MODULE:ATTRIBUTE): yields the process and the file whose removal resumes it; the process
    is ended (killed, if need be) when the body is done."""
    module, attribute = where.split(":")
    ready = tmp_path / "paused"
    process = subprocess.Popen(
        [sys.executable, "-c", _PAUSED, module, attribute, str(nth), str(ready)]
        + [os.fspath(a) for a in args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert process.poll() is None, process.stderr.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the command never reached the pause"
            time.sleep(0.02)
        yield process, ready
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        ready.unlink(missing_ok=True)


def interrupted(
    tmp_path: Path,
    where: str,
    nth: int,
    signum: int,
    *args: str | os.PathLike,
    env: dict[str, str] | None = None,
) -> tuple[int, list[str]]:
    """Run ``bundlefs ARGS`` paused at the ``nth`` call of ``where`` (MODULE:ATTRIBUTE), send
    ``signum`` there; its exit status and stderr lines."""
    with paused(tmp_path, where, nth, *args, env=env) as (process, _ready):
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    return process.returncode, err.decode().splitlines()
