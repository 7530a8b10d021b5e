"""Bundles on a web server (``https://``, ``http://``): fsspec's ``HTTPFileSystem`` with the
answers a ranged GET can get turned into the errors every other store raises.

fsspec's own ``cat_file`` reads whatever body comes back: a server that ignores ``Range``
answers ``200`` with the whole object, so every record read would download the whole shard.
Here a ranged GET answered with anything but ``206 Partial Content`` is refused before its
body is read, in one sentence (``NoRangeSupport``). ``404``/``410`` are ``FileNotFoundError``
(a missing marker reads "not a bundle", a missing shard is damage), ``401``/``403`` are
``PermissionError``, ``416`` (a range past the end) is a short read. Redirects are followed
(aiohttp's default). The client's profile (storage/objectstore/client.py) makes it.

May import: the standard library, ``bundlefs.errors``; fsspec and aiohttp (this module is
imported only where an ``http(s)://`` location is opened: both belong to an optional extra).
"""

from __future__ import annotations

import errno
from typing import Any

from fsspec.implementations.http import HTTPFileSystem  # type: ignore[import-untyped]

from bundlefs.errors import StorageError


class NoRangeSupport(StorageError):
    """The web server answered a ranged GET with the whole object (or another non-206)."""


def bound_http(options: dict[str, Any], connect: float, read: float) -> None:
    """aiohttp's timeouts in a copy of the storage options (the user's own ``timeout`` wins)."""
    import aiohttp

    client = dict(options.get("client_kwargs") or {})
    client.setdefault("timeout", aiohttp.ClientTimeout(sock_connect=connect, sock_read=read))
    options["client_kwargs"] = client


class RangeHTTPFileSystem(HTTPFileSystem):
    """``HTTPFileSystem`` whose ranged reads are ranged or refused."""

    async def _cat_file(
        self, url: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        kw = {**self.kwargs, **kwargs}
        ranged = start is not None or end is not None
        if ranged:
            if start == end:
                return b""
            headers = dict(kw.pop("headers", None) or {})
            headers["Range"] = await self._process_limits(url, start, end)
            kw["headers"] = headers
        session = await self.set_session()
        async with session.get(self.encode_url(url), **kw) as r:
            _raise_for_status(r.status, url)
            if r.status == 416:
                return b""  # the range starts past the end: the object is shorter
            if ranged and r.status != 206:
                # Not read: the body is the whole object, and closing drops the connection.
                raise NoRangeSupport(
                    f"the web server of {url} does not answer range requests (HTTP {r.status} "
                    "to a ranged GET); bundlefs reads bundles only from servers that do"
                )
            return bytes(await r.read())


def _raise_for_status(status: int, url: str) -> None:
    """The errors the reader knows, for the statuses that mean them; a 416 passes (empty)."""
    if status in (404, 410):
        raise FileNotFoundError(errno.ENOENT, f"HTTP {status}", url)
    if status in (401, 403):
        raise PermissionError(errno.EACCES, f"HTTP {status}", url)
    if status >= 400 and status != 416:
        raise OSError(errno.EIO, f"HTTP {status} from {url}")
