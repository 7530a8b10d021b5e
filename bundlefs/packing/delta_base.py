"""The base bundle of a pack on a base (``pack(SRC, NEW, base=OLD)``), opened: ``Base``.

OLD's index and shards (to compare content), the rule that trusts a file by its stat
(``trusted``: its size and mtime OLD's, the mtime ``settled`` before OLD's racy window at the
source's ``MtimeTick``; with ``check="strict"`` also the ctime and inode of OLD's source record,
``strict``), what the pack took from OLD (``used`` shards, the ``reuse`` counts) and, at the
end, OLD's used shards linked (``reuse.ReusedShards``; their records copied as they are) or on
an object store referenced (``remote_base``), an empty shard of NEW's in place of each unused
one (``finish``). Walking SRC beside OLD is ``delta``'s; split from it for its line budget.

May import: ``bundlefs.core``, ``errors``, ``storage``, ``packing`` below it (``options``,
``reuse``, ``remote_base``, ``strict``, ``sources``).
"""

from __future__ import annotations

import os

from bundlefs.core import format as fmt
from bundlefs.core.checksum import ContentDigest
from bundlefs.errors import BundleError, PackError
from bundlefs.packing import strict
from bundlefs.packing.options import BaseReuse, PackOptions
from bundlefs.packing.remote_base import RemoteBase, open_remote_base
from bundlefs.packing.reuse import ReusedShards
from bundlefs.packing.sources.base import EXACT_MTIME, MtimeTick, Stat, StoredContent
from bundlefs.storage.codec import zstd_module
from bundlefs.storage.index import IndexReader
from bundlefs.storage.index_writer import IndexWriter
from bundlefs.storage.location import Location, parse_location
from bundlefs.storage.objectstore.upload import RemotePublisher
from bundlefs.storage.shard_writer import ShardWriter
from bundlefs.storage.shards import ShardSet
from bundlefs.storage.store import LocalShardStore, ShardStore

EMPTY_DIGEST = ContentDigest().digest()  # an empty file needs no shard, but has a digest


