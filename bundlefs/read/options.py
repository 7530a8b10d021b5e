"""``ReadOptions``: how a bundle is opened for reading, in one value.

Every reader of a bundle — ``Bundle``, ``verify``, the mount, the CLI, the fsspec file system —
takes these same settings; they are listed here once. ``RemoteOptions`` are the ones that mean
something only to a bundle at a URL (storage/location.py): the store's fsspec options, the
on-disk cache and the store's timeout. ``Bundle(path, cache_size=…, storage_options=…)`` keeps
taking them as keywords; ``ReadOptions.with_keywords`` is how those keywords become one value.

May import: nothing of ``bundlefs`` (the CLI imports it before it needs a reader).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, TypedDict

DEFAULT_CACHE_SIZE = 256 * 1024 * 1024
DEFAULT_NAME_CACHE = 131_072  # names (~100 bytes each) of recently searched directories


@dataclass(frozen=True)
class RemoteOptions:
    """How a bundle at a URL is read; a local bundle ignores them (docs/storage.md).

    ``storage_options`` go to the store's fsspec back-end (credentials, endpoint; merged over
    ``BUNDLEFS_STORAGE_OPTIONS``); ``disk_cache`` is the local cache directory (the fetched index
    and, up to ``disk_cache_size`` bytes, fetched records; default ``$XDG_CACHE_HOME/bundlefs``;
    size 0 keeps no records on disk); ``store_timeout`` bounds in seconds what a read waits for an
    unanswering store (default 20; docs/storage.md, "Outages"). None: the default.
    """

    storage_options: dict[str, Any] | None = None
    disk_cache: str | os.PathLike[str] | None = None  # a path-like is kept as its string
    disk_cache_size: int | None = None
    store_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.disk_cache is not None:  # a path-like pickles as the string it names
            object.__setattr__(self, "disk_cache", os.fspath(self.disk_cache))

    def given(self) -> dict[str, Any]:
        """The options that were set, as ``Bundle`` keywords (none for a local bundle)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


_REMOTE_FIELDS = frozenset(f.name for f in dataclasses.fields(RemoteOptions))


@dataclass(frozen=True)
class ReadOptions:
    """``cache_size``: bytes of decompressed records held in memory; ``name_cache``: directory
    names held for lookups (0: none, as the mount, which the kernel's dentry cache serves);
    ``check_index``: read the whole index once at open to check its CRC32C; ``remote``: the
    options of a bundle at a URL."""

    cache_size: int = DEFAULT_CACHE_SIZE
    name_cache: int = DEFAULT_NAME_CACHE
    check_index: bool = True
    remote: RemoteOptions = RemoteOptions()

    def with_keywords(self, **keywords: Any) -> ReadOptions:
        """These options with ``Bundle``'s keywords applied (``cache_size=…``,
        ``storage_options=…``: a field of this class or of ``RemoteOptions``); ``TypeError``
        for any other name, as a function call would raise."""
        remote = {k: keywords.pop(k) for k in list(keywords) if k in _REMOTE_FIELDS}
        options = dataclasses.replace(self, **keywords) if keywords else self
        if remote:
            options = dataclasses.replace(
                options, remote=dataclasses.replace(options.remote, **remote)
            )
        return options

    def local(self) -> ReadOptions:
        """Without the remote options (what a local bundle's pickle carries)."""
        return dataclasses.replace(self, remote=RemoteOptions())


class ReadKeywords(TypedDict, total=False):
    """``Bundle``'s keywords, for type checkers: the fields of ``ReadOptions`` and
    ``RemoteOptions`` (tests/library/test_read_parts.py keeps the lists equal)."""

    cache_size: int
    name_cache: int
    check_index: bool
    storage_options: dict[str, Any] | None
    disk_cache: str | os.PathLike[str] | None
    disk_cache_size: int | None
    store_timeout: float | None
