"""The one object-store client: a private fsspec file system with bounded network waits, made
from a per-protocol profile table, and the classes of the errors a back-end raises.

A back-end needs bounding because its defaults (botocore's 60 s read timeout and 5 retries of
its own, under s3fs's own loop of 5) would hang a read for minutes before our bound even starts.
What bounding one back-end takes is its entry in ``PROFILES``: which storage options set its
timeouts and its own retries, which retry loop of its own to switch off, and which of its
exceptions are credential failures or fatal, whether it can list a directory and be published
to, and (http) a file system class of our own. A new back-end (gcs, azure) is one entry here
and one class of the store contract (tests/store/test_store_contract.py)
(docs/architecture.md, "Where the next features go"); a protocol without one gets no bounds
beyond ours (``Fetcher``, storage/objectstore/fetcher.py).

Every user (the reader's ``Fetcher``, the index fetch, the listing, the upload) makes its file
system here; nothing else in bundlefs builds one for an object store.

May import: the standard library, ``bundlefs.errors``, ``bundlefs.storage.location``,
``bundlefs.storage.objectstore.http`` (lazily); fsspec only through ``Location.filesystem`` and
``http`` (lazily: it is an optional extra).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

from bundlefs.errors import BundleError, StorageError
from bundlefs.storage.location import Location

# The store timeout (--store-timeout) bounds what the first reader of an outage waits.
DEFAULT_STORE_TIMEOUT = 20.0
CONNECT_TIMEOUT = 5  # a reader's connection attempt, at most (and at most the store timeout)


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The waits a file system is made with."""

    connect_timeout: float
    read_timeout: float  # for each answer
    attempts: int  # the back-end's own attempts per request (1: ours are the only retries)


@dataclasses.dataclass(frozen=True)
class BackendProfile:
    """What bounding one fsspec back-end takes. The user's own storage options win."""

    # Set the back-end's timeouts and retries in a copy of the storage options.
    bound: Callable[[dict[str, Any], Bounds], None] | None = None
    # An attribute of the file system holding a retry loop of its own around its client's
    # (an int): set to 1, so that it does not multiply the bound.
    retry_loop: str | None = None
    # Exception class names: credentials missing or refused (retrying cannot help), and any
    # other failure no retry can fix.
    credential_errors: frozenset[str] = frozenset()
    fatal_errors: frozenset[str] = frozenset()
    # Makes the file system from the storage options, in place of fsspec's registered class.
    factory: Callable[..., Any] | None = None
    # Whether a "directory" can be listed (verify's check for stray shards, the sentence for a
    # missing marker) and whether a pack may publish there. A web server does neither.
    lists: bool = True
    writable: bool = True


def _bound_s3(options: dict[str, Any], bounds: Bounds) -> None:
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("connect_timeout", bounds.connect_timeout)
    config.setdefault("read_timeout", bounds.read_timeout)
    retries: dict[str, Any] = {"total_max_attempts": bounds.attempts}
    if bounds.attempts > 1:
        retries = {"mode": "standard", **retries}
    config.setdefault("retries", retries)
    options["config_kwargs"] = config


_S3 = BackendProfile(
    bound=_bound_s3,
    retry_loop="retries",  # s3fs's own loop (5 tries on timeouts)
    # What botocore raises before sending anything.
    credential_errors=frozenset(
        {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}
    ),
)


def _bound_http(options: dict[str, Any], bounds: Bounds) -> None:
    from bundlefs.storage.objectstore.http import bound_http

    bound_http(options, bounds.connect_timeout, bounds.read_timeout)


def _http_filesystem(**options: Any) -> Any:
    from bundlefs.storage.objectstore.http import RangeHTTPFileSystem

    return RangeHTTPFileSystem(**options)


# Any web server that answers range requests; aiohttp retries nothing of its own.
_HTTP = BackendProfile(
    bound=_bound_http,
    factory=_http_filesystem,
    # A certificate refused (untrusted, expired, another host's) stays refused.
    fatal_errors=frozenset({"ClientConnectorCertificateError"}),
    lists=False,
    writable=False,
)
# fsspec's in-process store (one dict per process): nothing to bound, nothing can stall; it
# lists and takes uploads. For tests and for programs that build and read bundles in memory.
_MEMORY = BackendProfile()
S3_PROTOCOLS = ("s3", "s3a")
PROFILES: dict[str, BackendProfile] = {
    **dict.fromkeys(S3_PROTOCOLS, _S3),
    **dict.fromkeys(("http", "https"), _HTTP),
    "memory": _MEMORY,
}
_UNBOUNDED = BackendProfile()
_CREDENTIAL_ERRORS = frozenset().union(*(p.credential_errors for p in PROFILES.values()))
_FATAL_ERRORS = frozenset().union(*(p.fatal_errors for p in PROFILES.values()))


def profile_of(location: Location) -> BackendProfile:
    """What bounding ``location``'s back-end takes, and what it can do."""
    return PROFILES.get(location.protocol, _UNBOUNDED)


def check_store_timeout(seconds: float) -> float:
    """``seconds`` if it is a usable store timeout, else ``StorageError`` in one sentence."""
    if not 0 < seconds <= 3600:  # also refuses NaN
        raise StorageError(
            f"the store timeout must be more than 0 and at most 3600 seconds, not {seconds}"
        )
    return float(seconds)


def remote_filesystem(
    location: Location,
    timeout: float = DEFAULT_STORE_TIMEOUT,
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    backend_attempts: int = 1,
) -> Any:
    """A private fsspec file system for ``location`` with bounded network waits.

    Private (not fsspec's shared instance): its retry settings are ours, and a writer in the same
    process keeps its own. By default the back-end's retries are turned off and ours
    (``Fetcher``) are the only ones, and its read timeout is ``timeout``, so the bound is one
    number; the upload keeps ``backend_attempts`` of the back-end's own (storage/objectstore/
    upload.py). The user's own settings (``config_kwargs`` on S3) win where given.
    """
    profile = profile_of(location)
    options = dict(location.storage_options)
    if profile.bound is not None:
        with contextlib.suppress(ImportError):  # the file system's own sentence names the extra
            profile.bound(options, Bounds(min(connect_timeout, timeout), timeout, backend_attempts))
    options["skip_instance_cache"] = True
    fs = dataclasses.replace(location, storage_options=options).filesystem(profile.factory)
    if profile.retry_loop is not None and isinstance(getattr(fs, profile.retry_loop, None), int):
        setattr(fs, profile.retry_loop, 1)  # ours (or the client's) replaces it
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
    if type(e).__name__ in _CREDENTIAL_ERRORS or type(e).__name__ in _FATAL_ERRORS:
        return True
    return isinstance(e, (TypeError, ValueError, AttributeError)) and not isinstance(e, OSError)


def is_denied(e: Exception) -> bool:
    """Whether the store refused us (or we had no credentials to show it)."""
    return isinstance(e, PermissionError) or type(e).__name__ in _CREDENTIAL_ERRORS


def is_stall(e: Exception | None, seconds: float, timeout: float) -> bool:
    """Whether a failed attempt was the store not answering (a timeout), not a quick refusal."""
    if e is None:
        return False
    if seconds >= 0.8 * timeout or isinstance(e, TimeoutError):
        return True
    text = f"{type(e).__name__} {e}".lower()
    return "timeout" in text or "timed out" in text
