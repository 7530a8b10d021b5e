"""Reading a bundle that lives on an object store: the index fetch and ``RemoteShardStore``.

Two things, both over the fsspec file system of a remote ``Location`` (storage/location.py):

- ``fetch_index``: the bundle's ``COMPLETE`` is fetched on every open; its ``index/data.mdb`` is
  fetched once into a local cache directory keyed by the bundle id and checked against the
  marker's size and CRC32C before use. A cached copy is used only when its marker is byte for
  byte the remote one; a remote index that does not match its marker (changed or damaged) is
  refused, never mixed with a cached one. The local directory then opens with ``IndexReader``.
- ``RemoteShardStore``: the ``ShardStore`` (storage/store.py) of a remote bundle. Ranged GETs
  through a ``Fetcher``: each bounded by the store timeout (``--store-timeout``), quick failures
  retried with backoff within it, then ``OSError(EIO)`` (the caller makes it the
  ``CorruptDataError`` of the record). The first GET that stalls or gives up declares an
  *outage*: later GETs fail at once until a background probe is answered, with one WARNING when
  it starts, one INFO when it ends, and the files whose reads failed named in a line at most
  every 10 s (``failed_read``; storage/objectstore/outage.py). Fetched ranges are kept in a
  small memory tier and a bounded on-disk cache that survives restarts (under
  ``ContentReader``'s decoded-record cache). Sequential streams are found from the reads'
  positions, whatever their size, and read ahead with several ranged GETs at once in a window
  that grows to 32 MiB (storage/objectstore/readahead.py); other reads fetch only what they
  touch. Threads asking for bytes a GET in flight will bring wait for it (single-flight).
  ``nowait`` answers only from the caches.

The store never checks record CRCs (``ShardSet`` does, on every record: the store declares
``partial_reads_cheap = False`` so the reader always loads whole records) and offers
``discard`` so that a cached range failing its CRC is dropped and fetched again once.

Cache layout (``CACHE`` is ``disk_cache`` or ``default_cache_dir()``)::

    CACHE/index/<bundle id hex>/COMPLETE, CACHE/index/<bundle id hex>/index/data.mdb
    CACHE/records/<bundle id hex>/<shard name>.<offset>.<length>   (stored bytes of the shard)

May import: the standard library, ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``;
fsspec only through ``bundlefs.storage.location`` (lazily: it is an optional extra).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import errno
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c, file_checksum
from bundlefs.errors import (
    BundleClosedError,
    BundleError,
    FormatError,
    IncompleteBundleError,
    NotABundleError,
    ShardUnavailable,
    StorageError,
    WouldBlock,
)
from bundlefs.storage.location import Location
from bundlefs.storage.objectstore.outage import FailedRead, FailedReads
from bundlefs.storage.objectstore.readahead import ReadAheadPolicy, ReadAheadSettings, Stream

log = logging.getLogger(__name__)

ENV_CACHE_DIR = "BUNDLEFS_CACHE_DIR"
DEFAULT_DISK_CACHE_SIZE = 1024 * 1024 * 1024
# One GET asks for at most this much when access is sequential: large enough that per-request
# latency (~10-50 ms on S3) stops dominating, small enough that a wrong guess costs little.
DEFAULT_COALESCE = 8 * 1024 * 1024
# Fetched ranges held in memory (read-ahead pieces are mostly read right after they arrive);
# half as much again may be in flight ahead of sequential readers: the store's memory bound.
MEMORY_TIER = 64 * 1024 * 1024
READ_AHEAD_THREADS = 4  # read-ahead GETs at once: a stream's window is ~4 pieces
# Retries of quick failures: up to 4 attempts, 0.2 + 0.4 + 0.8 s apart, all within the store
# timeout; a stalled attempt is not retried (Fetcher).
ATTEMPTS = 4
BACKOFF = 0.2
BACKOFF_MAX = 2.0
# Bounded network waits: botocore's defaults (60 s read timeout, 5 retries of its own under
# s3fs's own 5) would hang a read for minutes before our bound even starts. The store timeout
# (--store-timeout) bounds what the first reader of an outage waits; later ones fail at once
# until a probe, one per PROBE_INTERVAL, is answered.
CONNECT_TIMEOUT = 5
DEFAULT_STORE_TIMEOUT = 20.0
PROBE_INTERVAL = 2.0
INDEX_CHUNK = 8 * 1024 * 1024
_TMP_MAX_AGE = 3600.0  # a temporary file older than this was left by a dead process
_S3 = ("s3", "s3a")
# Credential failures botocore raises before sending anything: retrying cannot help.
_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}


def default_cache_dir() -> str:
    """``$BUNDLEFS_CACHE_DIR``, else ``$XDG_CACHE_HOME/bundlefs``, else ``~/.cache/bundlefs``."""
    explicit = os.environ.get(ENV_CACHE_DIR)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bundlefs")


def check_store_timeout(seconds: float) -> float:
    """``seconds`` if it is a usable store timeout, else ``StorageError`` in one sentence."""
    if not 0 < seconds <= 3600:  # also refuses NaN
        raise StorageError(
            f"the store timeout must be more than 0 and at most 3600 seconds, not {seconds}"
        )
    return float(seconds)


def remote_filesystem(location: Location, timeout: float = DEFAULT_STORE_TIMEOUT) -> Any:
    """A private fsspec file system for ``location`` with bounded network waits.

    Private (not fsspec's shared instance): its retry settings are ours, and a writer in the same
    process keeps its own. For S3 the back-end's retries are turned off and ours (``Fetcher``)
    are the only ones, and its read timeout is the store timeout, so the bound is one number;
    the user's own settings (``config_kwargs``) win where given.
    """
    options = dict(location.storage_options)
    if location.protocol in _S3:
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", min(CONNECT_TIMEOUT, timeout))
        config.setdefault("read_timeout", timeout)
        config.setdefault("retries", {"total_max_attempts": 1})
        options["config_kwargs"] = config
    options["skip_instance_cache"] = True
    fs = dataclasses.replace(location, storage_options=options).filesystem()
    if location.protocol in _S3 and isinstance(getattr(fs, "retries", None), int):
        fs.retries = 1  # s3fs's own loop (5 tries on timeouts): ours replaces it
    return fs


def error_reason(e: BaseException) -> str:
    """A back-end's error on one line (botocore's can span several), at most 200 characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def is_fatal(e: Exception) -> bool:
    """Errors no retry can fix: missing objects, refusals, our own bugs, and our own sentences
    (the file system could not be made: an unknown protocol, a back-end not installed)."""
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return True
    if isinstance(e, BundleError):
        return True
    if type(e).__name__ in _NO_CREDENTIALS:
        return True
    return isinstance(e, (TypeError, ValueError, AttributeError)) and not isinstance(e, OSError)


