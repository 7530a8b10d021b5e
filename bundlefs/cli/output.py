"""What a user of the command line sees: stdout lines, one-sentence errors, progress, the log.

Every command writes through here:
- ``out`` writes a line to stdout as bytes (names that are not UTF-8 come out unchanged), and
  ``out_json`` one JSON object (``--json``, from a result's ``to_dict()``);
- ``error`` writes ``bundlefs: error: …``, the one sentence of a failure;
- ``status`` is the self-overwriting progress line on stderr (only on a terminal, never with
  ``--quiet``);
- ``setup_logging`` decides where log records go, for every command and for the mount daemon;
  with stderr connected to journald (``JOURNAL_STREAM`` names it: a systemd service), lines carry
  the sd-daemon priority prefix (``<3>`` for an error) and neither a timestamp nor a PID, which
  the journal records itself, so ``journalctl -p err`` finds errors;
- ``size`` is the argparse type of every size option; ``rate``, ``ratio`` and ``count`` (a number
  and its noun, singular or plural) format what the commands report;
- ``EXIT_*`` are the exit statuses of docs/cli.md.

May import: ``bundlefs.core``, ``bundlefs.errors``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Literal, Protocol

from bundlefs.core.units import format_size, parse_size
from bundlefs.errors import SizeError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# pack published a bundle, but not a faithful copy of SRC: files changed while they were
# read (GNU tar's status 1 case), or entries were left out (--skip-errors, special files).
# Distinct, so that ``pack SRC DEST && rm -rf SRC`` never removes what the bundle lacks.
EXIT_PACKED_CHANGED, EXIT_PACKED_SKIPPED = 3, 4
EXIT_BROKEN_PIPE = 141  # what a shell reports for a writer killed by SIGPIPE

PROG = "bundlefs"
_MB = 1_000_000


# -- stdout and errors ----------------------------------------------------------------------------


def out(text: str | bytes = "", *, end: bytes = b"\n") -> None:
    """Write a line to stdout as bytes, so names that are not UTF-8 come out unchanged; ``end``
    is what ends it (``ls -0``: NUL)."""
    data = os.fsencode(text) if isinstance(text, str) else text
    sys.stdout.buffer.write(data + end)


def out_json(facts: dict[str, object]) -> None:
    """``--json``: one indented object on stdout."""
    out(json.dumps(facts, indent=2))


def error(message: str) -> None:
    """The one sentence of a failure, ``bundlefs: error: …`` on stderr."""
    status.clear()
    sys.stderr.write(f"{journal_prefix(logging.ERROR)}{PROG}: error: {message}\n")
    sys.stderr.flush()


class FilesProgress(Protocol):
    files: int
    bytes: int


def files_progress(verb: str) -> Callable[[FilesProgress], None]:
    """A progress callback for a command that walks files (extract, export): at most every
    0.2 s, ``VERB: N files, SIZE, S s`` on the status line."""
    started = last = time.monotonic()

    def show(p: FilesProgress) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= 0.2:
            last = now
            status.show(f"{verb}: {p.files:,} files, {format_size(p.bytes)}, {now - started:.0f} s")

    return show


def warn(message: str) -> None:
    """Something the user should know that did not stop the command: one line on stderr."""
    status.clear()
    sys.stderr.write(f"{journal_prefix(logging.WARNING)}{PROG}: warning: {message}\n")
    sys.stderr.flush()


# -- progress -------------------------------------------------------------------------------------


class StatusLine:
    """One self-overwriting progress line on stderr (only when stderr is a terminal)."""

    def __init__(self) -> None:
        self.enabled = False
        self._active = False

    def show(self, text: str) -> None:
        if not self.enabled:
            return
        sys.stderr.write("\r\x1b[K" + text)
        sys.stderr.flush()
        self._active = True

    def clear(self) -> None:
        if self._active:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._active = False


status = StatusLine()


# -- sizes and rates ------------------------------------------------------------------------------


def size(text: str) -> int:
    """argparse type for sizes such as ``4096``, ``256K``, ``4GiB`` (a bad one: usage error)."""
    try:
        return parse_size(text)
    except SizeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 file``, ``2 files``, ``1,000 hard links``: a number and its noun, agreeing."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def ratio(data_bytes: int, stored_bytes: int) -> str:
    """Data bytes per stored byte, for a person: two significant digits where two decimals
    would round to "0.00" (a tiny bundle, its few bytes of data dwarfed by its own structure,
    which "0.00" misreads as "nothing stored"); "-" for a bundle without data."""
    if not data_bytes or not stored_bytes:
        return "-"
    value = data_bytes / stored_bytes
    return f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"


def rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / _MB / seconds:.1f} MB/s" if seconds > 0 else "- MB/s"


# -- the log --------------------------------------------------------------------------------------

# sd-daemon(3) priorities, from syslog's: what journald files a stderr line under.
_JOURNAL_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


def stderr_is_journal() -> bool:
    """Whether stderr is the journald stream systemd connected (``JOURNAL_STREAM=DEV:INODE``
    names it; a child whose stderr was redirected elsewhere inherits the variable, hence the
    comparison)."""
    value = os.environ.get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


def journal_prefix(level: int) -> str:
    """``<N>`` (sd-daemon(3)) for a stderr line of ``level`` when stderr is the journal, else
    nothing."""
    if not stderr_is_journal():
        return ""
    for threshold in sorted(_JOURNAL_PRIORITY, reverse=True):
        if level >= threshold:
            return f"<{_JOURNAL_PRIORITY[threshold]}>"
    return "<7>"


class _JournalFormatter(logging.Formatter):
    """A record as journald wants a stderr line: the priority prefix, no time, no PID."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        prefix = journal_prefix(record.levelno) or "<6>"
        # One entry per line: a traceback's lines would otherwise each be a priority-6 entry.
        return "\n".join(prefix + line for line in super().format(record).splitlines())


