"""Which implementation of the hottest read steps this process runs: the compiled
``bundlefs.storage._native`` (``_native.pyx``: a plain file's entry decode and a listing's file
attributes, a directory's binary search, a record lookup, lz4 into a buffer of ours, a pack on a
base's two loops per unchanged file) where it is built and current, else ``None`` and the
pure-Python code.

The compiled module has a name no ``.py`` file has, so it never shadows Python source; and a
stale build cannot serve silently: it carries the SHA-256 of the ``.pyx`` it was built from, and
where that source sits beside it (a checkout) and differs, it is not used and a warning says how
to rebuild (``make install``; its stamp depends on the ``.pyx``). ``BUNDLEFS_NO_NATIVE=1`` turns
it off (for comparing both paths). Each compiled step returns a result only where every check of
the Python path passes and ``None`` otherwise, so the functions below (what ``IndexReader`` and
``IndexPageGuard`` call) fall back to the Python path, which decodes the rest and raises the same
errors as without it.

May import: the standard library, ``lmdb``, ``lz4``, ``bundlefs.core``, ``bundlefs.errors``,
``bundlefs.storage._native``.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import lmdb
import lz4.block

from bundlefs.core import format as fmt
from bundlefs.core.format import pages as lp
from bundlefs.errors import FormatError

END = b"\xff" * 512  # index_check.END: above every LMDB key (at most 511 bytes)

log = logging.getLogger(__name__)

DISABLE_ENV = "BUNDLEFS_NO_NATIVE"
SOURCE = os.path.join(os.path.dirname(__file__), "_native.pyx")


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(DISABLE_ENV):
        return None, f"turned off ({DISABLE_ENV} is set)"
    try:
        # By name: the compiled module is no node of the import graph (tests/unit/test_layering)
        _native = importlib.import_module("bundlefs.storage._native")
    except ImportError as e:
        if e.name == "bundlefs.storage._native":
            return None, "not built (pure Python)"
        log.warning("bundlefs.storage._native cannot be loaded (%s): using the Python path", e)
        return None, f"unloadable: {e}"
    if os.path.exists(SOURCE):  # a checkout (a wheel carries no .pyx)
        import hashlib  # here: only a checkout's mount pays for OpenSSL's import (~4 ms)

        built = getattr(_native, "SOURCE_SHA256", "")
        with open(SOURCE, "rb") as f:
            current = hashlib.sha256(f.read()).hexdigest()
        if current != built:
            reason = f"stale: {_native.__file__} was built from another {os.path.basename(SOURCE)}"
            log.warning("%s; using the pure-Python path (make install rebuilds it)", reason)
            return None, reason
    return _native, "compiled"


module, status = _load()


def _bind_lz4() -> bool:
    """Point the compiled lz4 steps at the lz4 that python-lz4 carries (its compiled module,
    loaded by the import above); False where that module cannot be found or lacks them."""
    library = getattr(getattr(lz4.block, "_block", None), "__file__", None)
    if module is None or not library:
        return False
    return bool(module.bind_lz4(os.fsencode(library)))


lz4_compiled = _bind_lz4()
if module is not None and not lz4_compiled:  # the index steps run compiled, lz4 as before
    status = "compiled; lz4 through python-lz4 (its module exports no lz4 block API)"


def lz4_decompress(stored: bytes, length: int, upto: int) -> bytes | None:
    """Exactly the first ``upto`` of the ``length`` bytes the lz4 block ``stored`` holds, or all
    of them (exactly ``length``) when ``upto >= length`` or the lz4 cannot stop early (before
    1.9.2), decompressed straight into the bytes returned; None where the compiled step is not
    here or lz4 finds the block malformed or short (the caller then decompresses with
    python-lz4, which reports it)."""
    if not lz4_compiled or type(stored) is not bytes:  # a store's other buffer: python-lz4
        return None
    return module.lz4_decompress(stored, length, upto)  # type: ignore[union-attr]


def lz4_decompress_into(stored: bytes, view: memoryview) -> bool:
    """Decompress the lz4 block ``stored`` into ``view``, which it fills exactly; False where the
    compiled step is not here or the block does not fill it (the caller takes the other path)."""
    if not lz4_compiled or type(stored) is not bytes:
        return False
    return bool(module.lz4_decompress_into(stored, view))  # type: ignore[union-attr]


def decode_entry(ino: int, value: bytes, version: int) -> fmt.Entry:
    """``fmt.decode_entry``: compiled for a plain file of version 3 or later (it declines the
    rest, and what fails a check, which the Python decoder then reports)."""
    entry = None if module is None else module.decode_file(fmt.Entry, ino, value, version)
    return fmt.decode_entry(ino, value, version) if entry is None else entry


def file_stats(
    values: list[bytes], first: int, version: int, owners: list[tuple[int, int]], types: int
) -> tuple[list[bytes], list[Any], list[int]] | None:
    """A listing's names and stat tuples of children ``first …`` from their entry ``values``:
    each plain file's compiled, checked as ``IndexReader.entry`` checks it (``types``: how many
    content types there are), the others left for a full decode (their positions, third); None
    where the compiled step is not here."""
    if module is None:
        return None
    return module.file_stats(values, first, version, owners, types)


def find_child(
    txn: lmdb.Transaction,
    guard: Any,
    get: Callable[[Any, bytes, str], bytes],
    db: Any,
    first: int,
    count: int,
    name: bytes,
    version: int,
) -> int | None:
    """The inode among ``first … first+count−1`` (a directory's children, in name order) named
    ``name``, or None: a binary search of raw names. ``guard`` is the index's page checks
    (``index_check``: ``key`` before each read, ``route`` what tells a checked path);
    ``get(db, key, what)`` is the reader's checked read (the Python path)."""
    if module is not None:
        route = guard.route(db)  # None: nothing to check
        check, paths, root, depth = (None, None, 0, 0) if route is None else (guard.key, *route)
        try:
            found = module.find_child(
                txn.get, check, paths, root, depth, db, first, count, name, fmt.entry_name, version
            )
        except lmdb.Error as e:
            raise FormatError(f"index is damaged reading entry: {e}") from None
        if found is not None:
            return found or None
    lo, hi = first, first + count - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = fmt.entry_name(get(db, fmt.entry_key(mid), "entry"), version)
        if candidate == name:
            return mid
        if candidate < name:
            lo = mid + 1
        else:
            hi = mid - 1
    return None


def record_at(
    cursor: lmdb.Cursor,
    key: bytes,
    shard: int,
    offset: int,
    config: fmt.Config,
    codecs: dict[int, int],
) -> fmt.Record | None:
    """``IndexReader.record_at``'s compiled path, where built and the shard's codec is known
    (``codecs``, from version 3 on), or None: the Python path then finds (or reports) the
    record. LMDB's errors are the caller's to report."""
    codec = codecs.get(shard)
    if module is None or (codec is None and config.format_version >= 3):
        return None
    found = module.find_record(cursor, key, shard, offset)
    if found is None:
        return None
    compressed = (config.record_codec if codec is None else codec) != fmt.COMPRESSION_NONE
    record: fmt.Record | None = module.decode_record(
        fmt.Record, shard, found[0], found[1], config.record_size, config.block_size, compressed
    )
    return record if record is not None and offset < record.end else None


def tree_page(data: bytes, pgno: int, last_pg: int) -> lp.TreePage:
    """``pages.tree_page`` of a page outside the main database (a leaf costs ~0.2 ms in
    Python, and every worker decodes each leaf it reaches once)."""
    page = None if module is None else module.tree_page(lp.TreePage, data, pgno, last_pg)
    return lp.tree_page(data, pgno, last_pg) if page is None else page


def base_files(
    values: list[bytes],
    first: int,
    version: int,
    settled_before: int,
    shard_count: int,
    types: list[Any],
    owner_count: int,
    old: dict,
    copyable: dict,
) -> list[int] | None:
    """A pack on a base's parse of a directory's entry ``values`` (inodes ``first …``) into
    ``old`` and ``copyable`` (``DeltaSource._old_children`` says what goes where), compiled; the
    positions of the values it left for the caller to name (``fmt.entry_name``), or None where
    the compiled step is not here (the caller's loop then does it all)."""
    if module is None:
        return None
    args = (values, first, version, settled_before, shard_count, types, owner_count)
    return module.base_files(*args, old, copyable)


def known_files(
    dir_fd: int, children: list[tuple[bytes, bytes]], known: Any
) -> tuple[list[Any], list[tuple[bytes, bytes]]] | None:
    """A pack on a base's lstat of ``children`` ((name, rel) of the directory open at
    ``dir_fd``) against what ``known`` holds of them (``DirectorySource.probed_known``),
    compiled, the GIL released around the calls: (the matching files as (rel, name, stat,
    reuse), the others as (name, rel)); None where the compiled step is not here."""
    if module is None:
        return None
    return module.known_files(dir_fd, children, known)


def checked_paths(data: Any, sound: bytearray, page_size: int) -> Any:
    """A ``CheckedPaths`` (_native.pyx) over the mapped index ``data`` and the page guard's
    bitmap ``sound``, or None without the compiled module (the guard then walks in Python)."""
    return None if module is None else module.CheckedPaths(data, sound, page_size)
