"""Shards in base bundles (format version 6): where a base is, whether it is still the bundle the
index names, and ``BasedShardStore``, one ``ShardStore`` over a bundle's own shards and its bases'.

A version-6 shard table may name a shard file in base ``k`` (docs/format.md §3.5, §3.11): a pack
to an object store on a base there references the base's shards instead of uploading them again.
``bundle_store`` opens what a reader reads through: the bundle's own store and, when it has bases,
one store per base (each base's ``COMPLETE`` checked once, at open: a base that is missing or
another bundle now is one ``BaseBundleError`` sentence), behind a ``BasedShardStore`` that routes
``fmt.store_name``'s ``k/shard-…`` names to base ``k``'s store. ``ShardSet`` and everything above
it read a bundle with bases as they read any other: there is no second read path.

Chains stay flat: a pack on a base that has bases of its own names those bases directly
(packing/remote_base.py), so a shard is always one hop from the bundle that reads it.

May import: the standard library, ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``
below it (``location``, ``marker``, ``store``, ``index``, ``objectstore``: only where a store
is on one, so that opening a local bundle imports none of it — the mount's start).
"""

from __future__ import annotations

import errno
import os
import posixpath
from collections.abc import Callable

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.errors import BaseBundleError, BundleError, NotABundleError, ShardUnavailable
from bundlefs.storage.index import IndexReader
from bundlefs.storage.location import Location, has_scheme, parse_location
from bundlefs.storage.marker import read_marker
from bundlefs.storage.store import FailedRead, LocalShardStore, ShardStore, ShardStoreBase

# Makes the store of a bundle on an object store: (location, bundle id, shard name -> size).
RemoteStoreFactory = Callable[[Location, bytes, dict[str, int]], ShardStore]


def resolve_base(location: Location, stored: str) -> Location:
    """Where the base stored as ``stored`` (an absolute URL, or a location relative to this
    bundle's) is, for the bundle at ``location``; the base shares its storage options."""
    if has_scheme(stored):
        return parse_location(stored, location.storage_options)
    if location.is_local:
        path = os.path.normpath(os.path.join(location.path, stored))
        return Location(path, "file", path, {})
    path = posixpath.normpath(posixpath.join(location.path, stored))
    if path.startswith("..") or path in (".", "") or os.path.isabs(stored):
        raise fmt.FormatError(f"a base's location {stored!r} leads out of the store")
    url = f"{location.protocol}://{path}"
    return Location(url, location.protocol, path, location.storage_options)


def relative_location(new: Location, base: Location) -> str:
    """How the bundle at ``new`` names ``base`` in its ``bases``: relative on the same store (a
    bucket moved or mirrored whole keeps working), else the base's URL."""
    if new.protocol != base.protocol or new.is_local:
        return base.url
    return posixpath.relpath(base.path, new.path.rstrip("/"))


def base_marker(location: Location) -> fmt.Marker:
    """The ``COMPLETE`` of the bundle at ``location`` now (an object store's fetched, not
    cached); ``NotABundleError`` when there is none."""
    if location.is_local:
        return read_marker(location.path)
    from bundlefs.storage.objectstore.index_fetch import fetch_marker

    return fmt.decode_marker(fetch_marker(location), crc32c)


def check_base(bundle: str, number: int, base: fmt.BaseRef, where: Location) -> None:
    """That base ``number`` of ``bundle`` is at ``where`` and still the bundle it was packed on:
    one ``BaseBundleError`` sentence if not."""
    try:
        marker = base_marker(where)
    except NotABundleError as e:
        raise BaseBundleError(
            f"{bundle} keeps shards in its base {where.url}, which is missing ({e})"
        ) from None
    except BundleError as e:
        raise BaseBundleError(f"{bundle} cannot reach its base {where.url}: {e}") from None
    if marker.bundle_id != base.bundle_id:
        raise BaseBundleError(
            f"{bundle} keeps shards in its base {where.url}, which has been replaced by another "
            f"bundle (bundle id {marker.bundle_id.hex()[:12]}…, packed on "
            f"{base.bundle_id.hex()[:12]}…)"
        )


