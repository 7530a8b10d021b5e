"""Where a bundle lives: a local directory, or a URL on a store fsspec reaches (s3://, gs://, …).

Every place a bundle is named (pack's DEST, ``Bundle(...)``, info, ls, cat, extract, verify,
mount, fsspec's ``fo=``) parses it with ``parse_location``. A plain path, or ``file://``, is local
and handled as it always was; anything else with a ``scheme://`` is remote and goes through
fsspec (s3fs for S3, which also serves S3-compatible stores through ``endpoint_url``).
Credentials and endpoints come from where fsspec's back-ends look (environment, profiles) and from
``storage_options`` (the CLI's ``--storage-option key=value``; ``BUNDLEFS_STORAGE_OPTIONS``, a JSON
object, for programs that cannot pass them, such as a mount started by systemd).

May import: the standard library, ``bundlefs.errors``; fsspec, lazily (it is an optional extra).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from bundlefs.errors import BundleError, UsageError

ENV_STORAGE_OPTIONS = "BUNDLEFS_STORAGE_OPTIONS"
# Which extra installs the fsspec back-end of a protocol, for the error when it is missing.
_EXTRA_OF = {"s3": "s3", "s3a": "s3"}


@dataclass(frozen=True)
class Location:
    """A parsed bundle location. ``path`` is the local path or the URL without its scheme."""

    url: str  # as the user wrote it (a local path stays a path)
    protocol: str  # "file" for a local bundle
    path: str
    # Not in the repr: it holds credentials, and a Location ends up in logs and tracebacks.
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def is_local(self) -> bool:
        return self.protocol == "file"

    def child(self, name: str) -> str:
        """The URL (or local path) of a file inside the bundle."""
        if self.is_local:
            return os.path.join(self.path, name)
        return f"{self.protocol}://{self.path.rstrip('/')}/{name}"

    def filesystem(self):
        """The fsspec file system of a remote location (``BundleError`` naming the extra if
        fsspec or the protocol's back-end is not installed)."""
        return open_filesystem(self.protocol, self.storage_options)


def has_scheme(text: str) -> bool:
    head, sep, _ = text.partition("://")
    return bool(sep) and head.isascii() and head.replace("+", "").replace("-", "").isalnum()


def parse_location(
    text: str | os.PathLike, storage_options: dict[str, Any] | None = None
) -> Location:
    """A local path, ``file://PATH`` or ``PROTOCOL://BUCKET/KEY``."""
    text = os.fsdecode(os.fspath(text))
    options = dict(env_storage_options())
    options.update(storage_options or {})
    if not has_scheme(text):
        return Location(text, "file", text, {})
    protocol, _, path = text.partition("://")
    protocol = protocol.lower()
    if protocol in ("file", "local"):
        return Location(text, "file", path or "/", {})
    if not path.strip("/"):
        raise BundleError(f"{text} names no bucket or path")
    return Location(text, protocol, path.rstrip("/"), options)


def env_storage_options() -> dict[str, Any]:
    raw = os.environ.get(ENV_STORAGE_OPTIONS, "")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise BundleError(f"{ENV_STORAGE_OPTIONS} is not a JSON object") from None
    if not isinstance(value, dict):
        raise BundleError(f"{ENV_STORAGE_OPTIONS} is not a JSON object")
    return value


def parse_storage_options(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``key=value`` pairs (the CLI's ``--storage-option``). A value that parses as JSON (a
    number, true/false, an object) is taken as that; dotted keys nest (``client_kwargs.region_name
    =eu-west-1``), as s3fs expects some options."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--storage-option {item!r}: expected KEY=VALUE")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        target = options
        *parents, leaf = key.split(".")
        for part in parents:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise BundleError(f"--storage-option {item!r}: {part} is not an object")
        target[leaf] = value
    return options


def open_filesystem(protocol: str, storage_options: dict[str, Any]):
    try:
        import fsspec  # type: ignore[import-untyped]
    except ImportError:
        raise BundleError(
            f"{protocol}:// locations need fsspec: "
            f"pip install 'bundlefs[{_EXTRA_OF.get(protocol, 'fsspec')}]'"
        ) from None
    try:
        return fsspec.filesystem(protocol, **storage_options)
    except ImportError:
        extra = _EXTRA_OF.get(protocol)
        hint = f"pip install 'bundlefs[{extra}]'" if extra else "install its fsspec back-end"
        raise BundleError(
            f"{protocol}:// locations need a package that is not installed: {hint}"
        ) from None
    except ValueError as e:  # an unknown protocol
        raise BundleError(f"{protocol}:// is not a storage fsspec knows: {e}") from None
