"""Packing a source tree into a bundle, atomically and deterministically.

The tree is walked breadth first with names sorted bytewise, which assigns inode numbers exactly as
docs/format.md §3.3 requires and lets every index write be a sorted append. Memory holds the queue
of directories still to list (up to every directory of two adjacent levels of the tree), the names
of the directory being listed, a read-ahead window of at most _READ_AHEAD_FILES small files, the
table of distinct (uid, gid) pairs, and one entry per multiply-linked file seen (to give its later
names the same inode): not the entries of the whole tree, but not bounded by a constant either.

The bundle is built in a temporary sibling ``.NAME.partial-PID`` and moved into place only once
complete; see ``_publish``. The packer holds an exclusive ``flock`` on that directory until it is
done, old bundle removed and all; ``remove_stale_partials`` deletes only siblings nobody holds
locked, so a killed packer's leftovers go and a live one's stay, across PID namespaces and hosts.
Every failure is a ``PackError`` naming what went wrong, and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import fnmatch
import functools
import hashlib
import logging
import os
import shutil
import stat as statmod
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import lmdb

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.errors import PackError
from bundlefs.storage.index import IndexWriter
from bundlefs.storage.shards import ShardWriter, write_shard_header

log = logging.getLogger(__name__)

_READ_CHUNK = 1024 * 1024
_PARTIAL_TAG = ".partial-"
_ASIDE_TAG = ".previous-"  # the old bundle during a two-rename replacement; never auto-removed
DEFAULT_SHARD_SIZE = 4 * 1024**3


@dataclass(frozen=True)
class PackOptions:
    record_size: int = fmt.DEFAULT_RECORD_SIZE
    block_size: int = fmt.DEFAULT_BLOCK_SIZE
    compression: str = "lz4"
    shard_size: int = DEFAULT_SHARD_SIZE
    excludes: tuple[str, ...] = ()
    force: bool = False
    skip_errors: bool = False
    # Threads that stat and read small files ahead of the writer and compress records: source
    # reads overlap (a cold disk or NFS serves many requests at once) and lz4 uses every core,
    # while the output stays in one deterministic order.
    jobs: int = 4
    # Called with (relative path bytes, lstat result); returns bytes to attach to the entry or None.
    user_data: Callable[[bytes, os.stat_result], bytes | None] | None = None


@dataclass
class PackProgress:
    """Counters updated while packing; ``total_*`` are unknown (0) unless the caller set them."""

    files: int = 0
    dirs: int = 0
    bytes_read: int = 0
    bytes_stored: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass
class PackSummary:
    dest: str
    config: fmt.Config
    stored_bytes: int
    index_bytes: int
    seconds: float
    skipped: list[str] = field(default_factory=list)  # special files and (with skip_errors) errors
    changed: list[str] = field(default_factory=list)  # files that changed while being read


_READ_AHEAD_FILES = 64  # files probed ahead of the writer; each holds at most _READ_AHEAD_MAX bytes
_READ_AHEAD_MAX = 1024 * 1024


@dataclass
class _Probe:
    """What a reader thread learned about one source path before the writer reached it."""

    st: os.stat_result | None = None  # lstat
    error: OSError | None = None
    data: bytes | None = None  # the whole content of a small regular file
    before: os.stat_result | None = None  # fstat of the open file, before and after reading
    after: os.stat_result | None = None


def _probe(path: bytes) -> _Probe:
    probe = _Probe()
    try:
        probe.st = os.lstat(path)
    except OSError as e:
        probe.error = e
        return probe
    if not statmod.S_ISREG(probe.st.st_mode) or probe.st.st_size > _READ_AHEAD_MAX:
        return probe
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return probe  # the writer retries and reports it with its own policy
    try:
        probe.before = os.fstat(fd)
        if statmod.S_ISREG(probe.before.st_mode):
            chunks = []
            while chunk := os.read(fd, _READ_CHUNK):
                chunks.append(chunk)
            probe.data = b"".join(chunks)
            probe.after = os.fstat(fd)
    except OSError:
        probe.data = None
    finally:
        os.close(fd)
    return probe


def partial_dir(dest: str) -> str:
    parent, name = os.path.split(os.path.abspath(dest))
    return os.path.join(parent, f".{name}{_PARTIAL_TAG}{os.getpid()}")


def remove_stale_partials(dest: str) -> list[str]:
    """Remove the temporary siblings of interrupted packs to ``dest``: those nobody holds locked.

    A packer holds an exclusive flock on its temporary directory until it has finished, so a
    sibling that can be locked belongs to a packer that is gone (the kernel, or the NFS lock
    manager, dropped its lock). A sibling that cannot be locked, or is not a directory, is left.
    """
    parent, name = os.path.split(os.path.abspath(dest))
    prefix = f".{name}{_PARTIAL_TAG}"
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for entry in names:
        if not entry.startswith(prefix):
            continue
        path = os.path.join(parent, entry)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # gone already, or not a directory: not ours to delete
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live packer holds it (or the filesystem cannot tell us: keep it)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(entry)
        finally:
            os.close(fd)
    return removed


def _lock_directory(path: str) -> int:
    """An fd of directory ``path`` holding an exclusive flock, if the filesystem grants one.

    Where it does not (NFS without lock support, or with flock emulated by byte-range locks,
    which need a file open for writing), the fd is returned unlocked: cleaners cannot lock the
    directory either, so they leave it alone.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        log.debug("cannot lock %s (%s); stale-partial cleanup will skip it", path, e.strerror)
    return fd


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _is_bundle(path: str) -> bool:
    """Whether ``path`` is a bundle, complete or not, that ``force`` may replace.

    A real directory (not a symlink) with an ``index/`` directory and either ``COMPLETE`` or
    ``index/data.mdb``: every bundle has these, and a directory of anything else is not replaced.
    """
    try:
        if not statmod.S_ISDIR(os.lstat(path).st_mode):
            return False
        if not statmod.S_ISDIR(os.lstat(os.path.join(path, fmt.INDEX_DIR)).st_mode):
            return False
    except OSError:
        return False
    return any(
        os.path.isfile(os.path.join(path, p))
        for p in (fmt.MARKER_NAME, os.path.join(fmt.INDEX_DIR, fmt.INDEX_FILE))
    )