class Base:
    """The base bundle of a pack, opened: index, shards, what it took (``used``, ``reuse``)."""

    def __init__(
        self,
        path: str,
        dest: str,
        options: PackOptions,
        publisher: RemotePublisher | None = None,
        *,
        linked: bool = True,
    ) -> None:
        try:
            location = parse_location(path, options.storage_options)
            new = parse_location(dest, options.storage_options)
        except BundleError as e:
            raise PackError(str(e)) from None
        self.path = location.path if location.is_local else location.url
        self.publisher = publisher  # a pack to a URL: told what it need not upload
        self.remote: RemoteBase | None = None  # a base on an object store
        store: ShardStore
        if location.is_local:
            self.reader = self._open_local(path, dest, new)
            store = LocalShardStore(self.path)
        else:
            self.reader, store, self.remote = open_remote_base(location, new, options)
        self.shards = ShardSet(store, self.reader.marker, self.reader.shard_info)
        config = self.reader.config
        self.count = config.shard_count
        self.check = options.check
        # An mtime at or after this is too close to OLD's creation to be trusted by stat.
        self.racy_limit = config.created_ns - int(options.racy_seconds * 10**9)
        self.used: set[int] = set()
        self.linked = linked  # False: a distributed pack's task, its merge links (``finish``)
        self.reuse = BaseReuse(base=path)
        self.strict = self.check == "strict"
        # Unchanged files' values copied as they are: OLD's layout is the pack's (5's is 6's).
        self.copies = self.check != "content" and config.format_version >= fmt.FIRST_V5_VERSION

    def _open_local(self, path: str, dest: str, new: Location) -> IndexReader:
        if not os.path.isdir(self.path):
            raise PackError(f"the base {path} is not a bundle (no such directory)")
        here, there = os.path.realpath(self.path), os.path.realpath(os.path.abspath(new.path))
        if new.is_local and os.path.commonpath([here, there]) in (here, there):
            raise PackError(f"{dest} overlaps the base {path}, which a pack never modifies")
        try:
            return IndexReader(self.path)
        except BundleError as e:
            raise PackError(f"the base {path} is not a bundle that can be read: {e}") from None

    def close(self) -> None:
        self.shards.close()
        self.reader.close()

    def writer_config(self, config: fmt.Config, block_size_given: bool) -> fmt.Config:
        """The new bundle's layout: OLD's block size (its records sit on its block boundaries)."""
        old = self.reader.config
        if config.block_size != old.block_size and block_size_given:
            raise PackError(
                f"the base has a block size of {old.block_size} and a pack on it keeps it "
                f"(not {config.block_size})"
            )
        return fmt.Config(
            block_size=old.block_size,
            record_size=config.record_size,
            compression=config.compression,
            created_ns=config.created_ns,
        )

    def final_config(self, config: fmt.Config) -> fmt.Config:
        """``config`` widened to hold OLD's shards: its record size, and zstd if any shard
        linked is zstd (a reader needs it)."""
        old = self.reader.config
        codecs = {self.reader.shard_info(s).codec for s in self.used}
        compression = config.compression
        if fmt.COMPRESSION_ZSTD in codecs:
            compression = fmt.COMPRESSION_ZSTD
        return fmt.Config(
            block_size=config.block_size,
            record_size=max(config.record_size, old.record_size),
            large_file_threshold=config.large_file_threshold,
            compression=compression,
            created_ns=config.created_ns,
        )

    def finish(self, work: str, index: IndexWriter, config: fmt.Config) -> list[int]:
        """OLD's used shards linked into ``work`` and their table imported; an empty shard of
        the new bundle in place of each unused one. Returns those (the new bundle's own). Not
        ``linked``: OLD's shard descriptors only (a partial bundle of a distributed pack, which
        ``merge(..., base=)`` alone reads: it never opens those shards)."""
        if fmt.COMPRESSION_ZSTD in {self.reader.shard_info(s).codec for s in self.used}:
            try:
                zstd_module()  # what the new bundle's config will say it needs
            except BundleError as e:
                raise PackError(str(e)) from None
        if not self.linked:  # OLD's shard table only, no file: read by a merge on OLD alone
            whole = ReusedShards([self.reader], [self.path], keep_numbers=True)
            whole.import_table(index, append=False, records=False)
            return []
        if self.remote is not None:  # the files stay on the store: referenced, or copied there
            assert self.publisher is not None  # a local NEW on a remote base was refused
            self.publisher.shared = self.remote.take(index, sorted(self.used))
            way = "server-side copy" if self.remote.materialize else "reference"
            ways = [way] * len(self.used)
        else:
            reused = ReusedShards(
                [self.reader], [self.path], select=[sorted(self.used)], keep_numbers=True
            )
            ways = reused.link(work)
            reused.import_table(index, append=False)  # the new bundle's own records are in
        empty = [s for s in range(self.count) if s not in self.used]
        for shard in empty:
            path = os.path.join(work, fmt.shard_filename(shard))
            index.put_shard(shard, ShardWriter(path, shard, config).finish(), append=False)
        self.reuse.shards_linked = len(ways)
        self.reuse.shards_left = len(empty)
        self.reuse.ways = {way: ways.count(way) for way in sorted(set(ways))}
        return empty

    def trusted(self, entry: fmt.Entry | None, st: Stat, tick: MtimeTick = EXACT_MTIME) -> bool:
        """Whether the file with status ``st`` (an mtime as fine as ``tick``) is OLD's
        ``entry`` unchanged, by its stat (and with ``check="strict"`` its source record)."""
        return (
            entry is not None
            and self.check != "content"
            and entry.is_file
            and st.st_size == entry.size
            and st.st_mtime_ns == entry.mtime_ns
            and self.settled(entry.mtime_ns, tick)
            and (not self.strict or self.same_source(entry.ino, st))
        )

    def settled(self, mtime_ns: int, tick: MtimeTick) -> bool:
        """Whether a file of mtime ``mtime_ns``, as fine as ``tick``, was last written before
        OLD's racy window: its true mtime lies anywhere up to a tick after the one it shows.
        A tick of None (an mtime that tells versions apart not at all) never is."""
        return tick is not None and mtime_ns + tick - 1 < self.racy_limit

    def same_source(self, ino: int, st: Stat) -> bool:
        return strict.same_source(self.reader, ino, st, self.racy_limit)

    def reused(self, entry: fmt.Entry, st: Stat) -> StoredContent:
        """The item's content as OLD stored it; ``st`` is SRC's (what the entry records)."""
        self.used.add(entry.shard)
        return StoredContent(
            entry.shard,
            entry.offset,
            entry.size,
            entry.crc32c,
            st,
            b"",
            self.reader.content_type(entry),
            digest=entry.digest,  # copied, as a merge does: none from a base older than version 5
        )
