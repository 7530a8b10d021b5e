"""``BundleParts``: a bundle's storage opened and put together, local or on an object store.

The one place a bundle is opened from its location: the index (the bundle's own, or one fetched
into the local cache and checked against the marker), the shard store (a directory, or a
``RemoteShardStore`` bounded by the shard table's sizes; with bases, format version 6, a
``BasedShardStore`` over it and its bases' stores), the ``ShardSet`` over it, and the two
models above them, ``TreeModel`` and ``ContentReader`` — closing what was opened if a later step
fails. ``Bundle`` is a facade over one; ``verify`` opens one with its own settings (no records on
disk, the index already checked). The record cache is a parameter, so a caller may share one.

Everything that names a concrete store lives here: the layers above see a ``ShardSet``. The
object-store modules are imported only for a bundle at a URL: a local bundle's open (a mount's
start) loads none of them.
May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.read``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bundlefs.core import format as fmt
from bundlefs.errors import CorruptDataError
from bundlefs.read.cache import RecordCache
from bundlefs.read.content import ContentReader
from bundlefs.read.options import ReadOptions
from bundlefs.read.tree import TreeModel
from bundlefs.storage.bases import BasedShardStore, RemoteStoreFactory, bundle_store
from bundlefs.storage.codec import zstd_module
from bundlefs.storage.index import IndexReader
from bundlefs.storage.location import Location
from bundlefs.storage.shards import ShardSet
from bundlefs.storage.store import FailedRead, LocalShardStore, ShardStore

if TYPE_CHECKING:
    from bundlefs.storage.objectstore.shard_store import RemoteShardStore


def store_timeout(options: ReadOptions) -> float:
    """The remote store's timeout in seconds, checked (``StorageError`` if unusable)."""
    from bundlefs.storage.objectstore.client import DEFAULT_STORE_TIMEOUT, check_store_timeout

    given = options.remote.store_timeout
    return check_store_timeout(DEFAULT_STORE_TIMEOUT if given is None else given)


def index_directory(location: Location, options: ReadOptions, *, whole: bool = False) -> str:
    """The directory holding the bundle's marker and index on this machine: a local bundle's
    own, or a bundle at a URL's copy in the disk cache, fetched if not there and checked against
    the marker (a download always, a cached copy when ``check_index``). From version 6 that
    copy is sparse, filled as lookups need pages, unless ``whole`` (``verify``)."""
    if location.is_local:
        return location.path
    from bundlefs.storage.objectstore.index_fetch import fetch_index

    return fetch_index(
        location,
        options.remote.disk_cache,
        check=options.check_index,
        timeout=store_timeout(options),
        whole=whole,
    )


def _remote_stores(options: ReadOptions, own: tuple[Location, Any] | None) -> RemoteStoreFactory:
    """What makes the ``RemoteShardStore`` of a bundle (or a base) at a URL with ``options``;
    ``own``: the bundle's location and the file system its index was fetched through, which its
    store starts with (a new client costs ~0.3 s of a cold first byte on this machine)."""

    def remote(location: Location, bundle_id: bytes, sizes: dict[str, int]) -> ShardStore:
        from bundlefs.storage.objectstore.shard_store import RemoteShardStore

        # The shards' sizes bound coalesced GETs to each object (one index get per shard).
        return RemoteShardStore(
            location,
            bundle_id,
            shard_sizes=sizes,
            disk_cache=options.remote.disk_cache,
            disk_cache_size=options.remote.disk_cache_size,
            store_timeout=store_timeout(options),
            session=own[1] if own is not None and own[0] == location else None,
        )

    return remote