def is_denied(e: Exception) -> bool:
    return isinstance(e, PermissionError) or type(e).__name__ in _NO_CREDENTIALS


class Fetcher:
    """Ranged GETs with retries and backoff, counters, and the store's outage state.

    Every GET is bounded by ``timeout`` (the store timeout, ``--store-timeout``): retries of
    quick failures (a refused connection, a 503) stop when the next one would start past it,
    and an attempt that stalls for the whole timeout (a store that accepts connections and
    never answers) is not retried. Either way the store is then *in an outage*: every later
    GET fails at once, without touching the network, until a background probe (one small GET
    every ``probe_interval`` seconds, with ``probe=True``) is answered. So a hung store costs
    the first reader one timeout, and every other uncached read (the kernel's retry of a failed
    read-ahead among them) fails in a moment instead of waiting its own timeout. One WARNING
    when an outage starts, one INFO when it ends.
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        label: str,
        *,
        attempts: int = ATTEMPTS,
        backoff: float = BACKOFF,
        log_outages: bool = True,
        timeout: float = DEFAULT_STORE_TIMEOUT,
        probe: bool = False,
        probe_interval: float = PROBE_INTERVAL,
    ) -> None:
        # Made on first use: after a fork the child must not touch the parent's network session,
        # and fsspec resets its event loop in the child only after our at-fork hook has run.
        self._factory = factory
        self._fs: Any = None
        self.label = label  # the bundle's URL, for the log
        # Off while a bundle is opened: a failed open is its own sentence, and a warning that
        # reads "fail with EIO until it is back" describes a bundle that is open and serving.
        self.log_outages = log_outages
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.timeout = timeout
        self.probe = probe
        self.probe_interval = probe_interval
        self.lock = threading.Lock()
        self.counters = {
            "requests": 0,
            "bytes_fetched": 0,
            "retries": 0,
            "failures": 0,
            "failed_fast": 0,
            "probes": 0,
        }
        self.outage = False
        self.outage_since = 0.0  # time.monotonic() of the outage's start
        self._outage_url = ""
        self._failed_during_outage = 0
        self._closed = threading.Event()
        # Called (outside the lock) when an outage ends, e.g. to log what is still unreported.
        self.on_recovered: Callable[[], None] | None = None

    @property
    def fs(self) -> Any:
        if self._fs is None:
            with self.lock:
                if self._fs is None:
                    self._fs = self._factory()
        return self._fs

    def close(self) -> None:
        self._closed.set()

    def get(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``start … end`` of ``url`` (all of it without a range); short past the end.

        Raises ``FileNotFoundError`` (no such object), ``PermissionError`` (refused) or
        ``OSError(EIO)`` naming the reason: after the retry bound, or at once in an outage of
        a probed store.
        """
        where = f"bytes {start}-{end} of {url}" if start is not None else url
        if self.outage and self.probe:
            with self.lock:
                self.counters["failed_fast"] += 1
                self._failed_during_outage += 1
            raise OSError(
                errno.EIO,
                f"cannot fetch {where}: the object store has not answered for "
                f"{time.monotonic() - self.outage_since:.0f} s (outage; not retried until it "
                "answers again)",
            )
        first = time.monotonic()
        deadline = first + self.timeout
        last: Exception | None = None
        attempt = 0
        while True:
            if attempt:
                pause = min(self.backoff * 2 ** (attempt - 1), BACKOFF_MAX)
                if time.monotonic() + pause >= deadline:
                    break  # the next attempt would start past the store timeout
                time.sleep(pause)
                self._count("retries")
            attempt += 1
            self._count("requests")
            began = time.monotonic()
            try:
                data = self.fs.cat_file(url, start=start, end=end)
            except OSError as e:
                if e.errno == errno.EINVAL and start is not None and "range" in str(e).lower():
                    self._recovered()
                    return b""  # the range starts past the end: the object is shorter
                if is_fatal(e):
                    raise
                last = e
            except Exception as e:
                if is_denied(e):
                    raise PermissionError(errno.EACCES, error_reason(e)) from None
                if is_fatal(e):
                    raise
                last = e
            else:
                self._count("bytes_fetched", len(data))
                self._recovered()
                return bytes(data)
            # A stall is not retried: another wait as long would double the reader's.
            if is_stall(last, time.monotonic() - began, self.timeout):
                break
            if attempt >= self.attempts or self.outage:
                break
        assert last is not None
        self._gave_up(url, last, first)
        raise OSError(
            errno.EIO,
            f"cannot fetch {where} after {attempt} attempt(s): {error_reason(last)}",
        )

    def _count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counters[key] += n

    def _gave_up(self, url: str, e: Exception, since: float) -> None:
        with self.lock:
            self.counters["failures"] += 1
            if self._closed.is_set():
                return  # a read-ahead still in flight when its reader closed: nobody to tell
            if self.outage:
                self._failed_during_outage += 1
                return
            self.outage = True
            self.outage_since = since  # when the fetch that found it began
            self._outage_url = url
            self._failed_during_outage = 1
        if self.probe:
            threading.Thread(target=self._probe_loop, name="bundlefs-probe", daemon=True).start()
        if not self.log_outages:
            return
        until = (
            f"at once until it answers again (checked every {self.probe_interval:g} s)"
            if self.probe
            else "until it is back"
        )
        log.warning(
            "%s: the object store is unreachable (%s); reads of records not cached fail with "
            "EIO %s",
            self.label,
            error_reason(e),
            until,
        )

    def _probe_loop(self) -> None:
        """One small GET per interval until one is answered (the outage then ends)."""
        url = self._outage_url
        # Until the outage ends, by this probe or by any other GET that is answered (a later
        # outage starts a prober of its own).
        while self.outage and not self._closed.wait(self.probe_interval):
            self._count("probes")
            try:
                self.fs.cat_file(url, start=0, end=1)
            except Exception as e:
                # An answer, even "no such object" or "denied", is a store that answers.
                if not (is_fatal(e) or isinstance(e, PermissionError)):
                    continue
            self._recovered()
            return

    def _recovered(self) -> None:
        if self.outage:  # an unlocked peek: the common case costs nothing
            self._end_outage()

    def _end_outage(self) -> None:
        with self.lock:
            if not self.outage:
                return  # another thread ended it
            self.outage = False
            failed = self._failed_during_outage
            seconds = time.monotonic() - self.outage_since
        if self.on_recovered is not None:
            self.on_recovered()
        if self.log_outages:
            log.info(
                "%s: the object store answers again after %.0f s (%d fetches failed)",
                self.label,
                seconds,
                failed,
            )


