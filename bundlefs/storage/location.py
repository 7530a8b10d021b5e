"""Where a bundle lives: a local directory, or a URL on a store fsspec reaches (s3://, gs://, …).

Every place a bundle is named (pack's DEST, ``Bundle(...)``, info, ls, cat, extract, verify,
mount, fsspec's ``fo=``) parses it with ``parse_location``. A plain path, or ``file://``, is local
and handled as it always was; anything else with a ``scheme://`` is remote and goes through
fsspec (s3fs for S3, which also serves S3-compatible stores through ``endpoint_url``).
Credentials and endpoints come from where fsspec's back-ends look (environment, profiles) and from
``storage_options`` (the CLI's ``--storage-option key=value``; ``--storage-options-file``, read
by ``read_storage_options_file``, which refuses a file other users could read;
``BUNDLEFS_STORAGE_OPTIONS``, a JSON object, for programs that cannot pass them).

May import: the standard library, ``bundlefs.errors``; fsspec, lazily (it is an optional extra).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bundlefs.errors import BundleError, StorageOptionsError, StorageOptionSyntaxError

ENV_STORAGE_OPTIONS = "BUNDLEFS_STORAGE_OPTIONS"
# Which extra installs the fsspec back-end of a protocol, for the error when it is missing.
_EXTRA_OF = {"s3": "s3", "s3a": "s3", "http": "http", "https": "http"}
_OPTIONS_FILE_LIMIT = 1 << 20


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

    def filesystem(self, factory: Callable[..., Any] | None = None):
        """The fsspec file system of a remote location (``BundleError`` naming the extra if
        fsspec or the protocol's back-end is not installed), made by ``factory`` (called with
        the storage options) where a client profile has its own class."""
        return open_filesystem(self.protocol, self.storage_options, factory)


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
            raise StorageOptionSyntaxError(f"--storage-option {item!r}: expected KEY=VALUE")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        target = options
        *parents, leaf = key.split(".")
        for part in parents:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise StorageOptionsError(f"--storage-option {item!r}: {part} is not an object")
        target[leaf] = value
    return options


def read_storage_options_file(path: str | os.PathLike) -> dict[str, Any]:
    """Storage options from a file: a JSON object, or ``KEY=VALUE`` lines as ``--storage-option``
    takes them (blank lines and ``#`` comments skipped).

    The file holds credentials, so it is refused unless only its owner can read it (mode 0600 or
    stricter) and that owner is this process's user or root: a pipe (``/dev/fd/N``) and systemd's
    ``LoadCredential=`` files (0400) pass. No message repeats a line of it. A ``/dev/fd/N``
    (N > 2) is closed once read: a pipe handed over by ``bundlefs.cli.scrub`` or a shell, of no
    use drained, and not to be inherited by a daemon.
    """
    name = os.fsdecode(os.fspath(path))
    data = _read_private_file(path, name)
    if len(data) > _OPTIONS_FILE_LIMIT:
        raise StorageOptionsError(f"the storage options file {name} is over 1 MiB")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise StorageOptionsError(f"the storage options file {name} is not UTF-8 text") from None
    if text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise StorageOptionsError(f"the storage options file {name} is not a JSON object")
        return value
    return _parse_option_lines(text, name)


def _read_private_file(path: str | os.PathLike, name: str) -> bytes:
    """Up to one byte over the limit of ``path``, refused unless only its owner (us or root) may
    read it; an inherited ``/dev/fd/N`` (N > 2) is closed once opened."""
    inherited = name.removeprefix("/dev/fd/")
    try:
        with open(path, "rb") as f:
            if inherited.isdigit() and int(inherited) > 2:
                os.close(int(inherited))
            st = os.fstat(f.fileno())
            if st.st_mode & 0o077:
                raise StorageOptionsError(
                    f"refusing the storage options file {name}: other users may read it "
                    f"(mode {st.st_mode & 0o777:04o}); chmod 600 it"
                )
            if st.st_uid not in (os.geteuid(), 0):
                raise StorageOptionsError(
                    f"refusing the storage options file {name}: it is owned by uid {st.st_uid}, "
                    "neither by you nor by root"
                )
            return f.read(_OPTIONS_FILE_LIMIT + 1)
    except OSError as e:
        raise StorageOptionsError(
            f"cannot read the storage options file {name}: {e.strerror}"
        ) from None


def _parse_option_lines(text: str, name: str) -> dict[str, Any]:
    """``KEY=VALUE`` lines (blank lines and ``#`` comments skipped); no message quotes a line."""
    pairs = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise StorageOptionsError(
                f"line {number} of the storage options file {name} is not KEY=VALUE"
            )
        pairs.append(f"{key.strip()}={value.strip()}")
    try:
        return parse_storage_options(pairs)
    except StorageOptionsError:  # a nesting clash; its message would quote the line
        raise StorageOptionsError(
            f"the storage options file {name} nests a key below one that is not an object"
        ) from None


def merged_storage_options(
    files: list[str] | tuple[str, ...], pairs: list[str] | tuple[str, ...]
) -> dict[str, Any]:
    """The options of ``--storage-options-file``s (in order), then of ``--storage-option``
    pairs: a later one wins, key by key."""
    options: dict[str, Any] = {}
    for path in files:
        options.update(read_storage_options_file(path))
    options.update(parse_storage_options(pairs))
    return options


def open_filesystem(
    protocol: str, storage_options: dict[str, Any], factory: Callable[..., Any] | None = None
):
    try:
        import fsspec  # type: ignore[import-untyped]
    except ImportError:
        raise BundleError(
            f"{protocol}:// locations need fsspec: "
            f"pip install 'bundlefs[{_EXTRA_OF.get(protocol, 'fsspec')}]'"
        ) from None
    try:
        if factory is not None:
            return factory(**storage_options)
        return fsspec.filesystem(protocol, **storage_options)
    except ImportError:
        extra = _EXTRA_OF.get(protocol)
        hint = f"pip install 'bundlefs[{extra}]'" if extra else "install its fsspec back-end"
        raise BundleError(
            f"{protocol}:// locations need a package that is not installed: {hint}"
        ) from None
    except ValueError as e:  # an unknown protocol
        raise BundleError(f"{protocol}:// is not a storage fsspec knows: {e}") from None
