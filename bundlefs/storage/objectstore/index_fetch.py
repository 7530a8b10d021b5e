"""The index of a bundle on an object store, in a local cache: ``fetch_index``, ``open_index``
(its ``IndexReader``), and ``fetch_marker`` (the bundle's ``COMPLETE`` as the store holds it now).

The bundle's ``COMPLETE`` is fetched on every open. Up to format version 5 its ``index/data.mdb``
is fetched whole, once, into a local cache directory keyed by the bundle id and checked against
the marker's size and CRC32C before use. From version 6 only the page table and the index's
first pages are (``index_pages``): the rest comes page by page as lookups need it, each page
checked against the table, so an open costs the same at any size. A cached copy is used only
when its marker is byte for byte the remote one; a remote index that does not match its marker
(changed or damaged) is refused, never mixed with a cached one.

Cache layout (``CACHE`` is the ``cache_dir`` given, else ``default_cache_dir()``)::

    CACHE/index/<bundle id hex>/COMPLETE, CACHE/index/<bundle id hex>/index/data.mdb

May import: the standard library, ``bundlefs.core``, ``bundlefs.errors``,
``bundlefs.storage.{location, marker, index}``, ``bundlefs.storage.objectstore.{client,
fetcher, disk_cache, index_pages}``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c, file_checksum
from bundlefs.core.format.pages import FIRST_PAGE_CHECK_VERSION
from bundlefs.errors import (
    BundleError,
    FormatError,
    IncompleteBundleError,
    NotABundleError,
    StorageError,
)
from bundlefs.storage.index import IndexReader
from bundlefs.storage.location import Location
from bundlefs.storage.marker import read_marker
from bundlefs.storage.objectstore.client import (
    DEFAULT_STORE_TIMEOUT,
    error_reason,
    is_denied,
    profile_of,
    remote_filesystem,
)
from bundlefs.storage.objectstore.disk_cache import default_cache_dir
from bundlefs.storage.objectstore.fetcher import Fetcher
from bundlefs.storage.objectstore.index_pages import (
    ChangedIndex,
    IndexRanges,
    fill_whole,
    make_sparse_copy,
    sparse_copy_ok,
)

log = logging.getLogger(__name__)

INDEX_CHUNK = 8 * 1024 * 1024


def _fetcher(location: Location, timeout: float, filesystem: Any = None) -> Fetcher:
    # No outage warnings: a failed open is its own sentence.
    return Fetcher(
        (lambda: filesystem)
        if filesystem is not None
        else lambda: remote_filesystem(location, timeout),
        location.url,
        log_outages=False,
        timeout=timeout,
    )


def _open_error(location: Location, fs: Any, e: Exception) -> BundleError:
    """The one sentence for an open that failed on ``COMPLETE``."""
    if isinstance(e, FileNotFoundError):
        return _missing_marker(location, fs)
    if is_denied(e):
        return StorageError(
            f"{location.url}: access denied ({error_reason(e)}); check the credentials "
            "(--storage-option key=… secret=…, the environment or a profile)"
        )
    return StorageError(f"cannot read {location.url}: {error_reason(e)}")


def _missing_marker(location: Location, fs: Any) -> NotABundleError:
    """Why there is no ``COMPLETE``: no bucket, nothing there, or an upload that never finished
    (told apart by a listing, where the store has one)."""
    if not profile_of(location).lists:
        return NotABundleError(f"{location.url} is not a bundle (no completion marker)")
    try:
        names = [n.rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(location.path, detail=False)]
    except Exception:  # listing is only for a better sentence
        names = []
    if fmt.INDEX_DIR in names or any(n.startswith(fmt.SHARD_PREFIX) for n in names):
        return IncompleteBundleError(
            f"{location.url} is an incomplete bundle (no completion marker: was the upload "
            "killed?); nothing opens it, and a pack to that URL replaces it"
        )
    if names:
        return NotABundleError(f"{location.url} is not a bundle (no completion marker)")
    bucket = location.path.split("/", 1)[0]
    with contextlib.suppress(Exception):
        if bucket != location.path and not fs.exists(bucket):
            return NotABundleError(f"{location.url}: the bucket {bucket} does not exist")
    return NotABundleError(f"{location.url} does not exist")


def fetch_marker(location: Location, fetcher: Fetcher | None = None) -> bytes:
    """The bytes of ``location``'s ``COMPLETE``, fetched now (not decoded; at most one byte
    over its size).

    Raises ``NotABundleError`` (none there; ``IncompleteBundleError`` when shards or an index
    are there without it) or ``StorageError`` (unreachable, access denied), one sentence each.
    """
    if fetcher is None:
        fetcher = _fetcher(location, DEFAULT_STORE_TIMEOUT)
    try:
        # Ranged (a byte over the size, so a longer marker is seen): a web server that ignores
        # ranges is refused here, on every open, even when the index is cached.
        return fetcher.get(location.child(fmt.MARKER_NAME), 0, fmt.MARKER_SIZE + 1)
    except BundleError:
        raise  # one sentence already (an unknown protocol, a back-end not installed)
    except Exception as e:
        raise _open_error(location, fetcher.fs, e) from None


def _paged(marker: fmt.Marker) -> bool:
    """Whether the index is fetched page by page (version 6: it has a page table)."""
    return marker.format_version >= FIRST_PAGE_CHECK_VERSION


def _cached_index_ok(local: str, marker_bytes: bytes, marker: fmt.Marker, check: bool) -> bool:
    """Whether the cached copy at ``local`` is exactly this marker's index (from version 6 a
    sparse copy: its pages are checked as they are read)."""
    try:
        with open(os.path.join(local, fmt.MARKER_NAME), "rb") as f:
            if f.read(fmt.MARKER_SIZE + 1) != marker_bytes:
                return False
        if _paged(marker):
            return sparse_copy_ok(local, marker)
        path = os.path.join(local, fmt.INDEX_DIR, fmt.INDEX_FILE)
        if os.stat(path).st_size != marker.index_size:
            return False
        return not check or file_checksum(path)[0] == marker.index_crc32c
    except OSError:
        return False


def _remove_tree(path: str) -> None:
    """Remove a directory another process may be reading from: renamed away first, so nobody
    opens a half-removed copy."""
    doomed = f"{path}.removing-{os.urandom(8).hex()}"  # unique across hosts (a pid is not)
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


def _download_index(
    location: Location, fetcher: Fetcher, marker: fmt.Marker, tmp_index: str
) -> bool:
    """Stream the remote index into ``tmp_index``; whether it matches the marker's size and CRC."""
    url = location.child(f"{fmt.INDEX_DIR}/{fmt.INDEX_FILE}")
    value, pos = 0, 0
    with open(tmp_index, "wb") as out:
        while True:
            # One byte past the promised size: a longer remote index is a changed one.
            end = min(pos + INDEX_CHUNK, marker.index_size + 1)
            want = end - pos
            try:
                piece = fetcher.get(url, pos, end)
            except FileNotFoundError:
                raise FormatError(f"{location.url}: the index is missing") from None
            except OSError as e:
                raise StorageError(f"cannot fetch the index of {location.url}: {e}") from None
            out.write(piece)
            value = crc32c(piece, value)
            pos += len(piece)
            if len(piece) < want or pos > marker.index_size:
                break
        out.flush()
        os.fsync(out.fileno())
    return pos == marker.index_size and value == marker.index_crc32c


