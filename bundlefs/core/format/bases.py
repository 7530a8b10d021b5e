"""Base bundles (version 6): the ``bases`` database, and the name a shard in a base is read by
(docs/format.md §3.5, §3.11).

A version-6 shard table may say that a shard's file is not in this bundle's own directory or
prefix but in base ``k``'s (the descriptor's ``base`` and ``base_shard``); key ``k`` of ``bases``
names that bundle: its bundle id and its location, relative to this bundle's or absolute.

May import: the standard library, ``bundlefs.errors``, ``bundlefs.core.format.constants``,
``bundlefs.core.format.keys``, ``bundlefs.core.format.records``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from bundlefs.core.format.keys import shard_filename
from bundlefs.core.format.records import ShardInfo
from bundlefs.errors import FormatError

_U16 = struct.Struct(">H")
BUNDLE_ID_SIZE = 16
MAX_BASE_LOCATION = 1024  # bytes of UTF-8
MAX_BASES = 2**16 - 1  # keys 1 … 65,535


@dataclass(frozen=True, slots=True)
class BaseRef:
    """A base bundle: its bundle id (its ``COMPLETE``'s) and where it is, as stored: relative to
    this bundle's location (``../old``) or an absolute URL."""

    bundle_id: bytes
    location: str


def base_key(number: int) -> bytes:
    """The ``bases`` key of base ``number`` (1 … 65,535)."""
    return _U16.pack(number)


def encode_base(base: BaseRef) -> bytes:
    location = base.location.encode()
    if len(base.bundle_id) != BUNDLE_ID_SIZE:
        raise FormatError("a base's bundle id is 16 bytes")
    if not 1 <= len(location) <= MAX_BASE_LOCATION or "\0" in base.location:
        raise FormatError(f"a base's location must be 1 to {MAX_BASE_LOCATION} bytes, no NUL")
    return base.bundle_id + location


def decode_base(number: int, key: bytes, value: bytes) -> BaseRef:
    """Base ``number``'s item (its key must be ``base_key(number)``: no gaps), validated."""
    if key != base_key(number):
        raise FormatError(f"the bases are not numbered 1 to n (base {number} is missing)")
    raw = value[BUNDLE_ID_SIZE:]
    if not 1 <= len(raw) <= MAX_BASE_LOCATION or b"\0" in raw:
        raise FormatError(f"base {number}'s location is not 1 to {MAX_BASE_LOCATION} bytes")
    try:
        location = raw.decode()
    except UnicodeDecodeError:
        raise FormatError(f"base {number}'s location is not UTF-8") from None
    return BaseRef(bytes(value[:BUNDLE_ID_SIZE]), location)


def store_name(shard: int, version: int, info: ShardInfo) -> str:
    """The name the read path asks its store for shard ``shard`` by: the shard file's name in
    this bundle (``shard-…``), or for a shard in base ``k``, ``k/shard-%08d`` of its
    ``base_shard`` (the shard store of that base reads it; storage/bases.py)."""
    if not info.base:
        return shard_filename(shard, version)
    return f"{info.base}/{shard_filename(info.base_shard)}"
