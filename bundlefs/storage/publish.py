"""Staging and publishing a bundle: nothing is ever seen at DEST but a complete bundle.

A bundle is built in a temporary sibling ``.NAME.partial-PID`` (``stage``) and moved into place
only once sealed (``seal``, then ``publish``). The packer holds an exclusive ``flock`` on that
directory until it is done, old bundle removed and all; ``remove_stale_partials`` deletes only
siblings nobody holds locked, so a killed packer's leftovers go and a live one's stay, across PID
namespaces and hosts. ``find_partials`` and ``remove_dead_partials`` apply the same test to every
partial in a directory (``bundlefs gc``, and ``info`` mentioning leftovers). The completion marker
``COMPLETE`` is written last (``write_marker``, storage/marker.py).

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage.marker``,
``bundlefs.storage.shard_writer``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.core.format.pages import PAGES_FILE, encode_page_table, lmdb_page_size, page_crcs
from bundlefs.core.libc import RENAME_EXCHANGE, RENAME_NOREPLACE, renameat2
from bundlefs.errors import (
    PackError,
    note_cleanup,
)
from bundlefs.storage.marker import (
    ANY_PARTIAL,
    PARTIAL_TAG,
    is_bundle,
    not_a_bundle,
    write_marker,
)
from bundlefs.storage.shard_writer import write_shard_header

log = logging.getLogger(__name__)

_ASIDE_TAG = ".previous-"  # the old bundle during a two-rename replacement; never auto-removed
# renameat2 refusals that mean "not here" (old kernel or libc, or a filesystem such as NFS without
# the flag), so the portable sequence of plain renames is used instead.
_NO_RENAMEAT2 = (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP)


# -- staging ---------------------------------------------------------------------------------------


def partial_dir(dest: str) -> str:
    """The temporary sibling this process builds the bundle for ``dest`` in."""
    parent, name = os.path.split(os.path.abspath(dest))
    return os.path.join(parent, f".{name}{PARTIAL_TAG}{os.getpid()}")


@dataclass(frozen=True)
class Partial:
    """A temporary ``.NAME.partial-PID`` directory: a pack in progress, or one that was killed."""

    path: str
    in_use: bool  # a packer holds its lock: it is being written (or the filesystem cannot tell)
    size: int  # bytes allocated on disk, what removing it frees

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "in_use": self.in_use, "bytes": self.size}


def _partial_names(directory: str, bundle_name: str | None) -> list[str]:
    """The names in ``directory`` that are partials (of ``bundle_name`` only, if given), sorted."""
    if bundle_name is not None:
        prefix = f".{bundle_name}{PARTIAL_TAG}"
        return sorted(n for n in os.listdir(directory) if n.startswith(prefix))
    # Any bundle's: only names exactly as ``partial_dir`` makes them, so a directory of the
    # user's that merely contains the tag is never taken for one.
    return sorted(n for n in os.listdir(directory) if ANY_PARTIAL.fullmatch(n))


@contextlib.contextmanager
def _unless_held(path: str) -> Iterator[bool | None]:
    """Lock the partial at ``path`` for the body if nobody holds it: yields True (locked),
    False (a live packer holds it, or the filesystem cannot lock) or None (not a directory).

    A packer holds an exclusive flock on its directory until it has finished, so one that can be
    locked belongs to a packer that is gone (the kernel, or the NFS lock manager, dropped its
    lock). Holding the lock while deleting keeps a packer that reuses the PID from starting in it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        yield None  # gone already, or not a directory: not ours to delete
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False  # a live packer holds it (or the filesystem cannot tell us: keep it)
            return
        yield True
    finally:
        os.close(fd)


def _disk_usage(path: str) -> int:
    total = 0
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
    return total


def find_partials(directory: str, bundle_name: str | None = None) -> list[Partial]:
    """The partials in ``directory`` (of ``bundle_name`` only, if given), live and dead.

    Raises ``OSError`` if ``directory`` cannot be listed.
    """
    return _scan_partials(directory, bundle_name, remove=False)


def remove_dead_partials(directory: str, bundle_name: str | None = None) -> list[Partial]:
    """Remove the partials in ``directory`` nobody holds locked (of ``bundle_name`` only, if
    given): what killed packs left. Returns every partial found, the removed ones with
    ``in_use`` False. Raises ``OSError`` if ``directory`` cannot be listed.
    """
    return _scan_partials(directory, bundle_name, remove=True)


def remove_stale_partials(dest: str) -> list[str]:
    """Remove the temporary siblings of interrupted packs to ``dest``: those nobody holds locked.

    Returns the names removed; a sibling that is locked, or is not a directory, is left.
    """
    parent, name = os.path.split(os.path.abspath(dest))
    try:
        found = remove_dead_partials(parent, name)
    except OSError:
        return []
    return [os.path.basename(p.path) for p in found if not p.in_use]


