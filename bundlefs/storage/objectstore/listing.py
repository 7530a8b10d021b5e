"""Objects under a prefix of an object store, as a pack source sees them: ``ObjectStore``.

``ObjectStore(location)`` lists every object below a prefix (``s3://bucket/some/prefix/``), in
key order, as ``ObjectInfo`` (the key relative to the prefix, the size, LastModified in ns), and
reads objects: whole (``read``, for small ones) or streamed in bounded ranged GETs
(``open``: at most ``WINDOW`` bytes in memory per open object). The tree those keys imply, and
what a key may be, are the packer's business (``bundlefs.packing.sources.objects``).

Requests are bounded as the remote reader's are: a private file system with bounded network
waits and the back-end's own retries off (storage/objectstore/client.py), and every listing page
and GET made at most ``fetcher.ATTEMPTS`` times with backoff. On S3 the listing is
ListObjectsV2 page by page (1,000 keys; only one page is held here), so keys come back exactly as
stored, "//" and all; other stores go through fsspec's ``find``.

May import: the standard library, ``bundlefs.errors``, ``bundlefs.storage.location``,
``bundlefs.storage.objectstore.{client, fetcher}``; fsspec only through the client.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from bundlefs.errors import BundleError, PackError
from bundlefs.storage.location import Location, has_scheme
from bundlefs.storage.objectstore.client import (
    S3_PROTOCOLS,
    error_reason,
    is_denied,
    is_fatal,
    remote_filesystem,
)
from bundlefs.storage.objectstore.fetcher import ATTEMPTS, BACKOFF, BACKOFF_MAX, Fetcher

# One ranged GET of a large object: large enough that per-request latency stops dominating,
# small enough that an object being packed never holds more than this in memory.
WINDOW = 8 * 1024 * 1024
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object below the prefix. ``key`` is relative to it (a directory marker's ends in
    "/"); ``size`` and ``mtime_ns`` (LastModified) are the listing's."""

    key: str
    size: int
    mtime_ns: int


