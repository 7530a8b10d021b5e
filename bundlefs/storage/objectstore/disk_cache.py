"""Fetched shard ranges kept on local disk across restarts: ``DiskRecordCache``, and the cache
root every bundle on an object store shares (``default_cache_dir``, ``$BUNDLEFS_CACHE_DIR``).

Cache layout (``CACHE`` is ``disk_cache`` or ``default_cache_dir()``)::

    CACHE/records/<bundle id hex>/<shard name>.<offset>.<length>   (stored bytes of the shard)

May import: the standard library, ``bundlefs.core``, ``bundlefs.errors``,
``bundlefs.storage.objectstore.tiers``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time

from bundlefs.core import format as fmt
from bundlefs.errors import WouldBlock
from bundlefs.storage.objectstore.tiers import LockedRanges, RangeIndex, assemble

log = logging.getLogger(__name__)

ENV_CACHE_DIR = "BUNDLEFS_CACHE_DIR"
DEFAULT_DISK_CACHE_SIZE = 1024 * 1024 * 1024
_TMP_MAX_AGE = 3600.0  # a temporary file older than this was left by a dead process
# A blocking miss lists the bundle's directory again at most this often (seconds), so that ranges
# other processes cached since this one listed it are found.
_REFRESH_INTERVAL = 2.0


def default_cache_dir() -> str:
    """``$BUNDLEFS_CACHE_DIR``, else ``$XDG_CACHE_HOME/bundlefs``, else ``~/.cache/bundlefs``."""
    explicit = os.environ.get(ENV_CACHE_DIR)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bundlefs")


def _is_bundle_id(name: str) -> bool:
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


class DiskRecordCache(LockedRanges):
    """Fetched shard ranges of one bundle as files, bounded in bytes across every bundle there.

    ``ROOT/<bundle id hex>/<shard>.<offset>.<length>``: a range is only ever served to the bundle
    whose id names its directory. Written atomically (a temporary file of a random name, closed,
    renamed into place); no fsync, because a damaged file is caught by the record CRC above and
    dropped (``discard``), and a file of the wrong size is a miss. Least recently used goes
    first: a hit sets the file's mtime, and eviction (down to 90% of the bound, so it runs in
    batches) scans the whole directory.

    The directory may be shared by processes on several hosts (docs/storage.md, "The cluster
    cache"): no locks, only renames and unlinks. A file removed under a reader (ENOENT, NFS's
    ESTALE) or unreadable is a miss, never an error; a blocking miss lists the bundle's
    directory again (at most every ``_REFRESH_INTERVAL``) to find ranges others cached since.

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
        self.index = RangeIndex()
        self._lock = threading.Lock()
        self.bytes = 0  # the last scan's total plus what this instance wrote since
        self._written = 0  # bytes written since the last scan
        # The process scanning now (0: none). A pid, not a flag: a child forked during a scan
        # would otherwise never scan again.
        self._scanner = 0
        self._loaded = 0.0  # when the directory was last listed (monotonic)
        os.makedirs(self.dir, exist_ok=True)
        self._load()
        self._scanner = os.getpid()
        self._rescan()  # other readers may have left the directory over the bound

    def _load(self) -> None:
        """Learn the ranges in this bundle's directory: what earlier readers, and other
        processes (other hosts too, on a shared file system) have cached."""
        self._loaded = time.monotonic()
        now = time.time()
        found = []
        for entry in os.scandir(self.dir):
            if entry.name.startswith("."):
                with contextlib.suppress(OSError):
                    if now - entry.stat().st_mtime > _TMP_MAX_AGE:
                        os.unlink(entry.path)  # a temporary file of a process that died
                continue
            parsed = self._parse(entry.name)
            if parsed is not None:
                found.append(parsed)
        with self._lock:
            for name, start, length in found:
                old = self.index.length(name, start)
                if old is None or old < length:
                    self.index.add(name, start, length)

    def _refresh(self) -> bool:
        """List the directory again if the last listing is older than ``_REFRESH_INTERVAL``
        (a miss may be a range another process cached since); whether it was listed."""
        if time.monotonic() - self._loaded < _REFRESH_INTERVAL:
            return False
        try:
            self._load()
        except OSError as e:  # removed under us, or the file system is away: misses only
            log.debug("cannot list the disk cache %s: %s", self.dir, e)
            return False
        return True

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

    def get(self, name: str, offset: int, end: int, nowait: bool) -> bytes | None:
        """Bytes ``offset … end`` if held whole, else None. With ``nowait``, ``WouldBlock`` when
        the lock is taken or a file's pages are not in memory. A blocking miss looks for files
        other processes cached since this one last listed the directory (``_refresh``)."""
        data = self._get(name, offset, end, nowait)
        if data is None and not nowait and self._refresh():
            data = self._get(name, offset, end, nowait)
        return data

    def _get(self, name: str, offset: int, end: int, nowait: bool) -> bytes | None:
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

            held = assemble(self.index, name, offset, end, plan)
        finally:
            self._lock.release()
        if held is None:
            return None
        try:
            parts = [self._read(*piece, nowait) for piece in pieces]
        except OSError as e:
            # Evicted by another reader (ENOENT; ESTALE on NFS when another host removed it
            # while it was open), of the wrong size, or unreadable: a miss, never an error.
            log.debug("disk cache miss on %s: %s", name, e)
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
        # Unique across processes and hosts (a pid is not, on a shared file system), and
        # created exclusively: no two writers ever share a temporary file.
        tmp = os.path.join(self.dir, f".{name}.{start}.{os.urandom(8).hex()}")
        try:
            with open(tmp, "xb") as f:
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

    def forked(self) -> None:
        """In a child after ``fork()``: a lock another thread held then would stay held."""
        self._lock = threading.Lock()