_NOT_A_BUNDLE = "DEST exists and is not a bundle; refusing to replace it"


def _check_places(source: str, dest: str, force: bool) -> None:
    """Refuse a DEST that overlaps the source (either way, through any symlink) or is not ours."""
    if not os.path.isdir(source):
        raise PackError(f"source {source} is not a directory")
    parent, name = os.path.split(os.path.abspath(dest))
    if not os.path.isdir(parent):
        raise PackError(f"the directory to hold {dest} does not exist")
    # DEST itself may be a symlink (refused below); where it will be written is parent/name.
    dest_real = os.path.join(os.path.realpath(parent), name)
    source_real = os.path.realpath(source)
    if _inside(dest_real, source_real):
        raise PackError("the bundle cannot be written inside the tree being packed")
    if _inside(source_real, dest_real):
        raise PackError("the tree being packed is inside DEST, which a pack would replace")
    if os.path.lexists(dest):
        if not force:
            raise PackError(f"{dest} already exists (use --force to replace it)")
        if not _is_bundle(dest):
            raise PackError(_NOT_A_BUNDLE)


def pack(
    source: str,
    dest: str,
    options: PackOptions = PackOptions(),  # noqa: B008 - frozen, safe as a default
    progress: Callable[[PackProgress], None] | None = None,
) -> PackSummary:
    """Pack the tree at ``source`` into a new bundle at ``dest``.

    Raises ``PackError`` for every failure: a bad option, an unreadable source (unless
    ``skip_errors``), a DEST that overlaps the source or (with ``force``) is not a bundle, a full
    disk. Nothing is left behind then, and an existing DEST is untouched.
    """
    if options.compression not in fmt.COMPRESSION_NAMES:
        raise PackError(f"unknown compression {options.compression!r} (choose lz4 or none)")
    try:
        fmt.validate_layout(options.block_size, options.record_size)
    except fmt.FormatError as e:
        raise PackError(str(e)) from None
    _check_places(source, dest, options.force)
    remove_stale_partials(dest)
    work = partial_dir(dest)
    try:
        os.mkdir(work)
    except OSError as e:
        raise PackError(f"cannot create the temporary directory {work}: {e.strerror}") from e
    try:
        lock = _lock_directory(work)
    except OSError as e:
        shutil.rmtree(work, ignore_errors=True)
        raise PackError(f"cannot open the temporary directory {work}: {e.strerror}") from e
    try:
        try:
            st = os.fstat(lock)
            packer = _Packer(source, work, (st.st_dev, st.st_ino), options, progress)
            summary = packer.run()
            _publish(work, dest, options.force)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    except lmdb.Error as e:
        raise PackError(f"cannot write the index of {dest}: {e}") from e
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise PackError(f"cannot write the bundle {dest}: {e.strerror or e}{where}") from e
    except fmt.FormatError as e:
        raise PackError(f"cannot pack {source}: {e}") from e
    finally:
        os.close(lock)
    summary.dest = dest
    return summary


