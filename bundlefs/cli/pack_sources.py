"""``bundlefs pack``'s SRC arguments: brace patterns the shell did not expand
(``'shards-{000..009}.tar'``), the ``--files-from`` list, and the background walk that sums a
source directory's bytes for the progress line's ETA.

May import: ``bundlefs.errors``.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import threading

from bundlefs.errors import PackError


class SourceTotals:
    """Bytes of regular files under the source, summed by a background walk for the ETA.

    Only when a progress line is shown; it never slows the pack itself (one thread of lstat).
    """

    def __init__(self, source: str) -> None:
        self.bytes = 0
        self.done = False
        threading.Thread(target=self._walk, args=(source,), daemon=True).start()

    def _walk(self, source: str) -> None:
        total = 0
        for top, _dirs, files in os.walk(source):
            for name in files:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(top, name))
                    if stat.S_ISREG(st.st_mode):
                        total += st.st_size
        self.bytes, self.done = total, True


_BRACES = re.compile(r"\{([^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """A shell brace pattern's words: ``{000..009}`` (zero padding kept), ``{a,b}``; the first
    group expands first, so the words come out in the shell's order."""
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    head, body, tail = pattern[: match.start()], match.group(1), pattern[match.end() :]
    numbers = re.fullmatch(r"(-?\d+)\.\.(-?\d+)", body)
    if numbers:
        first, last = numbers.group(1), numbers.group(2)
        width = max(len(first), len(last)) if first.startswith("0") or last.startswith("0") else 0
        a, b = int(first), int(last)
        step = 1 if b >= a else -1
        words = [str(n).zfill(width) for n in range(a, b + step, step)]
    elif "," in body:
        words = body.split(",")
    else:
        return [head + "{" + body + "}" + word for word in expand_braces(tail)]
    return [w for word in words for w in expand_braces(head + word + tail)]


def expand_sources(sources: list[str]) -> list[str]:
    """SRC arguments with brace patterns the shell did not expand (quoted ones) expanded; a path
    that exists is taken as it is, braces and all."""
    out: list[str] = []
    for source in sources:
        out += [source] if source == "-" or os.path.lexists(source) else expand_braces(source)
    return out


def read_files_from(source: str, null: bool) -> list[bytes]:
    """The paths a ``--files-from`` list names (a file, or ``-``: stdin): one a line (``\r\n``
    too), or NUL-separated with ``null``; empty ones (a trailing separator) left out."""
    try:
        if source == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(source, "rb") as f:
                data = f.read()
    except OSError as e:
        raise PackError(f"cannot read the list {source}: {e.strerror or e}") from None
    return [item for item in (data.split(b"\0") if null else data.splitlines()) if item]