def is_stall(e: Exception | None, seconds: float, timeout: float) -> bool:
    """Whether a failed attempt was the store not answering (a timeout), not a quick refusal."""
    if e is None:
        return False
    if seconds >= 0.8 * timeout or isinstance(e, TimeoutError):
        return True
    text = f"{type(e).__name__} {e}".lower()
    return "timeout" in text or "timed out" in text


# -- the index -------------------------------------------------------------------------------------


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
    """Why there is no ``COMPLETE``: no bucket, nothing there, or an upload that never finished."""
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


def _fetch_marker(location: Location, fetcher: Fetcher) -> bytes:
    try:
        return fetcher.get(location.child(fmt.MARKER_NAME))
    except BundleError:
        raise  # one sentence already (an unknown protocol, a back-end not installed)
    except Exception as e:
        raise _open_error(location, fetcher.fs, e) from None


def _cached_index_ok(local: str, marker_bytes: bytes, marker: fmt.Marker, check: bool) -> bool:
    """Whether the cached copy at ``local`` is exactly this marker's index."""
    try:
        with open(os.path.join(local, fmt.MARKER_NAME), "rb") as f:
            if f.read(fmt.MARKER_SIZE + 1) != marker_bytes:
                return False
        path = os.path.join(local, fmt.INDEX_DIR, fmt.INDEX_FILE)
        if os.stat(path).st_size != marker.index_size:
            return False
        return not check or file_checksum(path)[0] == marker.index_crc32c
    except OSError:
        return False


def _remove_tree(path: str) -> None:
    """Remove a directory another process may be reading from: renamed away first, so nobody
    opens a half-removed copy."""
    doomed = f"{path}.removing-{os.getpid()}-{threading.get_ident()}"
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
) -> str:
    """The local directory holding ``location``'s marker and index, fetched if not cached.

    ``check`` also verifies a cached copy's CRC32C (a download is always verified). Raises
    ``NotABundleError`` (no ``COMPLETE``; ``IncompleteBundleError`` when shards or an index are
    there without it), ``StorageError`` (unreachable, access denied), ``FormatError`` (the remote
    index does not match its marker: it was changed or damaged; it is refused).
    """
    if fetcher is None:
        fetcher = Fetcher(
            lambda: remote_filesystem(location, timeout),
            location.url,
            log_outages=False,
            timeout=timeout,
        )
    cache = os.fspath(cache_dir) if cache_dir else default_cache_dir()
    root = os.path.join(cache, "index")
    for attempt in range(2):
        marker_bytes = _fetch_marker(location, fetcher)
        try:
            marker = fmt.decode_marker(marker_bytes, crc32c)
        except NotABundleError as e:
            raise NotABundleError(f"{location.url}: {e}") from None
        local = os.path.join(root, marker.bundle_id.hex())
        if _cached_index_ok(local, marker_bytes, marker, check):
            with contextlib.suppress(OSError):
                os.utime(local)  # last used: what a cleaner of old indexes would look at
            return local
        if os.path.exists(local):
            log.warning(
                "%s: the cached index at %s is damaged; fetching it again", location.url, local
            )
            _remove_tree(local)
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
            if not _download_index(
                location, fetcher, marker, os.path.join(tmp, fmt.INDEX_DIR, fmt.INDEX_FILE)
            ):
                if attempt == 0 and _fetch_marker(location, fetcher) != marker_bytes:
                    continue  # replaced between the marker and the index: start over once
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
            return local
        except OSError as e:
            raise StorageError(f"cannot cache the index of {location.url} in {root}: {e}") from None
        finally:
            if os.path.exists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
    raise FormatError(f"{location.url} keeps changing while it is opened; try again")


# -- cached ranges ---------------------------------------------------------------------------------


class _RangeIndex:
    """Which byte ranges of each shard are held: (start, length) pieces, found by bisection."""

    def __init__(self) -> None:
        self._starts: dict[str, list[int]] = {}
        self._lengths: dict[tuple[str, int], int] = {}

    def add(self, name: str, start: int, length: int) -> None:
        key = (name, start)
        if key not in self._lengths:
            bisect.insort(self._starts.setdefault(name, []), start)
        self._lengths[key] = length

    def remove(self, name: str, start: int) -> None:
        if self._lengths.pop((name, start), None) is None:
            return
        starts = self._starts[name]
        del starts[bisect.bisect_left(starts, start)]

    def length(self, name: str, start: int) -> int | None:
        return self._lengths.get((name, start))

    def find(self, name: str, pos: int) -> tuple[int, int] | None:
        """A piece holding byte ``pos``, as (start, stop)."""
        starts = self._starts.get(name)
        if not starts:
            return None
        i = bisect.bisect_right(starts, pos)
        # Pieces may overlap (a record fetched alone, then a window around it): look back a few.
        for j in range(i - 1, max(-1, i - 17), -1):
            start = starts[j]
            stop = start + self._lengths[(name, start)]
            if stop > pos:
                return start, stop
        return None

    def next_start(self, name: str, pos: int) -> int | None:
        """The first piece start at or after ``pos``."""
        starts = self._starts.get(name)
        if not starts:
            return None
        i = bisect.bisect_left(starts, pos)
        return starts[i] if i < len(starts) else None

    def overlapping(self, name: str, offset: int, end: int) -> list[int]:
        starts = self._starts.get(name, [])
        hi = bisect.bisect_left(starts, end)
        return [s for s in starts[max(0, hi - 17) : hi] if s + self._lengths[(name, s)] > offset]


