"""A pack to an object store on a base there (format version 6): ``RemoteBase``.

The base's shards that the new bundle uses keep their numbers (as a local pack on a base links
them, packing/delta.py), and their records are imported; but no file is made for them. Each
descriptor says where the file is instead: in base ``k`` at ``base_shard`` (a reference: the
publish uploads nothing of it), or, with ``materialize``, in the new bundle's own prefix, where
the publish has the store copy it server-side (``SharedShards``,
storage/objectstore/references.py, which also checks every such object before ``COMPLETE``).
Either way the header the shard file carries is recorded (``header_id``, ``header_index``), so a
reader checks each as it checks a shard a merge linked.

Chains stay flat: a shard the base itself keeps in one of its bases is named in the new bundle
at that base directly (its location resolved from the base's, written relative to the new
bundle's), so every shard is one hop from every bundle that reads it, however long the chain.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``,
``bundlefs.packing.options``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from bundlefs.core import format as fmt
from bundlefs.errors import BundleError, PackError
from bundlefs.packing.options import PackOptions
from bundlefs.storage.bases import bundle_store, relative_location, resolve_base
from bundlefs.storage.index import IndexReader
from bundlefs.storage.index_writer import IndexWriter
from bundlefs.storage.location import Location
from bundlefs.storage.objectstore.index_fetch import open_index
from bundlefs.storage.objectstore.references import RemoteShard, SharedShards
from bundlefs.storage.objectstore.shard_store import RemoteShardStore
from bundlefs.storage.store import ShardStore


class RemoteBase:
    """The base ``reader`` (at ``old``) of a new bundle at ``new``, both on an object store."""

    def __init__(
        self, reader: IndexReader, old: Location, new: Location, *, materialize: bool
    ) -> None:
        if old.protocol != new.protocol:
            raise PackError(
                f"{new.url} cannot keep shards in {old.url}, on another kind of store "
                "(pack to the same store as the base)"
            )
        version = reader.marker.format_version
        if version == 1 and not materialize:
            raise PackError(
                f"the base {old.url} is a version 1 bundle, whose shards a new bundle cannot "
                "name (pack with --materialize to copy them)"
            )
        self.reader = reader
        self.old = old
        self.new = new
        self.materialize = materialize
        # The base's own bases (checked when its store is opened, ``bundle_store``): the new
        # bundle names them directly (flat chains).
        self.older = [resolve_base(old, base.location) for base in reader.bases]

    def take(self, index: IndexWriter, used: Iterable[int]) -> SharedShards:
        """The base's shards ``used`` into ``index`` at their own numbers (records and
        descriptors, and the ``bases`` they name); what the publish does instead of uploading
        them."""
        reader, shared = self.reader, SharedShards()
        refs: list[fmt.BaseRef] = []
        numbers: dict[str, int] = {}  # base URL -> its number in the new bundle
        for shard in used:
            info = reader.shard_info(shard)
            for record in reader.iter_records(shard):
                index.put_record(record, append=False)  # the new bundle's own are written
            holder, held_as = self._holder(shard, info)
            header_id = info.header_id
            if header_id == fmt.OWN_BUNDLE_ID:
                header_id = reader.marker.bundle_id
            header_index = shard if info.header_index is None else info.header_index
            version = reader.marker.format_version if holder is self.old else fmt.FORMAT_VERSION
            remote = RemoteShard(
                f"{holder.path.rstrip('/')}/{fmt.shard_filename(held_as, version)}",
                info.file_size,
                fmt.encode_shard_header(header_index, header_id, info.header_version),
            )
            descriptor = fmt.ShardInfo(
                info.file_size,
                info.uncompressed_size,
                info.record_count,
                info.codec,
                info.header_version,
                header_index,
                header_id,
            )
            name = fmt.shard_filename(shard)
            if self.materialize:
                shared.copies[name] = remote
            else:
                number = numbers.get(holder.url)
                if number is None:
                    number = numbers[holder.url] = len(numbers) + 1
                    refs.append(fmt.BaseRef(self._bundle_id(holder), self._named(holder)))
                    shared.bases.append(holder)
                shared.references[name] = remote
                descriptor = dataclasses.replace(descriptor, base=number, base_shard=held_as)
            index.put_shard(shard, descriptor, append=False)
        index.put_bases(refs)
        return shared

    def _holder(self, shard: int, info: fmt.ShardInfo) -> tuple[Location, int]:
        """The bundle whose directory holds shard ``shard``'s file, and its index there."""
        if not info.base:
            return self.old, shard
        return self.older[info.base - 1], info.base_shard

    def _bundle_id(self, holder: Location) -> bytes:
        if holder is self.old:
            return self.reader.marker.bundle_id
        return self.reader.bases[self.older.index(holder)].bundle_id

    def _named(self, holder: Location) -> str:
        """How the new bundle's ``bases`` names ``holder`` (``encode_base`` refuses one too
        long to record)."""
        return relative_location(self.new, holder)


def open_remote_base(
    location: Location, new: Location, options: PackOptions
) -> tuple[IndexReader, ShardStore, RemoteBase]:
    """The base at the URL ``location`` of a pack to the URL ``new``: its index (fetched into
    the local cache and checked against its marker), the store its shards are read through (to
    compare content where its entries have no digest) and its ``RemoteBase``."""
    if new.is_local:
        raise PackError(
            f"a local bundle cannot be packed on {location.url}, a bundle on an object store "
            "(pack to the store as well, or on a local copy of the base)"
        )
    if location.protocol == new.protocol and _overlap(location.path, new.path):
        raise PackError(f"{new.url} overlaps the base {location.url}, which a pack never modifies")
    try:
        # Whole: a pack on a base reads every entry of it (one pass of big GETs).
        reader = open_index(location, whole=True)
    except BundleError as e:
        raise PackError(f"the base {location.url} is not a bundle that can be read: {e}") from None
    try:
        base = RemoteBase(reader, location, new, materialize=options.materialize)
        store = bundle_store(location, reader, _remote_store, location.url)
    except BundleError as e:
        reader.close()
        raise PackError(str(e)) from None
    except BaseException:
        reader.close()
        raise
    return reader, store, base


def _remote_store(location: Location, bundle_id: bytes, sizes: dict[str, int]) -> ShardStore:
    return RemoteShardStore(location, bundle_id, shard_sizes=sizes)


def _overlap(a: str, b: str) -> bool:
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)