def fetch_index(
    location: Location,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    check: bool = True,
    fetcher: Fetcher | None = None,
    timeout: float = DEFAULT_STORE_TIMEOUT,
    whole: bool = False,
) -> str:
    """The local directory holding ``location``'s marker and index, fetched if not cached: from
    version 6 a sparse copy (open it with ``open_index``), with every page in it if ``whole``.

    ``check`` also verifies a cached whole copy's CRC32C (a download is always verified). Raises
    ``NotABundleError`` (no ``COMPLETE``; ``IncompleteBundleError`` when shards or an index are
    there without it), ``StorageError`` (unreachable, access denied), ``FormatError`` (the remote
    index does not match its marker: it was changed or damaged; it is refused).
    """
    if fetcher is None:
        fetcher = _fetcher(location, timeout)
    cache = os.fspath(cache_dir) if cache_dir else default_cache_dir()
    root = os.path.join(cache, "index")
    for attempt in range(2):
        marker_bytes = fetch_marker(location, fetcher)
        try:
            marker = fmt.decode_marker(marker_bytes, crc32c)
        except NotABundleError as e:
            raise NotABundleError(f"{location.url}: {e}") from None
        local = os.path.join(root, marker.bundle_id.hex())
        if _cached_index_ok(local, marker_bytes, marker, check):
            with contextlib.suppress(OSError):
                os.utime(local)  # last used: what a cleaner of old indexes would look at
        else:
            if os.path.exists(local):
                log.warning(
                    "%s: the cached index at %s is damaged; fetching it again", location.url, local
                )
                _remove_tree(local)
            if not _cache_index(
                location, fetcher, marker_bytes, marker, cache, local, retry=attempt == 0
            ):
                continue
        if whole and _paged(marker):
            fill_whole(location, fetcher, local, marker)
        return local
    raise FormatError(f"{location.url} keeps changing while it is opened; try again")