class _Packer:
    def __init__(self, source, work, work_id: tuple[int, int], options: PackOptions, progress):
        self.source = os.fsencode(source)
        self.work = work
        # (st_dev, st_ino) of ``work``: skipped if the walk meets it (a bind mount, say), so the
        # packer never reads its own growing output.
        self.work_id = work_id
        self.options = options
        self.report = progress
        self.progress = PackProgress()
        self._last_report = 0.0
        self.config = fmt.Config(
            block_size=options.block_size,
            record_size=options.record_size,
            compression=fmt.COMPRESSION_NAMES[options.compression],
        )
        self.index = IndexWriter(os.path.join(work, fmt.INDEX_DIR))
        self.shards: list[fmt.ShardInfo] = []
        self.shard: ShardWriter | None = None
        self.owners: dict[tuple[int, int], int] = {}
        self.hardlinks: dict[tuple[int, int], list] = {}  # (st_dev, st_ino) -> [entry, names]
        self.counts = dict(files=0, dirs=0, symlinks=0, hardlinks=0, data_bytes=0)
        self.next_ino = fmt.ROOT_INO + 1
        self.pool = ThreadPoolExecutor(options.jobs) if options.jobs > 1 else None
        self.skipped: list[str] = []
        self.changed: list[str] = []

    # -- the walk ----------------------------------------------------------------------------------

    def run(self) -> PackSummary:
        started = time.monotonic()
        try:
            try:
                root_stat = os.stat(self.source)
            except OSError as e:
                raise PackError(f"cannot read the source: {e.strerror}") from e
            root = self._dir_entry(fmt.ROOT_INO, b"", root_stat, fmt.ROOT_INO, b"")
            self.index.put_entry(root)
            queue: deque[tuple[fmt.Entry, bytes]] = deque([(root, b"")])
            while queue:
                directory, rel = queue.popleft()
                self._pack_directory(directory, rel, queue)
            self._finish_hardlinks()
            if self.shard is None and not self.shards:
                self._shard_for(0)  # an empty tree still gets one shard: every bundle has one
            self._close_shard()
            for i, info in enumerate(self.shards):
                self.index.put_shard(i, info)
            self.config = dataclasses.replace(self.config, **_config_counts(self))
            self.index.put_config(self.config)
            index, self.index = self.index, None
            index.close()
        except BaseException:
            # Release what is open without masking the error (closing a shard flushes its buffer,
            # which fails again on a full disk).
            if self.shard is not None:
                with contextlib.suppress(OSError):
                    self.shard.abort()
            if self.index is not None:
                with contextlib.suppress(lmdb.Error):
                    self.index.abort()
            raise
        finally:
            if self.pool is not None:
                self.pool.shutdown(cancel_futures=True)
        index_path = os.path.join(self.work, fmt.INDEX_DIR, fmt.INDEX_FILE)
        marker = self._seal(index_path)
        stored = sum(s.file_size for s in self.shards)
        return PackSummary(
            "",
            self.config,
            stored,
            marker.index_size,
            time.monotonic() - started,
            self.skipped,
            self.changed,
        )

    def _pack_directory(self, directory: fmt.Entry, rel: bytes, queue: deque) -> None:
        path = os.path.join(self.source, rel) if rel else self.source
        try:
            names = sorted(os.listdir(path))
        except OSError as e:
            self._source_error(rel, e)
            names = []
        children = []
        for name in names:
            child_rel = rel + b"/" + name if rel else name
            if self._excluded(child_rel, name):
                continue
            if len(name) > fmt.MAX_NAME:
                self._source_error(child_rel, OSError(errno.ENAMETOOLONG, "name too long"))
                continue
            children.append((name, child_rel))
        first_child = self.next_ino
        subdirs = 0
        for (name, child_rel), probe in zip(children, self._probes(children), strict=True):
            child = self._pack_child(child_rel, name, directory.ino, probe)
            if child is None:
                continue
            if child.is_dir:
                subdirs += 1
                queue.append((child, child_rel))
        count = self.next_ino - first_child
        final = dataclasses.replace(
            directory,
            size=count,
            first_child=first_child if count else 0,
            nlink=2 + subdirs,
        )
        self.index.replace_entry(final)
        self.progress.dirs += 1

    def _probes(self, children: list[tuple[bytes, bytes]]) -> Iterator[_Probe]:
        """Probes of ``children`` in order, computed up to _READ_AHEAD_FILES ahead on the pool."""
        paths = (os.path.join(self.source, rel) for _name, rel in children)
        if self.pool is None:
            yield from map(_probe, paths)
            return
        pending: deque = deque()
        for path in paths:
            pending.append(self.pool.submit(_probe, path))
            if len(pending) >= _READ_AHEAD_FILES:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    def _pack_child(self, rel: bytes, name: bytes, parent: int, probe: _Probe) -> fmt.Entry | None:
        if probe.error is not None:
            self._source_error(rel, probe.error)
            return None
        st = probe.st
        if (st.st_dev, st.st_ino) == self.work_id:
            return None  # our own output, reached through a bind mount or the like
        ino = self.next_ino
        if ino > fmt.MAX_ENTRIES:
            raise PackError("the tree has more entries than a bundle can hold (2^32 - 1)")
        kind = statmod.S_IFMT(st.st_mode)
        if kind == statmod.S_IFDIR:
            entry = self._dir_entry(ino, name, st, parent, rel)
        elif kind == statmod.S_IFLNK:
            entry = self._symlink_entry(ino, name, st, rel)
        elif kind == statmod.S_IFREG:
            entry = self._file_entry(ino, name, st, rel, probe)
        else:
            log.warning("skipping %s: not a regular file, directory or symlink", os.fsdecode(rel))
            self.skipped.append(os.fsdecode(rel))
            return None
        if entry is None:
            return None
        self.index.put_entry(entry)
        self.next_ino += 1
        return entry

    # -- entries -----------------------------------------------------------------------------------

    def _common(self, st: os.stat_result, rel: bytes) -> dict:
        key = (st.st_uid, st.st_gid)
        owner = self.owners.get(key)
        if owner is None:
            owner = len(self.owners)
            if owner >= fmt.MAX_OWNERS:
                raise PackError("the tree has more distinct (uid, gid) pairs than a bundle holds")
            self.owners[key] = owner
            self.index.put_owner(owner, *key)
        user_data = b""
        if self.options.user_data is not None:
            user_data = self.options.user_data(rel, st) or b""
            if len(user_data) > fmt.MAX_USER_DATA:
                raise PackError(
                    f"user data for {os.fsdecode(rel)} is over {fmt.MAX_USER_DATA} bytes"
                )
        return dict(
            mode=statmod.S_IFMT(st.st_mode) | statmod.S_IMODE(st.st_mode),
            owner=owner,
            mtime_ns=st.st_mtime_ns,
            user_data=user_data,
        )

    def _dir_entry(self, ino, name, st, parent, rel) -> fmt.Entry:
        self.counts["dirs"] += 1
        # Placeholder: _pack_directory rewrites it (same length) once its children are known.
        return fmt.Entry(
            ino=ino,
            size=0,
            name=name,
            parent=parent,
            first_child=0,
            nlink=2,
            **self._common(st, rel),
        )

    def _symlink_entry(self, ino, name, st, rel) -> fmt.Entry | None:
        try:
            target = os.readlink(os.path.join(self.source, rel))
        except OSError as e:
            self._source_error(rel, e)
            return None
        if not 1 <= len(target) <= fmt.MAX_SYMLINK_TARGET:
            self._source_error(rel, OSError(errno.ENAMETOOLONG, "symlink target too long"))
            return None
        self.counts["symlinks"] += 1
        return fmt.Entry(
            ino=ino, size=len(target), name=name, symlink=target, **self._common(st, rel)
        )

    def _file_entry(self, ino, name, st, rel, probe: _Probe) -> fmt.Entry | None:
        link_key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and link_key in self.hardlinks:
            first = self.hardlinks[link_key]
            first[1] += 1
            self.counts["hardlinks"] += 1
            target: fmt.Entry = first[0]
            return fmt.Entry(
                ino=ino,
                mode=target.mode,
                owner=target.owner,
                mtime_ns=target.mtime_ns,
                size=target.size,
                name=name,
                flags=fmt.FLAG_LINK,
                target=target.ino,
            )
        if probe.data is not None:
            stored = self._store_bytes(rel, probe.data, probe.before, probe.after)
        else:
            stored = self._store_content(rel, st)
        if stored is None:
            return None
        shard, offset, size, crc, st = stored
        flags = fmt.FLAG_NLINK if st.st_nlink > 1 else 0
        entry = fmt.Entry(
            ino=ino,
            size=size,
            name=name,
            flags=flags,
            shard=shard,
            offset=offset,
            crc32c=crc,
            nlink=1,
            **self._common(st, rel),
        )
        if st.st_nlink > 1:
            self.hardlinks[link_key] = [entry, 1]
        self.counts["files"] += 1
        self.counts["data_bytes"] += size
        self.progress.files += 1
        return entry

    def _store_content(self, rel: bytes, st: os.stat_result):
        """Copy a file into the current shard: (shard, offset, size, crc, stat) or None if skipped.

        What is stored is exactly the bytes read, with their own size and CRC, so a file that
        changes while being read is stored consistently (and reported).
        """
        path = os.path.join(self.source, rel)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            self._source_error(rel, e)
            return None
        try:
            before = os.fstat(fd)
            if not statmod.S_ISREG(before.st_mode):
                self._source_error(rel, OSError(errno.EINVAL, "no longer a regular file"))
                return None
            shard = self._shard_for(before.st_size)
            offset = shard.stream_size
            crc, size = 0, 0
            while True:
                try:
                    chunk = os.read(fd, _READ_CHUNK)
                except OSError as e:
                    # Skipped with skip_errors like any unreadable file; the bytes already in the
                    # shard stream belong to no entry, which readers never notice.
                    self._source_error(rel, e)
                    return None
                if not chunk:
                    break
                shard.write(chunk)
                crc = crc32c(chunk, crc)
                size += len(chunk)
                self.progress.bytes_read += len(chunk)
                self._tick()
            after = os.fstat(fd)
        finally:
            os.close(fd)
        return self._stored(rel, shard, offset, size, crc, before, after)

    def _store_bytes(self, rel: bytes, data: bytes, before, after):
        """Store content a reader thread already read whole (same result as _store_content)."""
        shard = self._shard_for(len(data))
        offset = shard.stream_size
        shard.write(data)
        self.progress.bytes_read += len(data)
        self._tick()
        return self._stored(rel, shard, offset, len(data), crc32c(data), before, after)

    def _stored(self, rel, shard: ShardWriter, offset, size, crc, before, after):
        if size != before.st_size or after.st_mtime_ns != before.st_mtime_ns:
            log.warning("%s changed while it was packed; stored the bytes read", os.fsdecode(rel))
            self.changed.append(os.fsdecode(rel))
        return shard.index, offset, size, crc, before

    # -- shards and records ------------------------------------------------------------------------

    def _shard_for(self, size: int) -> ShardWriter:
        shard = self.shard
        if (
            shard is not None
            and shard.stream_size
            and (
                # The stream size, not the file size: it does not wait on compression threads,
                # so where shards are cut never depends on timing.
                shard.stream_size >= self.options.shard_size
                or shard.stream_size + size > fmt.MAX_SHARD_STREAM
            )
        ):
            self._close_shard()
            shard = None
        if shard is None:
            index = len(self.shards)
            if index >= fmt.MAX_SHARDS:
                raise PackError("the bundle would need more than 65,536 shards")
            path = os.path.join(self.work, fmt.shard_filename(index))
            shard = self.shard = ShardWriter(path, index, self.config, self.pool)
        if size > self.config.large_file_threshold:
            shard.cut()  # large files start on a record boundary
        return shard

    def _close_shard(self) -> None:
        if self.shard is None:
            return
        info = self.shard.finish()
        self._drain_records()
        self.shards.append(info)
        self.shard = None

    def _drain_records(self) -> None:
        # Only when a shard closes: when records become ready depends on compression threads,
        # and putting them between entries at varying points would change the index's bytes.
        shard = self.shard
        if shard is None:
            return
        for record in shard.records:
            self.index.put_record(record)
            self.progress.bytes_stored += record.stored_length
        shard.records.clear()

    def _finish_hardlinks(self) -> None:
        for entry, names in self.hardlinks.values():
            if names > 1:
                self.index.replace_entry(dataclasses.replace(entry, nlink=names))

    # -- sealing -----------------------------------------------------------------------------------

    def _seal(self, index_path: str) -> fmt.Marker:
        """Hash the index, stamp the shards with the bundle id and write COMPLETE."""
        blake = hashlib.blake2b()
        crc, size = 0, 0
        with open(index_path, "rb", buffering=0) as f:
            while chunk := f.read(4 * 1024 * 1024):
                blake.update(chunk)
                crc = crc32c(chunk, crc)
                size += len(chunk)
        bundle_id = blake.digest()[:16]
        for i in range(len(self.shards)):
            write_shard_header(os.path.join(self.work, fmt.shard_filename(i)), i, bundle_id)
        marker = fmt.Marker(bundle_id, size, crc, len(self.shards))
        marker_path = os.path.join(self.work, fmt.MARKER_NAME)
        with open(marker_path, "wb") as f:
            f.write(fmt.encode_marker(marker, crc32c))
            f.flush()
            os.fsync(f.fileno())
        for d in (os.path.join(self.work, fmt.INDEX_DIR), self.work):
            _fsync_dir(d)
        return marker

    # -- helpers -----------------------------------------------------------------------------------

    def _excluded(self, rel: bytes, name: bytes) -> bool:
        if not self.options.excludes:
            return False
        rel_s, name_s = os.fsdecode(rel), os.fsdecode(name)
        return any(
            fnmatch.fnmatchcase(rel_s, p) or fnmatch.fnmatchcase(name_s, p)
            for p in self.options.excludes
        )

    def _source_error(self, rel: bytes, error: OSError) -> None:
        where = os.fsdecode(rel) or "."
        if not self.options.skip_errors:
            raise PackError(f"cannot read {where}: {error.strerror or error}")
        log.warning("skipping %s: %s", where, error.strerror or error)
        self.skipped.append(where)

    def _tick(self) -> None:
        if self.report is None:
            return
        now = time.monotonic()
        if now - self._last_report >= 0.2:
            self._last_report = now
            self.report(self.progress)