class _TerminalHandler(logging.StreamHandler):
    """``bundlefs: warning: …`` on stderr, clearing a progress line first so they do not mix."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(message)s"))

    def format(self, record: logging.LogRecord) -> str:
        record = logging.makeLogRecord(record.__dict__)
        record.levelname = record.levelname.lower()
        return journal_prefix(record.levelno) + super().format(record)

    def emit(self, record: logging.LogRecord) -> None:
        status.clear()
        super().emit(record)


LogTarget = Literal["terminal", "stderr", "syslog"]


def setup_logging(
    target: LogTarget = "terminal", *, log_file: str | None = None, debug: bool = False
) -> None:
    """Where log records go; the one logging setup of every command.

    - ``terminal``: every command (and ``mount`` until it serves): bundlefs's warnings and errors
      as ``bundlefs: warning: …`` on stderr;
    - ``stderr``: a mount serving in the foreground: INFO and up (DEBUG with ``debug``) of every
      logger, timestamped, to ``log_file`` if set, else to stderr (to journald under systemd:
      priority-prefixed, without the time and PID the journal adds);
    - ``syslog``: the detached mount daemon: the same, to ``log_file`` if set, else to syslog
      (nowhere without ``/dev/log``).
    """
    logger = logging.getLogger("bundlefs")
    if target == "terminal":
        if not any(isinstance(h, _TerminalHandler) for h in logger.handlers):
            logger.addHandler(_TerminalHandler())
        logger.setLevel(logging.WARNING)
        logger.propagate = False
        return
    logger.handlers[:] = [h for h in logger.handlers if not isinstance(h, _TerminalHandler)]
    logger.setLevel(logging.NOTSET)
    logger.propagate = True
    fmt = "%(asctime)s bundlefs[%(process)d] %(levelname)s %(name)s: %(message)s"
    if log_file:
        handler: logging.Handler = logging.FileHandler(log_file)
    elif target == "stderr":
        handler = logging.StreamHandler(sys.stderr)
        if stderr_is_journal():
            handler.setFormatter(_JournalFormatter())
            _install(handler, debug)
            return
    elif os.path.exists("/dev/log"):
        from logging.handlers import SysLogHandler

        # The syslog tag ("bundlefs[PID]:"), which journald parses into SYSLOG_IDENTIFIER and
        # SYSLOG_PID; the handler sends each record's priority as <PRI>, and the time is the
        # receiver's.
        handler = SysLogHandler("/dev/log")
        fmt = "bundlefs[%(process)d]: %(levelname)s %(name)s: %(message)s"
    else:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter(fmt))
    _install(handler, debug)


def _install(handler: logging.Handler, debug: bool) -> None:
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
