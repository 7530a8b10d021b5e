"""The FUSE adapter: ``BundleOperations`` translates pyfuse3 requests into reader-library calls.

Handlers are thin. Bundle inode numbers are FUSE inode numbers (root = 1), and the data never
changes, so the adapter keeps no per-file state: ``forget`` has nothing to do, file and directory
handles are the inode numbers themselves, and the kernel may cache entries and attributes forever.

Two open paths (docs/concurrency.md). With a pyfuse3 built with our opt-in no-open patch
(third_party/pyfuse3) on Linux 5.1 or later, ``open`` and ``opendir`` answer ``ENOSYS`` once: the
kernel then never sends OPEN, RELEASE, OPENDIR or RELEASEDIR again, keeps every file's page cache
across opens and caches directory listings, so a warm read or listing costs no request at all, and
``read``/``readdir`` receive the inode where a handle would be. Otherwise every open is a round trip
answered with ``keep_cache``. Both paths serve the same bytes; the stats xattr says which one runs.

This module holds the only errno table (``_errno_for``); every handler goes through ``_handler``
(``read`` takes the same steps itself) so no exception can escape into pyfuse3's main loop (which
would end the file system). What the handlers lean on lives beside it: the refused mutations
(``readonly``), where a read's loads run (``reads``), the counters (``stats``), the extended
attributes (``xattrs``) and the kernel probes (``kernel``).

May import: pyfuse3 (from ``bundlefs.mount.bindings``), ``bundlefs.core``, ``bundlefs.errors``,
``bundlefs.read``, ``bundlefs.mount.kernel``, ``bundlefs.mount.listing``,
``bundlefs.mount.readonly``, ``bundlefs.mount.reads``, ``bundlefs.mount.stats``,
``bundlefs.mount.xattrs``.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from bundlefs.core import format as fmt
from bundlefs.errors import (
    BundleError,
    CorruptDataError,
    EntryNotFound,
    IsADirectory,
    NotADirectory,
    NotASymlink,
)
from bundlefs.mount import kernel, listing, xattrs
from bundlefs.mount.bindings import binding, pyfuse3
from bundlefs.mount.readonly import ReadOnlyOperations
from bundlefs.mount.reads import ReadScheduler
from bundlefs.mount.stats import EIO, REQUEST_INDEX, MountStats
from bundlefs.read.bundle import Bundle
from bundlefs.read.listing import Stat

log = logging.getLogger(__name__)

# The bundle is immutable: let the kernel keep entries and attributes (effectively) forever.
CACHE_TIMEOUT = 365 * 24 * 3600.0


@dataclass(frozen=True)
class MountSettings:
    """What the adapter needs to know beyond the bundle."""

    uid: int | None = None  # override every entry's owner (``--owner=mounter``/``--uid``)
    gid: int | None = None
    load_threads: int = 4  # record loads that may run at once off the event loop; 0: inline
    open_mode: str = "auto"  # "auto" (no-open wherever available), "no-open" or "open"
    prefetch: bool = True  # start reading a small file's bytes when it is looked up
    # When the kernel asks for entries with attributes (READDIRPLUS) rather than names and types
    # (READDIR): "auto" (the kernel's heuristic), "always" or "never"; a stock pyfuse3: "always".
    readdirplus: str = "auto"


# The errno of each error kind a request may meet; any other is EIO.
_ERRNOS = (
    (EntryNotFound, errno.ENOENT),
    (NotADirectory, errno.ENOTDIR),
    (IsADirectory, errno.EISDIR),
    (NotASymlink, errno.EINVAL),
)


def _errno_for(error: BaseException) -> int:
    """The one errno table of the mount (see docs/concurrency.md for the policy)."""
    if isinstance(error, pyfuse3.FUSEError):
        return error.errno
    return next((code for kind, code in _ERRNOS if isinstance(error, kind)), errno.EIO)


_P = ParamSpec("_P")
_R = TypeVar("_R")
_Sync = Callable[Concatenate["BundleOperations", _P], _R]
_Handler = Callable[Concatenate["BundleOperations", _P], Coroutine[Any, Any, _R]]


def _handler(fn: _Sync[_P, _R]) -> _Handler[_P, _R]:
    """Make a handler of ``fn``: count it, map errors to errno, log the unexpected, let none
    escape. ``fn`` itself is synchronous: pyfuse3 awaits one coroutine per request, not two."""
    name = fn.__name__
    counted = REQUEST_INDEX[name]

    @functools.wraps(fn)
    async def wrapper(self: BundleOperations, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        self.mount_stats.counters.values[counted] += 1
        try:
            return fn(self, *args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except Exception as e:
            raise self._failed(name, e) from None

    return wrapper


_READ = REQUEST_INDEX["read"]


class BundleOperations(ReadOnlyOperations):
    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(
        self,
        bundle: Bundle,
        settings: MountSettings = MountSettings(),  # noqa: B008 - frozen
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self.bundle = bundle
        self._tree = bundle.tree  # the two models every request goes to, one lookup nearer
        self._content = bundle.content
        self._entry_count = bundle.config.entry_count
        self._block_size = bundle.config.block_size
        self.settings = settings
        self.on_ready = on_ready  # called once the kernel handshake is done
        # load_threads == 0: load records inline on the event loop (no thread hop; blocks it).
        self._reads = ReadScheduler(bundle.content, settings.load_threads)
        self._prefetch = settings.prefetch
        # Counters of this process; a multi-worker mount points them into shared memory.
        self.mount_stats = MountStats()
        # The patched pyfuse3 reads enable_no_open at the kernel handshake and clears it when the
        # kernel lacks no_open/no_opendir; init() then sees what is in effect.
        self.open_mode_reason = kernel.no_open_refused(settings.open_mode)
        if not self.open_mode_reason:
            self.enable_no_open = True
        self.open_mode = "open"  # until init() knows what the kernel granted
        # The patched pyfuse3 reads it at the handshake; a stock one always asks for READDIRPLUS.
        self.readdirplus = settings.readdirplus
        self._reply_batch = getattr(pyfuse3, "readdir_reply_batch", None)
        # READDIRPLUS attributes built in C (the patched binding), where stored owners are shown
        owners_stored = settings.uid is None and settings.gid is None
        self._reply_stats = listing.stats_reply(self._stat_attributes) if owners_stored else None

    # -- lifecycle ---------------------------------------------------------------------------------

    def init(self) -> None:
        # Called by pyfuse3 once the kernel handshake is done: the mount is usable from here on.
        if getattr(self, "enable_no_open", False):  # (a stock pyfuse3 has no such attribute)
            self.open_mode = "no-open"
        elif not self.open_mode_reason:
            self.open_mode_reason = "the kernel does not offer no_open and no_opendir"
        log.info(
            "open path: %s%s",
            self.open_mode,
            f" ({self.open_mode_reason})" if self.open_mode_reason else "",
        )
        self._reads.watch_session()  # the session exists from here on
        if self.on_ready is not None:
            self.on_ready()

    @property
    def loads_inline(self) -> bool:
        """Whether record loads run on the event loop (no load threads)."""
        return self._reads.loads_inline

    @property
    def eio_count(self) -> int:
        """Requests this process answered with EIO."""
        return self.mount_stats.counters.get("eio_count")

    @property
    def requests(self) -> dict[str, int]:
        """Requests this process received, per operation."""
        return self.mount_stats.counters.requests()

    def close(self) -> None:
        """Stop the load threads and close the bundle (after the loop has ended)."""
        self._reads.close()
        self.bundle.close()

    def stats(self) -> dict[str, object]:
        """The whole mount's figures (every worker's), and how it is served."""
        served: dict[str, object] = {
            "open_mode": self.open_mode,
            "open_mode_reason": self.open_mode_reason,
            "binding": binding(),  # "patched" or "stock" (bindings.py)
        }
        return self.mount_stats.figures(self.bundle.cache, served)

    def _failed(self, handler: str, error: Exception) -> pyfuse3.FUSEError:
        """The answer to ``error`` (not a ``FUSEError``), counted and logged as the errno table
        says: damage is logged once per record, the unexpected with its traceback."""
        code = _errno_for(error)
        if isinstance(error, CorruptDataError):
            self._damaged(error)
        elif code == errno.EIO:
            self.mount_stats.counters.count(EIO)
            if isinstance(error, BundleError):
                log.error("%s: %s", handler, error)
            else:
                log.error("unexpected error in %s", handler, exc_info=error)
        return pyfuse3.FUSEError(code)

    def _damaged(self, error: CorruptDataError) -> None:
        key = (error.shard, error.record, error.path, error.detail)  # detail: an index page
        if self.mount_stats.failed_read(self.bundle.storage_failed_read(error), key):
            log.error("damaged data, read failed with EIO: %s", error)

    def _entry(self, inode: int) -> fmt.Entry:
        """The entry of an inode the kernel names. One never handed out is ENOENT, not damage."""
        if not fmt.ROOT_INO <= inode <= self._entry_count:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._tree.entry(inode)

    # -- attributes --------------------------------------------------------------------------------

    def _attributes(self, entry: fmt.Entry) -> pyfuse3.EntryAttributes:
        uid, gid = self._tree.owner(entry)
        return self._stat_attributes(
            (entry.ino, entry.mode, entry.nlink, uid, gid, entry.size, entry.mtime_ns, entry.rdev)
        )

    def _stat_attributes(self, stat: Stat) -> pyfuse3.EntryAttributes:
        ino, mode, nlink, uid, gid, size, mtime_ns, rdev = stat
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = ino
        attr.st_mode = mode
        attr.st_nlink = nlink
        attr.st_uid = uid if self.settings.uid is None else self.settings.uid
        attr.st_gid = gid if self.settings.gid is None else self.settings.gid
        attr.st_size, attr.st_rdev = size, rdev  # a device's number; mounted nodev
        attr.st_blksize = self._block_size
        attr.st_blocks = (size + 511) // 512 if mode & 0o170000 == fmt.KIND_FILE else 0
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = mtime_ns
        attr.entry_timeout = attr.attr_timeout = CACHE_TIMEOUT
        return attr

    @_handler
    def lookup(
        self,
        parent_inode: pyfuse3.InodeT,
        name: pyfuse3.FileNameT,
        ctx: pyfuse3.RequestContext | None = None,
    ) -> pyfuse3.EntryAttributes:
        parent = self._entry(parent_inode)
        if name == b".":
            entry = parent
        elif name == b"..":
            entry = self._tree.parent_of(parent)
        else:
            found = self._tree.lookup(parent, name)
            if found is None:
                # A negative entry the kernel caches (raising ENOENT would not be cached).
                attr = pyfuse3.EntryAttributes()
                attr.st_ino = 0
                attr.entry_timeout = CACHE_TIMEOUT
                return attr
            entry = found
            if self._prefetch:
                self._content.prefetch(entry)  # the READ that usually follows finds it cached
        return self._attributes(entry)

    @_handler
    def getattr(
        self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext | None = None
    ) -> pyfuse3.EntryAttributes:
        return self._attributes(self._entry(inode))

    @_handler
    def readlink(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.FileNameT:
        entry = self._entry(inode)
        if not entry.is_symlink:
            raise pyfuse3.FUSEError(errno.EINVAL)
        return entry.symlink

    async def forget(self, inode_list: Sequence[tuple[pyfuse3.InodeT, int]]) -> None:
        pass  # no per-inode state

    # -- directories -------------------------------------------------------------------------------

    @_handler
    def opendir(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.FileHandleT:
        if self.open_mode == "no-open":
            raise pyfuse3.FUSEError(errno.ENOSYS)  # no more OPENDIR/RELEASEDIR; listings cached
        if not self._entry(inode).is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    @_handler
    def readdir(self, fh: pyfuse3.FileHandleT, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        # start_id is the position in the directory, so a listing resumes exactly where the kernel
        # stopped it, in O(1), however large the directory.
        directory = self._entry(fh)
        if directory.is_dir and self._reply_batch and not pyfuse3.readdir_plus(token):
            return listing.reply_plain(self._tree, self._reply_batch, directory, start_id, token)
        listing.reply_plus(
            self._tree, self._stat_attributes, directory, start_id, token, self._reply_stats
        )

    @_handler
    def releasedir(self, fh: pyfuse3.FileHandleT) -> None:
        pass

    # -- files -------------------------------------------------------------------------------------

    @_handler
    def open(
        self, inode: pyfuse3.InodeT, flags: pyfuse3.FlagT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.FileInfo:
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_APPEND):
            raise pyfuse3.FUSEError(errno.EROFS)
        if self.open_mode == "no-open":
            # The kernel stops sending OPEN and RELEASE and keeps the page cache across opens.
            # Write opens still fail: the mount is ``ro``, so the VFS refuses them before us.
            raise pyfuse3.FUSEError(errno.ENOSYS)
        # No lookup: the kernel sends directories to opendir, and every open of a cached file
        # costs this round trip, so it should do nothing it need not.
        # keep_cache: the page cache stays valid across opens, because the content never changes.
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    # pyfuse3 declares bytes, and takes any buffer: a bytearray spares a copy of large replies.
    async def read(  # type: ignore[override]
        self, fh: pyfuse3.FileHandleT, off: int, size: int
    ) -> bytes | bytearray:
        # What _handler does, written out: a load in a thread is awaited here.
        self.mount_stats.counters.values[_READ] += 1
        try:
            entry = self._entry(fh)
            try:
                return await self._reads.read(entry, off, size)
            finally:
                self.mount_stats.counters.publish_cache(self._content.cache)
        except pyfuse3.FUSEError:
            raise
        except Exception as e:
            raise self._failed("read", e) from None

    @_handler
    def release(self, fh: pyfuse3.FileHandleT) -> None:
        pass

    # -- file system -------------------------------------------------------------------------------

    @_handler
    def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        info = self.bundle.info()
        frsize = self.bundle.config.block_size
        st = pyfuse3.StatvfsData()
        st.f_bsize = frsize
        st.f_frsize = frsize
        st.f_blocks = (info.shard_bytes + info.index_bytes + frsize - 1) // frsize
        st.f_bfree = st.f_bavail = 0
        st.f_files = self.bundle.config.entry_count
        st.f_ffree = st.f_favail = 0
        st.f_namemax = fmt.MAX_NAME
        return st

    @_handler
    def access(
        self, inode: pyfuse3.InodeT, mode: pyfuse3.ModeT, ctx: pyfuse3.RequestContext
    ) -> bool:
        if mode & os.W_OK:
            raise pyfuse3.FUSEError(errno.EROFS)
        return True

    # -- extended attributes -----------------------------------------------------------------------

    def _xattrs(self, entry: fmt.Entry) -> dict[bytes, bytes]:
        return xattrs.values(
            self.bundle, entry, lambda: {**self.stats(), **self.mount_stats.daemon_facts}
        )

    @_handler
    def listxattr(
        self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext
    ) -> Sequence[pyfuse3.XAttrNameT]:
        return list(self._xattrs(self._entry(inode)))

    @_handler
    def getxattr(
        self, inode: pyfuse3.InodeT, name: pyfuse3.XAttrNameT, ctx: pyfuse3.RequestContext
    ) -> bytes:
        if xattrs.unsupported(name):
            raise pyfuse3.FUSEError(errno.EOPNOTSUPP)
        value = self._xattrs(self._entry(inode)).get(name)
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value