def _scan_partials(directory: str, bundle_name: str | None, *, remove: bool) -> list[Partial]:
    found = []
    for name in _partial_names(directory, bundle_name):
        path = os.path.join(directory, name)
        with _unless_held(path) as unheld:
            if unheld is None:
                continue
            found.append(Partial(path, in_use=not unheld, size=_disk_usage(path)))
            if unheld and remove:
                shutil.rmtree(path, ignore_errors=True)
    return found


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


@contextlib.contextmanager
def stage(dest: str, what: str = "partial bundle") -> Iterator[tuple[str, tuple[int, int]]]:
    """A fresh, locked temporary sibling of ``dest``: yields (its path, its (st_dev, st_ino)).

    Stale siblings of killed packers are removed first. If the body raises, the directory is
    removed (an interruption notes so on its exception, ``note_cleanup``, naming it ``what``:
    ``extract`` stages a "partial tree"); either way the lock is held until the body is done
    (publishing included).
    """
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
        st = os.fstat(lock)
        yield work, (st.st_dev, st.st_ino)
    except BaseException as e:
        shutil.rmtree(work, ignore_errors=True)
        if isinstance(e, KeyboardInterrupt):
            note_cleanup(e, _removed(work, what), work)
        raise
    finally:
        os.close(lock)


def _removed(path: str, what: str) -> str:
    """What an interruption's clean-up of ``path`` did, said as it is (a removal may fail)."""
    if os.path.lexists(path):
        return f"could not remove the {what} {path} ('bundlefs gc' removes it)"
    return f"removed the {what} {path}"


# -- sealing ---------------------------------------------------------------------------------------


def seal(work: str, shard_count: int, own_shards: Iterable[int] | None = None) -> fmt.Marker:
    """Hash the closed index, stamp the shards this bundle wrote (``own_shards``; None: all)
    with the bundle id and write ``COMPLETE``. Shards linked from other bundles keep their
    headers, which the shard table names."""
    blake = hashlib.blake2b()
    crc, size, pages, page_size = 0, 0, [], 0
    with open(os.path.join(work, fmt.INDEX_DIR, fmt.INDEX_FILE), "rb", buffering=0) as f:
        while chunk := f.read(4 * 1024 * 1024):  # a multiple of every LMDB page size
            blake.update(chunk)
            crc = crc32c(chunk, crc)
            page_size = page_size or lmdb_page_size(chunk)
            pages += page_crcs(chunk, page_size, crc32c)
            size += len(chunk)
    bundle_id = blake.digest()[:16]
    # Version 6: a CRC per index page, so readers check pages as they use them (§3.10).
    with open(os.path.join(work, fmt.INDEX_DIR, PAGES_FILE), "wb") as f:
        f.write(encode_page_table(page_size, bundle_id, pages, crc32c))
        os.fsync(f.fileno())
    for i in range(shard_count) if own_shards is None else own_shards:
        write_shard_header(os.path.join(work, fmt.shard_filename(i)), i, bundle_id)
    marker = fmt.Marker(bundle_id, size, crc, shard_count)
    write_marker(work, marker)
    for d in (os.path.join(work, fmt.INDEX_DIR), work):
        _fsync_dir(d)
    return marker


# -- publishing ------------------------------------------------------------------------------------


def publish(work: str, dest: str, force: bool) -> None:
    """Move the finished bundle at ``work`` to ``dest``; with ``force``, replace the bundle there.

    A new DEST is made by one rename that never replaces anything. An existing bundle is swapped
    with the new one in one step (RENAME_EXCHANGE), so readers never find DEST missing, and then
    removed from ``work``, where it landed, while the caller still holds the work lock.
    """
    if not os.path.lexists(dest):
        try:
            move_new(work, dest)
        except FileExistsError:
            pass  # appeared while packing: replaced below if allowed, like one there before
        except OSError as e:
            raise PackError(f"cannot move the new bundle to {dest}: {e.strerror}") from e
        else:
            _sync_parent(dest)
            return
    if not force:
        raise PackError(f"{dest} appeared while packing; the new bundle was discarded")
    if not is_bundle(dest):
        raise not_a_bundle(dest)
    # Lock the old bundle too: once at ``work`` it is in the cleaners' namespace.
    old_lock = _lock_directory(dest)
    try:
        old = _swap(work, dest)
        _sync_parent(dest)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        os.close(old_lock)


def move_new(work: str, dest: str) -> None:
    """Rename ``work`` to ``dest``, never replacing anything there (``FileExistsError``)."""
    try:
        renameat2(work, dest, RENAME_NOREPLACE)
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
        renameat2(work, dest, RENAME_EXCHANGE)
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


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