@dataclass
class BundleParts:
    """The open pieces of one bundle, bottom first; ``close`` closes them all."""

    location: Location
    path: str  # a local bundle's directory, or the URL: what messages name
    index: IndexReader
    store: ShardStore  # local, remote, or a BasedShardStore over those (a bundle with bases)
    shards: ShardSet
    tree: TreeModel
    content: ContentReader
    owns_cache: bool = True  # False: the record cache was given, and outlives these parts

    @classmethod
    def open(
        cls,
        location: Location,
        options: ReadOptions,
        *,
        record_cache: RecordCache | None = None,
        index_dir: str | None = None,
    ) -> BundleParts:
        """Open the bundle at ``location``. ``record_cache``: the cache of decompressed records
        to read through (default: a new one of ``options.cache_size`` bytes). ``index_dir``: the
        index, already fetched and checked (``index_directory``)."""
        path = location.path if location.is_local else location.url
        own = None
        stores: list[RemoteShardStore] = []  # the bundle's own remote store, once made
        if location.is_local:
            index = IndexReader(index_dir or path, check_checksum=options.check_index)
        else:
            from bundlefs.storage.objectstore.client import remote_filesystem
            from bundlefs.storage.objectstore.index_fetch import open_index

            own = (location, remote_filesystem(location, store_timeout(options)))
            index = open_index(
                location,
                options.remote.disk_cache,
                check=options.check_index,
                timeout=store_timeout(options),
                index_dir=index_dir,
                filesystem=own[1],
                outage=lambda: bool(stores) and stores[0].in_outage,
            )
        try:
            if index.config.record_codec == fmt.COMPRESSION_ZSTD:
                zstd_module()  # a missing binding is refused at open, not at the first read
            # Its own shards' store; with bases (version 6), each base checked and routed to.
            store = bundle_store(location, index, _remote_stores(options, own), path)
            mine = store.own if isinstance(store, BasedShardStore) else store
            if not location.is_local:
                from bundlefs.storage.objectstore.shard_store import RemoteShardStore

                stores.extend([mine] if isinstance(mine, RemoteShardStore) else [])
        except BaseException:
            index.close()
            raise
        shards = ShardSet(store, index.marker, index.shard_info)
        try:
            tree = TreeModel(index, name_cache=options.name_cache)
        except BaseException:
            shards.close()  # and the bundle directory's descriptor with it
            index.close()
            raise
        cache = RecordCache(options.cache_size) if record_cache is None else record_cache
        content = ContentReader(index, shards, cache, bundle_path=path, path_of=tree.path_of)
        return cls(location, path, index, store, shards, tree, content, record_cache is None)

    @property
    def remote(self) -> RemoteShardStore | None:
        """The object store a bundle at a URL is read from (its own shards'); None for a local
        bundle."""
        if self.location.is_local:
            return None  # its own shards are files (a base may be remote: not this store)
        from bundlefs.storage.objectstore.shard_store import RemoteShardStore

        own = self.store.own if isinstance(self.store, BasedShardStore) else self.store
        return own if isinstance(own, RemoteShardStore) else None

    def where(self, name: str) -> str:
        """The path or URL of shard ``name`` (``fmt.store_name``): in this bundle or a base."""
        store = self.store
        place = store.where(name) if isinstance(store, BasedShardStore) else None
        return self.location.child(name) if place is None else place

    def size_and_header(self, name: str) -> tuple[int, bytes]:
        """Shard ``name``'s (``fmt.store_name``) size and header block, as its store holds them
        now (not from a cache): what ``verify`` checks of each shard."""
        store = self.store
        if isinstance(store, BasedShardStore):
            return store.size_and_header(name, fmt.SHARD_HEADER_SIZE)
        if not isinstance(store, LocalShardStore):
            from bundlefs.storage.objectstore.shard_store import RemoteShardStore

            assert isinstance(store, RemoteShardStore)
            return store.size_and_header(name, fmt.SHARD_HEADER_SIZE)
        with open(self.location.child(name), "rb") as f:
            return os.fstat(f.fileno()).st_size, f.read(fmt.SHARD_HEADER_SIZE)

    def storage_stats(self) -> dict[str, object] | None:
        """A bundle at a URL: its store's counters; None for a local bundle."""
        return self.store.stats()

    def failed_read(self, error: CorruptDataError) -> FailedRead:
        """Whether a read that failed with ``error`` is damage or the object store's outage."""
        if error.unreadable:
            # Bytes the store did not deliver (a checksum mismatch is damage, outage or not).
            return self.store.failed_read(error.path, error.shard, error.record)
        return FailedRead.DAMAGE

    def forked(self) -> None:
        """In a child after ``fork()``: drop what the parent's threads held."""
        self.content.forked()
        self.tree.forked()
        self.store.forked()

    def close(self) -> None:
        """Close the shards and the index, and drop the caches this bundle owns."""
        self.shards.close()
        self.index.close()
        if self.owns_cache:
            self.content.cache.clear()
        self.tree.clear()
