"""Human-readable byte sizes: parsing ``256K``, ``1GiB``, ``4GB`` and formatting them back.

May import: the standard library, ``bundlefs.errors``.
"""

from __future__ import annotations

import re

from bundlefs.errors import SizeError

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1000**4, "tib": 1024**4,
}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


_LARGEST = 2**63  # an off_t: no size bundlefs takes can be larger


def parse_size(text: str | int) -> int:
    """Bytes from ``"256K"``, ``"1GiB"``, ``"4GB"`` or a plain number (K/M/G alone are binary).

    The one size parser of every command and option; raises ``SizeError`` (a usage error).
    """
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    if not match or match.group(2).lower() not in _UNITS:
        raise SizeError(f"invalid size {text!r} (examples: 4096, 256K, 512MiB, 4GB)")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value >= _LARGEST:  # else int() of an infinite float is an OverflowError traceback
        raise SizeError(f"size {text!r} is too large")
    return int(value)


def format_size(n: float) -> str:
    """``1536`` → ``1.5 KiB``: bytes in binary units, as every command prints them."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