def _assemble(
    index: _RangeIndex, name: str, offset: int, end: int, read: Callable[[int, int, int], bytes]
) -> bytes | None:
    """Bytes ``offset … end`` from held pieces (``read(piece_start, from, to)``), or None."""
    piece = index.find(name, offset)
    if piece is None:
        return None
    if piece[1] >= end:
        return read(piece[0], offset, end)
    parts, pos = [], offset
    while pos < end:
        piece = index.find(name, pos)
        if piece is None:
            return None
        stop = min(end, piece[1])
        parts.append(read(piece[0], pos, stop))
        pos = stop
    return b"".join(parts)


class _MemoryTier:
    """Recently fetched ranges in memory, LRU, bounded in bytes: a coalesced window is mostly
    read right after it arrives, and this avoids a file read for each of its records."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._data: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self.index = _RangeIndex()
        self._lock = threading.Lock()

    def get(self, name: str, offset: int, end: int) -> bytes | None:
        def read(start: int, lo: int, hi: int) -> bytes:
            data = self._data[(name, start)]
            self._data.move_to_end((name, start))
            return data if lo == start and hi - lo == len(data) else data[lo - start : hi - start]

        with self._lock:
            return _assemble(self.index, name, offset, end, read)

    def find(self, name: str, pos: int) -> tuple[int, int] | None:
        with self._lock:
            return self.index.find(name, pos)

    def next_start(self, name: str, pos: int) -> int | None:
        with self._lock:
            return self.index.next_start(name, pos)

    def put(self, name: str, start: int, data: bytes) -> None:
        if len(data) > self.limit or not data:
            return
        with self._lock:
            old = self._data.pop((name, start), None)
            if old is not None:
                self.bytes -= len(old)
            self._data[(name, start)] = data
            self.index.add(name, start, len(data))
            self.bytes += len(data)
            while self.bytes > self.limit:
                (old_name, old_start), old = self._data.popitem(last=False)
                self.index.remove(old_name, old_start)
                self.bytes -= len(old)

    def discard(self, name: str, offset: int, end: int) -> None:
        with self._lock:
            for start in self.index.overlapping(name, offset, end):
                self.bytes -= len(self._data.pop((name, start)))
                self.index.remove(name, start)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.index = _RangeIndex()
            self.bytes = 0


def _is_bundle_id(name: str) -> bool:
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


class DiskRecordCache:
    """Fetched shard ranges of one bundle as files, bounded in bytes across every bundle there.

    ``ROOT/<bundle id hex>/<shard>.<offset>.<length>``: a range is only ever served to the bundle
    whose id names its directory. Written atomically (temporary file, rename); no fsync, because
    a damaged file is caught by the record CRC above and dropped (``discard``). Least recently
    used goes first: a hit sets the file's mtime, and eviction (down to 90% of the bound, so it
    runs in batches) scans the whole directory.

    One bound for every reader of the directory (threads with bundles of their own, processes):
    each instance counts what the last scan found plus what it wrote since, and scans again (and
    evicts if the total is over the bound) at open and whenever it has written a tenth of the
    bound since its last scan. K readers writing at once overshoot by at most K tenths.

    The lock guards the in-memory index only: file reads, scans, sorts and unlinks happen
    outside it, so a ``nowait`` read (the mount's event loop) never waits for another thread's
    disk I/O, and takes the lock only if it is free.
    """

    def __init__(self, root: str, bundle_id: bytes, limit: int) -> None:
        self.root = root
        self.limit = limit
        self.dir = os.path.join(root, bundle_id.hex())
        self.index = _RangeIndex()
        self._lock = threading.Lock()
        self.bytes = 0  # the last scan's total plus what this instance wrote since
        self._written = 0  # bytes written since the last scan
        # The process scanning now (0: none). A pid, not a flag: a child forked during a scan
        # would otherwise never scan again.
        self._scanner = 0
        os.makedirs(self.dir, exist_ok=True)
        self._load()
        self._scanner = os.getpid()
        self._rescan()  # other readers may have left the directory over the bound

    def _load(self) -> None:
        now = time.time()
        for entry in os.scandir(self.dir):
            if entry.name.startswith("."):
                with contextlib.suppress(OSError):
                    if now - entry.stat().st_mtime > _TMP_MAX_AGE:
                        os.unlink(entry.path)  # a temporary file of a process that died
                continue
            parsed = self._parse(entry.name)
            if parsed is None:
                continue
            name, start, length = parsed
            old = self.index.length(name, start)
            if old is None or old < length:
                self.index.add(name, start, length)

    @staticmethod
    def _parse(filename: str) -> tuple[str, int, int] | None:
        name, _, rest = filename.partition(".")
        start, _, length = rest.partition(".")
        if not name.startswith(fmt.SHARD_PREFIX) or not start.isdigit() or not length.isdigit():
            return None
        return name, int(start), int(length)

    def _path(self, name: str, start: int, length: int) -> str:
        return os.path.join(self.dir, f"{name}.{start}.{length}")

    def _scan(self) -> list[tuple[float, int, str]]:
        out = []
        with contextlib.suppress(OSError):
            for top in os.scandir(self.root):
                if not _is_bundle_id(top.name) or not top.is_dir(follow_symlinks=False):
                    continue
                with contextlib.suppress(OSError):
                    for entry in os.scandir(top.path):
                        with contextlib.suppress(OSError):
                            st = entry.stat(follow_symlinks=False)
                            out.append((st.st_mtime, st.st_size, entry.path))
        return out

    def find(self, name: str, pos: int) -> tuple[int, int] | None:
        with self._lock:
            return self.index.find(name, pos)

    def next_start(self, name: str, pos: int) -> int | None:
        with self._lock:
            return self.index.next_start(name, pos)

    def get(self, name: str, offset: int, end: int, nowait: bool) -> bytes | None:
        """Bytes ``offset … end`` if held whole, else None. With ``nowait``, ``WouldBlock`` when
        the lock is taken or a file's pages are not in memory."""
        if not self._lock.acquire(blocking=not nowait):
            # Another thread is updating the index: only a moment, but the event loop does not
            # wait even that (the caller answers it as a miss that would block).
            raise WouldBlock
        try:
            # Which files hold the bytes, decided under the lock; read after it.
            pieces: list[tuple[str, int, int, int]] = []

            def plan(start: int, lo: int, hi: int) -> bytes:
                length = self.index.length(name, start)
                assert length is not None
                pieces.append((self._path(name, start, length), length, lo - start, hi - lo))
                return b""

            held = _assemble(self.index, name, offset, end, plan)
        finally:
            self._lock.release()
        if held is None:
            return None
        try:
            parts = [self._read(*piece, nowait) for piece in pieces]
        except FileNotFoundError:
            # Evicted by another reader, or left half written: forget what we knew of it.
            self._forget(name, offset, end)
            return None
        for path, *_ in pieces:
            with contextlib.suppress(OSError):
                os.utime(path)  # recently used: evicted last
        return parts[0] if len(parts) == 1 else b"".join(parts)

    @staticmethod
    def _read(path: str, length: int, at: int, size: int, nowait: bool) -> bytes:
        """``size`` bytes at ``at`` of the cache file ``path``, which must hold ``length``."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_size != length:
                raise FileNotFoundError(errno.ENOENT, "a partly written cache file", path)
            buffer = bytearray(size)
            if nowait:
                try:
                    got = os.preadv(fd, [buffer], at, os.RWF_NOWAIT)
                except OSError as e:
                    raise WouldBlock from e
            else:
                got = os.preadv(fd, [buffer], at)
            if got != len(buffer):
                raise FileNotFoundError(errno.ENOENT, "a short cache file", path)
        finally:
            os.close(fd)
        return bytes(buffer)

    def _forget(self, name: str, offset: int, end: int) -> None:
        """Drop from the index the pieces of these bytes whose files are gone."""
        with self._lock:
            pieces = [
                (s, self.index.length(name, s)) for s in self.index.overlapping(name, offset, end)
            ]
        gone = [
            (s, n)
            for s, n in pieces
            if n is not None and not os.path.exists(self._path(name, s, n))
        ]
        with self._lock:
            for start, length in gone:
                if self.index.length(name, start) == length:
                    self.index.remove(name, start)

    def put(self, name: str, start: int, data: bytes) -> None:
        """Keep ``data`` (stored bytes from ``start``); a failure to write only loses the copy."""
        if not data or len(data) > self.limit:
            return
        path = self._path(name, start, len(data))
        tmp = os.path.join(self.dir, f".{name}.{start}.{os.getpid()}.{threading.get_ident()}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as e:
            log.debug("cannot keep %s in the disk cache: %s", path, e)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return
        doomed = None
        with self._lock:
            old = self.index.length(name, start)
            if old == len(data):
                return  # the same range again (another process, or a retry): replaced in place
            if old is not None and old > len(data):
                doomed = path  # the longer copy already there serves more: keep it, drop this
            else:
                if old is not None:
                    doomed = self._path(name, start, old)
                    self.bytes -= old
                self.index.add(name, start, len(data))
                self.bytes += len(data)
                self._written += len(data)
            scan = self._scanner != os.getpid() and (
                self.bytes > self.limit or self._written > self.limit // 10
            )
            if scan:
                self._scanner = os.getpid()
        if doomed is not None:
            with contextlib.suppress(OSError):
                os.unlink(doomed)
        if scan:
            self._rescan()

    def _rescan(self) -> None:
        """Count what every reader holds now, and evict down to 90% of the bound if it is over
        (the caller has set ``_scanner``; outside the lock)."""
        try:
            with self._lock:
                written = self._written
            files = self._scan()
            total = sum(size for _mtime, size, _path in files)
            if total > self.limit:
                total = self._evict(files, total)
            with self._lock:
                # What this instance wrote during the scan may or may not be in it: counted.
                self._written -= written
                self.bytes = total + self._written
        finally:
            self._scanner = 0

    def _evict(self, files: list[tuple[float, int, str]], total: int) -> int:
        """Remove the least recently used of ``files`` until ``total`` is 90% of the bound;
        the total left."""
        target = self.limit * 9 // 10
        files.sort()
        doomed: list[tuple[int, str]] = []
        for _mtime, size, path in files:
            if total <= target:
                break
            doomed.append((size, path))
            total -= size
        mine = [
            parsed
            for _size, path in doomed
            if os.path.dirname(path) == self.dir
            and (parsed := self._parse(os.path.basename(path))) is not None
        ]
        with self._lock:  # out of the index first, so that no read here plans to read them
            for name, start, length in mine:
                if self.index.length(name, start) == length:
                    self.index.remove(name, start)
        for size, path in doomed:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass  # another reader evicting the same oldest files: gone all the same
            except OSError as e:
                log.debug("cannot evict %s from the disk cache: %s", path, e)
                total += size
        return total

    def discard(self, name: str, offset: int, end: int) -> None:
        with self._lock:
            doomed = []
            for start in self.index.overlapping(name, offset, end):
                length = self.index.length(name, start)
                self.index.remove(name, start)
                if length is not None:
                    doomed.append(self._path(name, start, length))
                    self.bytes -= length
        for path in doomed:
            with contextlib.suppress(OSError):
                os.unlink(path)


# -- the store -------------------------------------------------------------------------------------


class _Fetch:
    """One GET in flight: readers of bytes inside it wait for it instead of sending their own."""

    __slots__ = ("name", "start", "stop", "done", "data", "error", "background", "read_ahead")

    def __init__(self, name: str, start: int, stop: int, background: bool = False) -> None:
        self.name, self.start, self.stop = name, start, stop
        self.done = threading.Event()
        self.data = b""
        self.error: OSError | None = None
        self.background = background  # counted in the store's bytes in flight ahead
        self.read_ahead = False  # a sequential stream's piece: kept in memory only

    def slice(self, offset: int, end: int) -> bytes:
        if self.error is not None:
            raise OSError(self.error.errno, self.error.strerror, *self.error.args[2:])
        data = self.data
        if offset == self.start and end - offset >= len(data):
            return data
        return data[offset - self.start : end - self.start]


class RemoteShardStore:
    """The shard files of a bundle on an object store (a ``ShardStore``). Thread-safe.

    ``shard_sizes`` (shard file name → size, from the index) bounds read-ahead to the object;
    ``disk_cache`` is the cache root (``default_cache_dir()`` when None); ``disk_cache_size`` 0
    keeps nothing on disk; ``coalesce`` is the largest read-ahead GET (0: no read-ahead);
    ``memory`` bounds the fetched bytes held in memory (and half of it those in flight ahead of
    readers); ``store_timeout`` bounds each fetch (``Fetcher``). ``stats()`` gives the counters
    ``bundlefs info`` shows.
    """

    # Reading a slice of a raw record costs a round trip just as the whole record does, and only
    # a whole record can be CRC-checked: ContentReader must always load whole records.
    partial_reads_cheap = False
    # A read that misses the caches is a GET, with retries: the mount must not wait for one on
    # its event loop (a frozen store stalled every request for 80 s when it did).
    reads_may_stall = True

    def __init__(
        self,
        location: Location,
        bundle_id: bytes,
        *,
        shard_sizes: Mapping[str, int] | None = None,
        disk_cache: str | os.PathLike[str] | None = None,
        disk_cache_size: int | None = DEFAULT_DISK_CACHE_SIZE,
        coalesce: int = DEFAULT_COALESCE,
        memory: int = MEMORY_TIER,
        attempts: int = ATTEMPTS,
        backoff: float = BACKOFF,
        filesystem: Any = None,
        store_timeout: float = DEFAULT_STORE_TIMEOUT,
        probe_interval: float = PROBE_INTERVAL,
    ) -> None:
        self.location = location
        self._bundle_id = bundle_id
        self._sizes = dict(shard_sizes or {})
        self._attempts, self._backoff = attempts, backoff
        self._timeout, self._probe_interval = store_timeout, probe_interval
        self._filesystem = filesystem
        self._fetcher = self._new_fetcher()
        self._urls: dict[str, str] = {}
        self._memory = _MemoryTier(memory)
        size = DEFAULT_DISK_CACHE_SIZE if disk_cache_size is None else disk_cache_size
        root = self._cache_root = os.fspath(disk_cache) if disk_cache else default_cache_dir()
        self._disk: DiskRecordCache | None = None
        if size > 0:
            try:
                self._disk = DiskRecordCache(os.path.join(root, "records"), bundle_id, size)
            except OSError as e:  # an unwritable cache is a slower bundle, not a broken one
                log.warning("%s: no disk cache (%s): records are fetched every time", root, e)
        settings = ReadAheadSettings(max_piece=max(1, coalesce))
        if coalesce <= 0:
            settings = dataclasses.replace(settings, max_window=0)
        self._policy = ReadAheadPolicy(
            settings.bounded(memory, self._disk.limit if self._disk is not None else None)
        )
        self._max_ahead = memory // 2  # bytes in flight ahead of readers, at most
        self._ahead = 0  # bytes of background GETs in flight
        self._failed = FailedReads()
        self._lock = threading.Lock()
        self._inflight: dict[str, list[_Fetch]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self._counts = {
            "reads": 0,
            "memory_hits": 0,
            "disk_hits": 0,
            "disk_misses": 0,
            "disk_hit_bytes": 0,
            "shared": 0,
            "prefetches": 0,
            "prefetch_bytes": 0,
            "disk_skipped_bytes": 0,
            "discards": 0,
        }

    def _new_fetcher(self) -> Fetcher:
        filesystem = self._filesystem
        fetcher = Fetcher(
            (lambda: filesystem) if filesystem is not None else self._new_filesystem,
            self.location.url,
            attempts=self._attempts,
            backoff=self._backoff,
            timeout=self._timeout,
            probe=True,
            probe_interval=self._probe_interval,
        )
        fetcher.on_recovered = self._outage_ended
        return fetcher

    # -- ShardStore ------------------------------------------------------------------------------

    def read(self, name: str, offset: int, length: int, *, nowait: bool = False) -> bytes:
        if self._closed:
            raise BundleClosedError("the bundle is closed")
        end = offset + length
        if length <= 0:
            return b""
        with self._lock:
            self._counts["reads"] += 1
            stream = self._policy.observe(name, offset, end)
        if stream is not None:
            # Before this read's own fetch: its bytes then come in the first piece, and the
            # pieces after it are on their way while it waits.
            self._read_ahead(name, offset, stream)
        data = self._cached(name, offset, end, nowait)
        if data is None:
            if nowait:
                raise WouldBlock
            data = self._fetch(name, offset, end)
        return data

    def read_into(
        self, name: str, offset: int, buffer: bytearray | memoryview, *, nowait: bool = False
    ) -> int:
        data = self.read(name, offset, len(buffer), nowait=nowait)
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def prefetch(self, name: str, offset: int, length: int) -> None:
        """Start fetching these bytes in the background unless held or in flight."""
        if self._closed or length <= 0:
            return
        with contextlib.suppress(Exception):
            end = offset + length
            if self._memory.get(name, offset, end) is not None:
                return
            if self._disk is not None and self._disk.find(name, offset) is not None:
                return
            self._start_background(name, offset, end)

    def discard(self, name: str, offset: int, length: int) -> None:
        """Drop held copies of these bytes (they failed a record CRC): the next read fetches."""
        with self._lock:
            self._counts["discards"] += 1
        self._memory.discard(name, offset, offset + length)
        if self._disk is not None:
            self._disk.discard(name, offset, offset + length)

    def failed_read(self, path: str | None, shard: int | None, record: int | None) -> FailedRead:
        """A read of ``path`` failed because the store did not deliver its bytes: ``OUTAGE``
        (counted in ``outage_eio_count`` and named in a line at most every 10 s), or
        ``OUTAGE_RETRY`` for the same read retried by the kernel (not counted again). Decided
        by the failure, not by whether the outage is still on when the mount asks: a probe
        that ends it meanwhile must not turn the read into "damaged data"."""
        now = time.monotonic()
        with self._lock:
            counted = self._failed.note((path, shard, record), path, now)
            line = self._failed.line(now)
        if line is not None:
            log.warning("%s: %s", self.location.url, line)
        return FailedRead.OUTAGE if counted else FailedRead.OUTAGE_RETRY

    def _outage_ended(self) -> None:
        with self._lock:
            line = self._failed.flush()
        if line is not None:
            log.warning("%s: %s", self.location.url, line)

    def forked(self) -> None:
        """In a child after ``fork()``: the parent's GETs in flight never finish here, its locks
        may be held, its prober thread does not exist, and its network session belongs to its
        event loop."""
        self._lock = threading.Lock()
        self._inflight = {}
        self._ahead = 0
        self._pool = None
        self._fetcher = self._new_fetcher()
        self._memory = _MemoryTier(self._memory.limit)
        if self._disk is not None:
            self._disk._lock = threading.Lock()

    def close(self) -> None:
        self._closed = True
        self._fetcher.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._memory.clear()

    def _new_filesystem(self) -> Any:
        return remote_filesystem(self.location, self._timeout)

    @property
    def filesystem(self) -> Any:
        """The fsspec file system the store reads through."""
        return self._fetcher.fs

    def size_and_header(self, name: str, length: int) -> tuple[int, bytes]:
        """The object's size as the store says it now, and its first ``length`` bytes fetched
        now (not from a cache): what ``verify`` checks of each shard."""
        url = self._url(name)
        fs = self._fetcher.fs
        with contextlib.suppress(Exception):
            fs.invalidate_cache(url)
        try:
            size = int(fs.info(url)["size"])
            header = self._fetcher.get(url, 0, length)
        except FileNotFoundError:
            raise ShardUnavailable(errno.ENOENT, "no such object on the store", url) from None
        except OSError:
            raise
        except Exception as e:
            raise OSError(errno.EIO, error_reason(e)) from None
        return size, header

    # -- facts -------------------------------------------------------------------------------------

    def stats(self) -> dict[str, object]:
        """Counters for ``bundlefs info``: see docs/storage.md, "Reading"."""
        with self._fetcher.lock:
            fetched = dict(self._fetcher.counters)
            outage = self._fetcher.outage
        with self._lock:
            counts = dict(self._counts)
            outage_eio = self._failed.count
        disk = self._disk
        return {
            "location": self.location.url,
            **fetched,
            **counts,
            "memory_bytes": self._memory.bytes,
            "disk_cache": self._cache_root if disk is not None else None,
            "disk_bytes": disk.bytes if disk is not None else 0,
            "disk_cache_size": disk.limit if disk is not None else 0,
            "store_timeout": self._timeout,
            "outage": outage,
            "outage_eio_count": outage_eio,
        }

    # -- inside ------------------------------------------------------------------------------------

    def _url(self, name: str) -> str:
        url = self._urls.get(name)
        if url is None:
            url = self._urls[name] = self.location.child(name)
        return url

    def _cached(self, name: str, offset: int, end: int, nowait: bool) -> bytes | None:
        data = self._memory.get(name, offset, end)
        if data is not None:
            with self._lock:
                self._counts["memory_hits"] += 1
            return data
        if self._disk is None:
            return None
        data = self._disk.get(name, offset, end, nowait)
        with self._lock:
            if data is None:
                self._counts["disk_misses"] += 1
            else:
                self._counts["disk_hits"] += 1
                self._counts["disk_hit_bytes"] += len(data)
        return data

    def _covering(self, name: str, offset: int, end: int) -> _Fetch | None:
        for fetch in self._inflight.get(name, ()):
            if fetch.start <= offset and end <= fetch.stop:
                return fetch
        return None

    def _fetch(self, name: str, offset: int, end: int) -> bytes:
        """Bytes ``offset … end`` of an object that the caches do not hold whole: assembled from
        the pieces held, the GETs in flight and new GETs of only the gaps between them.

        A record often straddles the end of one read-ahead GET and the start of the next
        (pieces end on byte counts, not records). Fetching the whole record again fetched those
        bytes twice: a cold iter_files fetched 2x the stored bytes (bench.object_store).
        """
        parts: list[bytes] = []
        pos = offset
        while pos < end:
            data = self._piece(name, pos, end)
            parts.append(data)
            if not data:
                break  # the object ends here: the caller sees a short read
            pos += len(data)
        return b"".join(parts)

    def _piece(self, name: str, pos: int, end: int) -> bytes:
        """Bytes from ``pos`` up to ``end`` or the end of the first piece holding ``pos``."""
        for tier in (self._memory, self._disk):
            held = tier.find(name, pos) if tier is not None else None
            if held is not None:
                data = self._cached(name, pos, min(held[1], end), False)
                if data:
                    return data
        with self._lock:
            fetch = self._covering(name, pos, pos + 1)
            if fetch is not None:
                self._counts["shared"] += 1
                mine = False
            else:
                # Only the gap up to the next bytes held or on their way: a read that is part
                # of no stream fetches what it touches and nothing more.
                fetch = self._register(name, pos, self._clip(name, pos + 1, end))
                mine = True
        if mine:
            self._run(fetch)
        else:
            fetch.done.wait()
        return fetch.slice(pos, min(end, fetch.stop))

    def _clip(self, name: str, end: int, stop: int) -> int:
        """Where a GET needed up to ``end`` should stop, at most ``stop``: not past the object,
        nor into bytes already held or on their way (under the lock)."""
        size = self._sizes.get(name)
        if size is not None:
            stop = min(stop, size)
        held = [self._memory.next_start(name, end)]
        if self._disk is not None:
            held.append(self._disk.next_start(name, end))
        held += [f.start for f in self._inflight.get(name, ()) if f.start >= end]
        return min([stop] + [h for h in held if h is not None])

    def _register(self, name: str, start: int, stop: int, background: bool = False) -> _Fetch:
        fetch = _Fetch(name, start, stop, background)
        self._inflight.setdefault(name, []).append(fetch)
        if background:
            self._ahead += stop - start
        return fetch

    def _run(self, fetch: _Fetch) -> None:
        """Do the GET of ``fetch``, keep the bytes, and wake its waiters (even on failure)."""
        # Whatever happens, the waiters wake and the fetch leaves the list: a GET that died of
        # anything else (a back-end's ValueError, KeyboardInterrupt) once left every later
        # reader of its bytes waiting for ever.
        try:
            fetch.data = self._fetcher.get(self._url(fetch.name), fetch.start, fetch.stop)
            log.debug(
                "GET %s %d+%d (%s)",
                fetch.name,
                fetch.start,
                fetch.stop - fetch.start,
                "ahead" if fetch.background else "read",
            )
            if fetch.data:
                self._memory.put(fetch.name, fetch.start, fetch.data)
                if self._disk is not None:
                    self._keep_on_disk(fetch)
        except FileNotFoundError as e:
            fetch.error = ShardUnavailable(errno.ENOENT, "no such object on the store", e.filename)
        except OSError as e:
            fetch.error = e
        except BaseException as e:
            fetch.error = OSError(errno.EIO, f"the fetch failed: {e!r}")
            raise
        finally:
            self._unregister(fetch)
            fetch.done.set()

    def _keep_on_disk(self, fetch: _Fetch) -> None:
        """Write fetched bytes to the disk cache, except the full-size pieces of a stream at
        full speed: those stay in memory only. Writing them held a ``cat`` of 400 MB to the
        page cache's and the disk's pace (~110 MB/s and a third of the daemon's CPU here, 340
        MB/s without), and a large file read through once would evict the records the disk
        cache is for. A stream's first, smaller pieces and every reader's own fetches are kept.
        """
        assert self._disk is not None
        if fetch.read_ahead and len(fetch.data) >= self._policy.settings.max_piece:
            with self._lock:
                self._counts["disk_skipped_bytes"] += len(fetch.data)
            return
        self._disk.put(fetch.name, fetch.start, fetch.data)

    def _unregister(self, fetch: _Fetch) -> None:
        with self._lock:
            fetches = self._inflight.get(fetch.name, [])
            if fetch in fetches:
                fetches.remove(fetch)
                if fetch.background:
                    self._ahead -= fetch.stop - fetch.start

    def _covered_until(self, name: str, pos: int, limit: int) -> int:
        """How far from ``pos`` the bytes are held or on their way (up to ``limit``)."""
        while pos < limit:
            piece = self._memory.find(name, pos)
            if piece is None and self._disk is not None:
                piece = self._disk.find(name, pos)
            if piece is None:
                with self._lock:
                    fetch = self._covering(name, pos, pos + 1)
                if fetch is None:
                    return pos
                piece = (fetch.start, fetch.stop)
            pos = piece[1]
        return pos

    def _read_ahead(self, name: str, offset: int, stream: Stream) -> None:
        """Keep a sequential stream's window ahead of its reader (at ``offset``) held or on its
        way: the pieces ``ReadAheadPolicy`` plans, in the background, several at once."""
        if self._fetcher.outage:
            return  # every GET would fail at once: the reader's own read reports it
        covered = self._covered_until(name, offset, offset + self._policy.settings.max_window)
        with self._lock:
            pieces = self._policy.plan(
                stream, offset, covered, self._sizes.get(name), self._max_ahead - self._ahead
            )
        for start, stop in pieces:
            self._start_background(name, start, stop, read_ahead=True)

    def _start_background(
        self, name: str, start: int, stop: int, *, read_ahead: bool = False
    ) -> None:
        with self._lock:
            if self._closed or self._covering(name, start, start + 1) is not None:
                return
            # Not into bytes another thread's plan has put on their way meanwhile.
            stop = self._clip(name, start + 1, stop)
            if stop <= start:
                return
            fetch = self._register(name, start, stop, background=True)
            fetch.read_ahead = read_ahead
            self._counts["prefetches"] += 1
            self._counts["prefetch_bytes"] += stop - start
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    READ_AHEAD_THREADS, thread_name_prefix="bundlefs-fetch"
                )
            pool = self._pool
        try:
            future = pool.submit(self._run, fetch)
        except RuntimeError:  # closed meanwhile
            self._abandon(fetch)
            return
        # close() cancels the pieces not yet started: their waiters must wake, not wait for ever.
        future.add_done_callback(lambda f: self._abandon(fetch) if f.cancelled() else None)

    def _abandon(self, fetch: _Fetch) -> None:
        """A background fetch that will never run (the store closed): fail its waiters."""
        fetch.error = OSError(errno.EIO, "the bundle was closed")
        self._unregister(fetch)
        fetch.done.set()


def list_shard_names(location: Location, fs: Any) -> list[str]:
    """The names of the ``shard-*`` objects at ``location`` (for ``verify``)."""
    with contextlib.suppress(Exception):
        fs.invalidate_cache(location.path)
    names = [n.rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(location.path, detail=False)]
    return sorted(n for n in names if n.startswith(fmt.SHARD_PREFIX))
