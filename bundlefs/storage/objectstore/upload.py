"""Publishing a bundle to an object store (``s3://…``): upload, completion marker last.

An object store has no rename, so the local recipe (build beside DEST, rename into place) becomes:
the packer builds and seals the bundle in a local staging directory as always, then
``RemotePublisher.publish`` uploads it so that a reader never opens a half-uploaded bundle:

1. list what is under the URL now: nothing, a bundle (``COMPLETE`` there: refused without
   ``force``), what an interrupted upload left (bundle objects, no ``COMPLETE``: overwritten,
   as a killed local pack leaves nothing at DEST), or anything else (refused even with ``force``;
   a bundle others keep shards in is refused too, references.py);
2. with ``force``, delete the old ``COMPLETE`` first: from then on nothing opens the URL, so no
   reader can ever pair the old marker with new objects;
3. upload the index (and its page checksums) and the shards but those in a base (``shared``),
   in parallel (fsspec's ``put_file``, multipart for large objects), counting bytes as the
   back-end reports them (s3fs: per multipart part, or per object) for the progress;
4. check what landed with cheap requests: every object's size (a HEAD each) and every shard's
   header (a 32-byte ranged GET: it names the bundle, so a concurrent pack to the same URL that
   overwrote a shard is caught here rather than by a reader), then leave the bases' markers;
5. upload ``COMPLETE`` (one small PUT, atomic on the stores fsspec reaches);
6. delete the old bundle's objects the new one does not have (extra shards).

Killed before step 5: no ``COMPLETE``, nothing opens, a later pack overwrites the leftovers.
Interrupted (Ctrl-C, SIGTERM/SIGHUP): what was uploaded is deleted, marker first (``_withdraw``).
Every failure of the store is one ``PackError`` sentence.

May import: the standard library, ``bundlefs.core``, ``bundlefs.errors``,
``bundlefs.storage.{location, marker}``, ``bundlefs.storage.objectstore.{client,
upload_progress}``; fsspec only through the client.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.core.format.pages import FIRST_PAGE_CHECK_VERSION, PAGES_FILE
from bundlefs.errors import BundleError, PackError, note_cleanup
from bundlefs.storage.location import Location
from bundlefs.storage.marker import not_a_bundle, read_marker
from bundlefs.storage.objectstore.client import error_reason, profile_of, remote_filesystem
from bundlefs.storage.objectstore.references import (
    REFERENCED_BY,
    SharedShards,
    refuse_if_referenced,
)
from bundlefs.storage.objectstore.upload_progress import ByteCounter, Upload, UploadProgress

log = logging.getLogger(__name__)

# Objects uploaded at once. Each is a large object (a multipart upload of its own in s3fs) or the
# index; more than this rarely adds throughput and multiplies the memory of buffered parts.
DEFAULT_UPLOAD_JOBS = 8

CONNECT_TIMEOUT = 10
# How long a request may wait for the store's answer (botocore's read timeout: the wait for each
# byte of the response, from the end of the request's body). Listings, HEADs, deletes, the
# 32-byte GETs and the 52-byte COMPLETE are answered at once by a store that works: 20 s, as
# the reader's GETs. A store answers an uploaded object (or a multipart part, up to s3fs's
# 50 MiB) only once it has stored all of it, and a loaded Ceph or MinIO can take tens of seconds
# for that; a timed-out upload is sent again whole, so a tight bound would turn a slow store
# into repeated uploads: 60 s for those.
READ_TIMEOUT = 20
UPLOAD_READ_TIMEOUT = 60
ATTEMPTS = 4  # per request, 5xx, throttling and connection failures retried with backoff

_INDEX_OBJECT = f"{fmt.INDEX_DIR}/{fmt.INDEX_FILE}"
_PAGES_OBJECTS = ((), (f"{fmt.INDEX_DIR}/{PAGES_FILE}",))  # [from version 6]: page checksums
# What a bundle (or an interrupted upload of one) may hold under its URL: the marker, the index
# (a lock file a tool left is harmless) and shards named as either format version names them.
# A bundle others keep shards in (version 6) also holds their markers (references.py).
_BUNDLE_OBJECT = re.compile(
    rf"{fmt.MARKER_NAME}|{fmt.INDEX_DIR}/(data\.mdb|lock\.mdb|{PAGES_FILE})"
    rf"|{fmt.SHARD_PREFIX}[0-9a-f]{{8}}|{REFERENCED_BY}/[0-9a-f]{{32}}"
)


@dataclass(frozen=True)
class RemoteState:
    """What is under a bundle URL: relative object names and their sizes."""

    objects: dict[str, int]

    @property
    def complete(self) -> bool:
        return fmt.MARKER_NAME in self.objects

    @property
    def foreign(self) -> list[str]:
        """Objects no bundle has: their presence means the URL holds something else."""
        return sorted(n for n in self.objects if not _BUNDLE_OBJECT.fullmatch(n))


def _filesystem(location: Location, read_timeout: int) -> Any:
    """A private fsspec file system for uploading to ``location`` (storage/objectstore/client.py).

    Private, so its settings are not those of the instance a reader in this process shares. For
    S3, bounded: botocore's retries (``ATTEMPTS`` with backoff) are the only ones, s3fs's own
    loop (5 tries of botocore's 4 on a timeout) is turned off, and every request waits at most
    ``read_timeout`` for its answer; a transient failure is retried, and a store that stays down
    or stops answering is one sentence after ``ATTEMPTS`` times the timeout (docs/storage.md,
    "URLs and credentials"). The user's own ``config_kwargs`` win.
    """
    return remote_filesystem(
        location, read_timeout, connect_timeout=CONNECT_TIMEOUT, backend_attempts=ATTEMPTS
    )


class RemotePublisher:
    """Uploads a sealed bundle to ``location`` (a remote ``Location``)."""

    def __init__(self, location: Location, *, jobs: int = DEFAULT_UPLOAD_JOBS) -> None:
        if location.is_local:
            raise ValueError("RemotePublisher publishes to remote locations only")
        if not profile_of(location).writable:
            raise PackError(
                f"cannot pack to {location.url}: {location.protocol}:// bundles are read-only "
                "(publish to a directory or an object store, and serve that)"
            )
        self.location = location
        self.url = location.url
        self.jobs = max(1, jobs)
        try:
            # Two clients: what must be answered at once, and the uploads of whole objects,
            # which may take the store longer to answer (UPLOAD_READ_TIMEOUT).
            self.fs = _filesystem(location, READ_TIMEOUT)
            self.upload_fs = _filesystem(location, UPLOAD_READ_TIMEOUT)
        except BundleError as e:  # fsspec or its back-end missing: the location names the extra
            raise PackError(str(e)) from None
        self.root = location.path.rstrip("/")
        self.uploaded: UploadProgress | None = None  # the last publish's, once it ran
        self._upload_count = Upload(UploadProgress(0, 0), None)
        self._running: list[Future[None]] = []  # uploads under way when an interruption came
        # Shards not uploaded: in a base, or copied from one on the store (a pack on a base).
        self.shared: SharedShards | None = None

    # -- errors ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def store_errors(self, doing: str) -> Iterator[None]:
        """Any failure of the store while ``doing`` as one PackError sentence.

        fsspec back-ends raise their own types for network failures (botocore's
        ``EndpointConnectionError``, aiohttp's, google's…), none of them importable here without
        importing every back-end, so everything but our own errors is caught and described.
        """
        try:
            yield
        except BundleError:
            raise
        except PermissionError as e:
            raise PackError(
                f"access to {self.url} was denied while {doing} ({error_reason(e)}); check the "
                "credentials (the environment, a profile or --storage-option)"
            ) from None
        except FileNotFoundError as e:
            raise PackError(f"cannot publish to {self.url}: {error_reason(e)}") from None
        except Exception as e:  # noqa: BLE001 - see the docstring
            reason = error_reason(e)
            raise PackError(f"cannot publish to {self.url} while {doing}: {reason}") from None

    # -- what is there ---------------------------------------------------------------------------

    def _object(self, name: str) -> str:
        return f"{self.root}/{name}"

    def scan(self) -> RemoteState:
        """List the objects under the URL (a listing the back-end has cached is not trusted)."""
        with self.store_errors("listing what is there"):
            self.fs.invalidate_cache(self.root)
            found: dict[str, Any] = self.fs.find(self.root, detail=True)
        objects: dict[str, int] = {}
        root = self.root.lstrip("/")
        prefix = root + "/"
        for name, info in found.items():
            name = name.strip("/")  # memory:// lists "/bucket/key"
            if name == root:
                # An object named exactly like the bundle: a file where a bundle would go. When
                # the listing finds nothing, s3fs answers with the root's own info, a "directory"
                # whenever anything is under it (a concurrent pack's objects appearing, say):
                # that is no object.
                if info.get("type", "file") == "file":
                    objects[""] = int(info.get("size") or 0)
            elif name.startswith(prefix) and info.get("type", "file") == "file":
                objects[name[len(prefix) :]] = int(info.get("size") or 0)
        return RemoteState(objects)

    def check(self, force: bool) -> RemoteState:
        """Refuse a URL that holds a bundle (unless ``force``) or anything that is not one.

        Called before packing (a bad URL, missing bucket or bad credentials fail at once) and
        again before uploading (something may have appeared meanwhile).
        """
        state = self.scan()
        if state.foreign:
            raise not_a_bundle(self.url)
        if state.complete and not force:
            raise PackError(f"{self.url} already exists (use --force to replace it)")
        if state.complete:
            with self.store_errors("looking for bundles that use its shards"):
                refuse_if_referenced(self.location, self.fs, "replaced")
        return state

    # -- publishing ------------------------------------------------------------------------------

    def publish(
        self,
        work: str,
        force: bool,
        *,
        uploaded: Callable[[str, int], None] | None = None,
        progress: Callable[[UploadProgress], None] | None = None,
    ) -> UploadProgress:
        """Upload the sealed bundle at ``work`` (a local directory) to the URL, marker last.

        ``uploaded`` is called with each object's name and size once it is in the store;
        ``progress`` (from the upload threads, one call at a time) as bytes arrive. Returns what
        was uploaded and how long it took, as ``self.uploaded`` keeps it.
        """
        marker = read_marker(work)
        shared = self.shared or SharedShards()
        shards = (fmt.shard_filename(i, marker.format_version) for i in range(marker.shard_count))
        paged = _PAGES_OBJECTS[marker.format_version >= FIRST_PAGE_CHECK_VERSION]
        names = [_INDEX_OBJECT, *paged, *(n for n in shards if n not in shared.names)]
        sizes = {name: os.path.getsize(os.path.join(work, name)) for name in names}
        counted = UploadProgress(sum(sizes.values()) + fmt.MARKER_SIZE, len(names) + 1)
        self.uploaded = counted
        self._upload_count = Upload(counted, progress)
        state = self.check(force)
        if state.complete:
            # First, so that from here on nothing opens the URL: a reader never pairs the old
            # marker with new shards or index.
            with self.store_errors("removing the old completion marker"):
                self.fs.rm_file(self._object(fmt.MARKER_NAME))
        try:
            self._parallel(
                names, lambda name: self._upload(work, name, uploaded), "uploading the bundle"
            )
            copies = list(shared.copies)
            if copies:
                self._parallel(copies, lambda n: shared.copy(self.fs, self.root, n), "copying")
            self._parallel(
                names,
                lambda name: self._check_uploaded(work, name, sizes[name]),
                "checking uploads",
            )
            with self.store_errors("checking the shards in the base"):
                shared.check(self.fs, self.root, self.url)
                shared.mark(self.fs, self.url, marker.bundle_id)  # before COMPLETE: never missed
            with self.store_errors("writing the completion marker"):
                self._upload(work, fmt.MARKER_NAME, uploaded, small=True)
                self._check_uploaded(work, fmt.MARKER_NAME, fmt.MARKER_SIZE, published=True)
        except KeyboardInterrupt as e:
            withdrawn = [fmt.MARKER_NAME, *names, *shared.copies]
            note_cleanup(e, self._withdraw(withdrawn, replaced=state.complete))
            raise
        counted.seconds = time.monotonic() - counted.started
        stale = sorted(set(state.objects) - set(names) - set(shared.copies) - {fmt.MARKER_NAME})
        if stale:
            self._remove_stale(stale)
        return counted

    def _withdraw(self, names: list[str], *, replaced: bool) -> str:
        """After an interruption: delete what this publish uploaded (the marker first, if it got
        that far), once the uploads under way have ended. Returns what it did, in words."""
        # The uploads running when the interruption came are not cancelled by it (the threads
        # finish them before the process can exit); deleting before they land would leave them.
        wait(self._running)
        self._running = []
        said = f"the bundle that was at {self.url} no longer opens" if replaced else ""
        try:
            there = self.scan().objects
            gone = [n for n in names if n in there]
            for name in gone:
                self.fs.rm_file(self._object(name))
        except Exception as e:  # noqa: BLE001 - any back-end's failure: say it, as it is
            return (
                f"could not remove what it had uploaded to {self.url} ({error_reason(e)}): "
                "nothing opens there, and a later pack to it replaces it"
            ) + (f"; {said}" if said else "")
        objects = "object" if len(gone) == 1 else "objects"
        done = f"removed the {len(gone)} {objects} it had uploaded to {self.url}"
        return done + (f" ({said}: its completion marker went first)" if said else "")

    def _upload(
        self,
        work: str,
        name: str,
        uploaded: Callable[[str, int], None] | None,
        *,
        small: bool = False,
    ) -> None:
        local = os.path.join(work, name)
        size = os.path.getsize(local)
        counter = ByteCounter(self._upload_count, size)
        fs = self.fs if small else self.upload_fs
        fs.put_file(local, self._object(name), callback=counter)
        counter.absolute_update(size)  # a back-end that reports nothing is counted whole here
        self._upload_count.add(0, objects=1)
        if uploaded is not None:
            uploaded(name, size)

    def _check_uploaded(self, work: str, name: str, size: int, *, published: bool = False) -> None:
        """That ``name`` is in the store with ``size`` bytes, and a shard names this bundle.

        ``published``: ``name`` is the marker just uploaded, so the URL may already open.
        """
        remote = self._object(name)
        self.fs.invalidate_cache(remote)
        got = self.fs.info(remote).get("size")
        if got != size:
            outcome = (
                # The marker is there (whose, we cannot tell): readers open whatever it names,
                # and refuse what does not match it.
                "the completion marker is on the store, so what opens there may be another "
                "pack's bundle; check it with bundlefs verify"
                if published
                else "the bundle was not published"
            )
            raise PackError(
                f"{self.url}/{name} holds {got} bytes after the upload, not {size} (another "
                f"pack to the same URL?); {outcome}"
            )
        if name.startswith(fmt.SHARD_PREFIX):
            # The local shard's header (this bundle's, or the bundle a merge linked it from:
            # the shard table says which) must be what the store now holds.
            header = self.fs.cat_file(remote, start=0, end=fmt.SHARD_HEADER_SIZE)
            with open(os.path.join(work, name), "rb") as f:
                expected = f.read(fmt.SHARD_HEADER_SIZE)
            if header != expected:
                raise PackError(
                    f"{self.url}/{name} is not the shard just uploaded (another pack to the same "
                    "URL?); the bundle was not published"
                )

    def _parallel(self, names: list[str], task: Callable[[str], None], doing: str) -> None:
        """Run ``task`` on every name, ``jobs`` at a time; the first failure stops the rest."""
        with self.store_errors(doing):
            if self.jobs == 1 or len(names) == 1:
                for name in names:
                    task(name)
                return
            pool = ThreadPoolExecutor(min(self.jobs, len(names)))
            futures: list[Future[None]] = []
            try:
                for name in names:
                    futures.append(pool.submit(task, name))
                wait(futures, return_when=FIRST_EXCEPTION)
            except BaseException:
                # ^C (or SystemExit): `with` would wait for every upload queued. The ones not
                # started never start, the caller removes the staging directory and exits;
                # COMPLETE is never written. The ones running are kept for ``_withdraw``.
                pool.shutdown(wait=False, cancel_futures=True)
                self._running = [f for f in futures if not f.done()]
                raise
            # A failure: the rest are cancelled, but the ones running are waited for, so that
            # nothing of this pack is still being written when it returns (a caller that packs
            # again at once would race its own leftovers).
            pool.shutdown(cancel_futures=True)
            failed = [f for f in futures if not f.cancelled() and f.exception() is not None]
            if failed:
                raise failed[0].exception()  # type: ignore[misc]

    def _remove_stale(self, names: list[str]) -> None:
        """Delete what the old bundle had and the new one lacks. The new bundle is published
        already, so a failure here is a warning, as a local old bundle left behind would be."""
        try:
            self.fs.rm([self._object(n) for n in names])
        except Exception as e:  # noqa: BLE001 - any back-end's failure: the bundle is fine
            log.warning(
                "%s is published, but %d objects of the bundle it replaced could not be "
                "removed: %s",
                self.url,
                len(names),
                error_reason(e),
            )
        else:
            log.debug("removed %d objects of the replaced bundle at %s", len(names), self.url)


def staging_path(location: Location, staging: str | None) -> str:
    """The local stand-in DEST the packer stages a remote bundle beside: in ``staging`` (else
    the temporary directory), named after the URL's last component, so the stale-partial sweep
    and ``bundlefs gc`` find what a killed pack left there."""
    import tempfile

    directory = staging if staging else tempfile.gettempdir()
    if not os.path.isdir(directory):
        raise PackError(f"the staging directory {directory} does not exist")
    name = location.path.rstrip("/").rsplit("/", 1)[-1] or "bundle"
    return os.path.join(os.path.abspath(directory), name)