def _mtime_ns(value: Any) -> int:
    """LastModified (a datetime from botocore; fsspec back-ends also say a float or ISO text)."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        since = value - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
        return (since.days * 86400 + since.seconds) * 10**9 + since.microseconds * 1000
    if isinstance(value, int | float):
        return int(value * 10**9)
    if isinstance(value, str) and value:
        return _mtime_ns(datetime.datetime.fromisoformat(value.replace("Z", "+00:00")))
    return 0


class ObjectStore:
    """The objects below ``location`` (a remote ``Location``: its path is bucket/prefix).

    The prefix is a "directory": ``s3://b/data`` lists ``data/…``, never ``data-old/…``. Made in
    the process that uses it (a Dask task makes its own); the file system is made on first use.
    """

    def __init__(self, location: Location) -> None:
        if location.is_local:
            raise ValueError("ObjectStore lists remote locations only")
        self.location = location
        self.url = location.url
        self.root = location.path.strip("/")
        # No outage warnings: a failed GET is the pack's own sentence (or a skipped object).
        self._fetcher = Fetcher(
            lambda: remote_filesystem(location), location.url, log_outages=False
        )

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    # -- listing -----------------------------------------------------------------------------------

    def list(self) -> Iterator[ObjectInfo]:
        """Every object below the prefix, in key order (UTF-8 bytes order, as S3 lists them).

        Raises ``PackError`` (one sentence) if the store cannot be listed: unreachable after the
        retries, a missing bucket, refused credentials."""
        try:
            fs = self._fetcher.fs
        except BundleError as e:  # fsspec or its back-end missing: the location names the extra
            raise PackError(str(e)) from None
        if self.location.protocol in S3_PROTOCOLS and hasattr(fs, "call_s3"):
            yield from self._list_s3(fs)
        else:
            yield from self._list_fsspec(fs)

    def _list_s3(self, fs: Any) -> Iterator[ObjectInfo]:
        bucket, _, key_prefix = self.root.partition("/")
        prefix = key_prefix + "/" if key_prefix else ""
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        while True:
            page = self._listing(lambda: fs.call_s3("list_objects_v2", **kwargs))
            for item in page.get("Contents", ()):
                key = item["Key"][len(prefix) :]
                if key:  # the prefix's own marker is the root
                    yield ObjectInfo(key, int(item["Size"]), _mtime_ns(item.get("LastModified")))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs["ContinuationToken"] = token

    def _list_fsspec(self, fs: Any) -> Iterator[ObjectInfo]:
        with contextlib.suppress(Exception):
            fs.invalidate_cache(self.root)
        found: dict[str, Any] = self._listing(lambda: fs.find(self.root, detail=True))
        prefix = self.root + "/"
        infos = []
        for name, info in found.items():
            name = name.strip("/")  # memory:// lists "/bucket/key"
            if name.startswith(prefix) and info.get("type", "file") == "file":
                mtime = (
                    info.get("LastModified")
                    or info.get("mtime")
                    or info.get("updated")
                    or info.get("created")  # memory://
                )
                infos.append(
                    ObjectInfo(name[len(prefix) :], int(info.get("size") or 0), _mtime_ns(mtime))
                )
        infos.sort(key=lambda o: o.key.encode("utf-8", "surrogateescape"))
        yield from infos

    def _listing(self, call: Callable[[], _T]) -> _T:
        """One listing request, retried as the reader's GETs are; a ``PackError`` if it fails."""
        last: Exception | None = None
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(min(BACKOFF * 2 ** (attempt - 1), BACKOFF_MAX))
            try:
                return call()
            except Exception as e:  # noqa: BLE001 - back-ends raise their own types
                if is_denied(e):
                    raise PackError(
                        f"access to {self.url} was denied while listing it "
                        f"({error_reason(e)}); check the credentials (the environment, a "
                        "profile or --storage-option)"
                    ) from None
                if isinstance(e, FileNotFoundError):
                    bucket = self.root.split("/", 1)[0]
                    raise PackError(
                        f"cannot list {self.url}: the bucket {bucket} does not exist"
                    ) from None
                if is_fatal(e):
                    raise PackError(f"cannot list {self.url}: {error_reason(e)}") from None
                last = e
        assert last is not None
        raise PackError(
            f"cannot list {self.url} after {ATTEMPTS} attempts: {error_reason(last)}"
        ) from None

    # -- reading -----------------------------------------------------------------------------------

    def read(self, key: str) -> bytes:
        """The whole object (a small one). Raises ``OSError`` (retried first, as the reader's
        GETs: ``EIO`` once the bound is reached)."""
        return self._fetcher.get(self._path(key))

    def open(self, key: str) -> ObjectReader:
        """The object streamed in ranged GETs of ``WINDOW`` bytes, to its end."""
        return ObjectReader(self._fetcher, self._path(key))


class ObjectReader:
    """One object read once from start to end; holds at most ``WINDOW`` bytes. Reads on until a
    GET comes back short, so an object that grew since it was listed is read whole (and the
    packer says it changed); one that shrank simply ends sooner."""

    def __init__(self, fetcher: Fetcher, path: str) -> None:
        self._fetcher = fetcher
        self._path = path
        self._pos = 0  # of the next GET
        self._buffer = memoryview(b"")
        self._ended = False

    def read(self, size: int) -> bytes:
        if not self._buffer and not self._ended:
            data = self._fetcher.get(self._path, self._pos, self._pos + WINDOW)
            self._pos += len(data)
            self._ended = len(data) < WINDOW
            self._buffer = memoryview(data)
        chunk, self._buffer = self._buffer[:size], self._buffer[size:]
        return bytes(chunk)

    def close(self) -> None:
        self._buffer = memoryview(b"")
        self._ended = True


def is_remote_prefix(text: str) -> bool:
    """Whether a pack's SRC is a URL of a store (not a path, not ``file://``)."""
    return has_scheme(text) and text.partition("://")[0].lower() not in ("file", "local")