def _config_counts(p: _Packer) -> dict:
    return dict(
        shard_count=len(p.shards),
        owner_count=len(p.owners),
        entry_count=p.next_ino - 1,
        file_count=p.counts["files"],
        dir_count=p.counts["dirs"],
        symlink_count=p.counts["symlinks"],
        hardlink_count=p.counts["hardlinks"],
        data_bytes=p.counts["data_bytes"],
        created_ns=int(os.environ["SOURCE_DATE_EPOCH"]) * 10**9
        if os.environ.get("SOURCE_DATE_EPOCH", "").isdigit()
        else 0,
    )


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
# renameat2 refusals that mean "not here" (old kernel or libc, or a filesystem such as NFS without
# the flag), so the portable sequence of plain renames is used instead.
_NO_RENAMEAT2 = (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP)


@functools.cache
def _libc_renameat2():
    func = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if func is not None:
        func.argtypes = [
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_uint,
        ]
        func.restype = ctypes.c_int
    return func


def _renameat2(src: str, dst: str, flags: int) -> None:
    """renameat2(2); OSError(ENOSYS) where libc does not have it."""
    func = _libc_renameat2()
    if func is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), src)
    if func(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), src, None, dst)


def _publish(work: str, dest: str, force: bool) -> None:
    """Move the finished bundle at ``work`` to ``dest``; with ``force``, replace the bundle there.

    A new DEST is made by one rename that never replaces anything. An existing bundle is swapped
    with the new one in one step (RENAME_EXCHANGE), so readers never find DEST missing, and then
    removed from ``work``, where it landed, while the caller still holds the work lock.
    """
    if not os.path.lexists(dest):
        try:
            _move_new(work, dest)
        except FileExistsError:
            pass  # appeared while packing: replaced below if allowed, like one there before
        except OSError as e:
            raise PackError(f"cannot move the new bundle to {dest}: {e.strerror}") from e
        else:
            _sync_parent(dest)
            return
    if not force:
        raise PackError(f"{dest} appeared while packing; the new bundle was discarded")
    if not _is_bundle(dest):
        raise PackError(_NOT_A_BUNDLE)
    # Lock the old bundle too: once at ``work`` it is in the cleaners' namespace.
    old_lock = _lock_directory(dest)
    try:
        old = _swap(work, dest)
        _sync_parent(dest)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        os.close(old_lock)