def bundle_store(
    location: Location, index: IndexReader, remote: RemoteStoreFactory, bundle: str
) -> ShardStore:
    """The store the bundle at ``location`` (``index`` its index; ``bundle`` its name in
    messages) reads its shards through: its own, or with bases a ``BasedShardStore`` over its
    own and one per base, each base checked first."""
    if location.is_local and not index.bases:
        return LocalShardStore(location.path)  # no descriptor read at open: a local file's size
    sizes = _sizes(index)
    places = [resolve_base(location, base.location) for base in index.bases]
    for number, (base, where) in enumerate(zip(index.bases, places, strict=True), 1):
        check_base(bundle, number, base, where)

    def store(where: Location, bundle_id: bytes, number: int) -> ShardStore:
        if where.is_local:
            return LocalShardStore(where.path)
        return remote(where, bundle_id, sizes.get(number, {}))

    own = store(location, index.marker.bundle_id, 0)
    if not index.bases:
        return own
    stores: dict[int, ShardStore] = {}
    try:
        for number, (base, where) in enumerate(zip(index.bases, places, strict=True), 1):
            stores[number] = store(where, base.bundle_id, number)
    except BaseException:
        for opened in (own, *stores.values()):
            opened.close()
        raise
    return BasedShardStore(own, stores, dict(enumerate(places, 1)))


def _sizes(index: IndexReader) -> dict[int, dict[str, int]]:
    """Base (0: the bundle itself) → shard file name there → its size, from the shard table:
    what bounds a remote store's coalesced GETs to each object (one index get per shard)."""
    version = index.marker.format_version
    sizes: dict[int, dict[str, int]] = {0: {}}
    for shard in range(index.config.shard_count):
        info = index.shard_info(shard)
        name = fmt.store_name(shard, version, info).rpartition("/")[2]
        sizes.setdefault(info.base, {})[name] = info.file_size
    return sizes


class BasedShardStore(ShardStoreBase):
    """A bundle's own shard store and its bases' stores as one ``ShardStore``: a name ``k/NAME``
    (``fmt.store_name``) is ``NAME`` in base ``k``'s store, any other the bundle's own. It can do
    what its weakest store can (cheap slices only if every store has them), and may stall or
    hold copies if any store does."""

    def __init__(
        self, own: ShardStore, bases: dict[int, ShardStore], places: dict[int, Location]
    ) -> None:
        self.own = own
        self.bases = bases
        self.places = places  # where each base is
        stores = [own, *bases.values()]
        self.partial_reads_cheap = all(s.partial_reads_cheap for s in stores)
        self.reads_may_stall = any(s.reads_may_stall for s in stores)
        self.holds_copies = any(s.holds_copies for s in stores)

    def route(self, name: str) -> tuple[ShardStore, str]:
        """The store that holds ``name``, and its name there."""
        head, slash, rest = name.partition("/")
        if not slash:
            return self.own, name
        store = self.bases.get(int(head)) if head.isdigit() else None
        if store is None:
            raise ShardUnavailable(errno.ENOENT, "no such base", name)
        return store, rest

    def where(self, name: str) -> str | None:
        """The path or URL of a shard in a base (None: one of the bundle's own)."""
        head, slash, rest = name.partition("/")
        place = self.places.get(int(head)) if slash and head.isdigit() else None
        return None if place is None else place.child(rest)

    def read(self, name: str, offset: int, length: int, *, nowait: bool = False) -> bytes:
        store, inner = self.route(name)
        return store.read(inner, offset, length, nowait=nowait)

    def read_into(
        self, name: str, offset: int, buffer: bytearray | memoryview, *, nowait: bool = False
    ) -> int:
        store, inner = self.route(name)
        return store.read_into(inner, offset, buffer, nowait=nowait)

    def prefetch(self, name: str, offset: int, length: int) -> None:
        try:
            store, inner = self.route(name)
        except OSError:
            return
        store.prefetch(inner, offset, length)

    def discard(self, name: str, offset: int, length: int) -> None:
        store, inner = self.route(name)
        store.discard(inner, offset, length)

    def size_and_header(self, name: str, length: int) -> tuple[int, bytes]:
        """The shard file's size and first ``length`` bytes as its store holds them now."""
        store, inner = self.route(name)
        if not isinstance(store, LocalShardStore):
            from bundlefs.storage.objectstore.shard_store import RemoteShardStore

            assert isinstance(store, RemoteShardStore)
            return store.size_and_header(inner, length)
        size = store.file_size(inner)
        if size is None:
            raise ShardUnavailable(errno.ENOENT, "No such file or directory", inner)
        return size, store.read(inner, 0, length)

    def forked(self) -> None:
        for store in (self.own, *self.bases.values()):
            store.forked()

    def stats(self) -> dict[str, object] | None:
        return self.own.stats()

    def failed_read(self, path: str | None, shard: int | None, record: int | None) -> FailedRead:
        stalls = [s for s in (self.own, *self.bases.values()) if s.reads_may_stall]
        return (stalls[0] if stalls else self.own).failed_read(path, shard, record)

    def close(self) -> None:
        for store in (self.own, *self.bases.values()):
            store.close()