def _fetch_copy(location: Location, fetcher: Fetcher, marker: fmt.Marker, tmp: str) -> bool:
    """Fill the new directory ``tmp``: the whole index up to version 5, from version 6 its
    page table and first pages; False when the store's is not the marker's."""
    if not _paged(marker):
        return _download_index(
            location, fetcher, marker, os.path.join(tmp, fmt.INDEX_DIR, fmt.INDEX_FILE)
        )
    try:
        make_sparse_copy(location, fetcher, marker, tmp)
    except ChangedIndex as e:
        log.info("%s", e)
        return False
    return True


def open_index(
    location: Location,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    check: bool = True,
    timeout: float = DEFAULT_STORE_TIMEOUT,
    whole: bool = False,
    index_dir: str | None = None,
    filesystem: Any = None,
    outage: Callable[[], bool] | None = None,
) -> IndexReader:
    """The ``IndexReader`` of ``location``'s index in the local cache (``index_dir``: as
    ``fetch_index`` already returned it): from version 6 a sparse copy whose missing pages
    are fetched when a lookup needs them; a whole copy before (checked: no second CRC pass).
    ``filesystem``: the fsspec file system to fetch through (one the shard store shares saves
    a client and a connection); a child after ``fork()`` makes its own. ``outage``: whether
    the shard store knows the store is out (pages then fail at once)."""
    fetcher = _fetcher(location, timeout, filesystem)
    local = index_dir or fetch_index(
        location, cache_dir, check=check, fetcher=fetcher, timeout=timeout, whole=whole
    )
    marker = read_marker(local)
    if not _paged(marker):
        return IndexReader(local, check_checksum=False)
    ranges = IndexRanges(
        location, lambda: _fetcher(location, timeout), fetcher, marker.bundle_id, outage
    )
    return IndexReader(local, fetch=ranges)


def _cache_index(
    location: Location,
    fetcher: Fetcher,
    marker_bytes: bytes,
    marker: fmt.Marker,
    cache: str,
    local: str,
    *,
    retry: bool,
) -> bool:
    """Download the index into a temporary directory beside ``local`` and move it there; False
    when the marker changed meanwhile and ``retry`` allows starting over."""
    root = os.path.dirname(local)
    try:
        os.makedirs(root, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{marker.bundle_id.hex()}.tmp-", dir=root)
    except OSError as e:  # read-only, not ours, a file in the way, a full disk
        raise StorageError(
            f"cannot cache the index of {location.url} in the cache directory {cache}: "
            f"{e.strerror or e}"
        ) from None
    try:
        os.mkdir(os.path.join(tmp, fmt.INDEX_DIR))
        if not _fetch_copy(location, fetcher, marker, tmp):
            if retry and fetch_marker(location, fetcher) != marker_bytes:
                return False  # replaced between the marker and the index: start over once
            raise FormatError(
                f"{location.url}: the index does not match its completion marker (changed "
                "or damaged on the store); refusing it"
            )
        with open(os.path.join(tmp, fmt.MARKER_NAME), "wb") as f:
            f.write(marker_bytes)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.rename(tmp, local)
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            # Another process cached it first: theirs is used if it is sound.
            if not _cached_index_ok(local, marker_bytes, marker, True):
                _remove_tree(local)
                os.rename(tmp, local)
        return True
    except OSError as e:
        raise StorageError(f"cannot cache the index of {location.url} in {root}: {e}") from None
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