def _move_new(work: str, dest: str) -> None:
    try:
        _renameat2(work, dest, _RENAME_NOREPLACE)
        return
    except OSError as e:
        if e.errno not in _NO_RENAMEAT2:
            raise
    if os.path.lexists(dest):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dest)
    os.rename(work, dest)


def _swap(work: str, dest: str) -> str:
    """Put the bundle at ``work`` in place of the one at ``dest``; return where the old one is."""
    try:
        _renameat2(work, dest, _RENAME_EXCHANGE)
        return work
    except OSError as e:
        if e.errno not in _NO_RENAMEAT2:
            raise PackError(f"cannot replace {dest} with the new bundle: {e.strerror}") from e
    # Without RENAME_EXCHANGE DEST is missing between the two renames. The old bundle waits under
    # a name no cleaner removes, so a packer killed in between loses nothing.
    parent, name = os.path.split(os.path.abspath(dest))
    aside = os.path.join(parent, f".{name}{_ASIDE_TAG}{os.getpid()}")
    try:
        os.rename(dest, aside)
    except OSError as e:
        raise PackError(f"cannot move the old bundle at {dest} aside: {e.strerror}") from e
    try:
        os.rename(work, dest)
    except OSError as e:
        try:
            os.rename(aside, dest)
        except OSError:
            raise PackError(
                f"cannot move the new bundle to {dest} ({e.strerror}) nor the old one back; "
                f"the old bundle is at {aside}"
            ) from e
        raise PackError(f"cannot move the new bundle to {dest}: {e.strerror}") from e
    return aside


def _sync_parent(dest: str) -> None:
    try:
        _fsync_dir(os.path.dirname(os.path.abspath(dest)))
    except OSError as e:
        raise PackError(
            f"the bundle is at {dest}, but its directory could not be synced to disk: {e.strerror}"
        ) from e
