"""Packing a tree on a base bundle: a new, complete bundle that reuses the base's stored bytes
for every file that did not change (``pack(SRC, NEW, base=OLD)``): ``Base`` and ``DeltaSource``.
docs/versions.md says when a file counts as unchanged; here is how.

``DeltaSource`` walks SRC as a pack does (a ``WalkedSource``: a directory, an object-store
prefix) beside OLD's index, one directory at a time (a directory's children are one inode range
in OLD: read in order, no path looked up); a source that stores its own content (an archive,
``--files-from``) goes through ``delta_sink``, same rules. A regular file whose path names one
of the same size in OLD is either trusted by its stat (``check`` "stat": its mtime OLD's, as
fine as the source's ``mtime_tick``, and ``racy_seconds`` (plus a tick) before OLD's creation;
"strict": also the ctime and inode OLD's source records hold) and not read — it arrives
``stored`` at OLD's place, most such files as OLD's entry value undecoded (``SourceItem.reuse``)
for the builder to copy when the new entry would encode to those very bytes — or read and
compared (``compare``: by OLD's digest from version 5; else with OLD's bytes): equal content is
reused with nothing written, different content goes to the ``ContentWriter`` as in any pack.

May import: ``bundlefs.core``, ``errors``, ``storage``, ``packing`` below it (``options``, …).
"""

from __future__ import annotations

import os
import stat as statmod
from collections.abc import Iterator
from typing import Protocol

from bundlefs.core import format as fmt
from bundlefs.core.checksum import ContentDigest
from bundlefs.errors import BundleError, PackError
from bundlefs.packing import strict
from bundlefs.packing.compare import same_bytes, same_stream
from bundlefs.packing.options import BaseReuse, PackOptions
from bundlefs.packing.remote_base import RemoteBase, open_remote_base
from bundlefs.packing.reuse import ReusedShards
from bundlefs.packing.sources.base import (
    EXACT_MTIME,
    Content,
    MtimeTick,
    Reuse,
    SourceItem,
    Stat,
    StoredContent,
)
from bundlefs.packing.sources.directory import ReadIf
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


class WalkedSource(Protocol):
    """A source the builder walks whose files it reads itself (``DirectorySource``,
    ``ObjectSource``): ``children`` takes ``read_if``, which says whether to read a small file
    ahead (a delta pack reads none it takes from the base); ``mtime_tick`` says how fine its
    mtimes are (``sources.base.MtimeTick``)."""

    mtime_tick: MtimeTick

    def root(self) -> SourceItem: ...
    def children(self, rel: bytes, read_if: ReadIf | None = None) -> Iterator[SourceItem]: ...
    def readlink(self, item: SourceItem) -> bytes: ...
    def open(self, item: SourceItem) -> Content: ...


class DeltaSource:
    """SRC (a ``WalkedSource``) beside ``base``: files unchanged since the base arrive
    ``stored`` at its bytes, every other item as SRC delivers it."""

    def __init__(self, inner: WalkedSource, base: Base) -> None:
        self.inner = inner
        self.base = base
        self.tick = inner.mtime_tick
        self._pending: dict[bytes, int] = {}  # directory rel -> OLD's directory inode
        self._linked: set[tuple[int, int]] = set()  # hard-linked files met, as the builder

    def root(self) -> SourceItem:
        self._pending[b""] = fmt.ROOT_INO
        return self.inner.root()

    def children(self, rel: bytes) -> Iterator[SourceItem]:
        old = self._old_children(self._pending.pop(rel, None))

        def read_if(item: SourceItem) -> bool:  # marks the copyable ``reuse``: not read
            found = old.get(item.name)
            if found is None:
                return True
            item.reuse = self._copyable(found, item.st)
            if item.reuse is not None:
                return False  # OLD's value copied: no entry decoded (the hot path)
            return not self.base.trusted(self._entry(found), item.st, self.tick)

        for item in self.inner.children(rel, read_if if old else None):
            if item.reuse is not None:
                self._copied(item)
                yield item
                continue
            found = old.get(item.name)
            kind = statmod.S_IFMT(item.st.st_mode)
            if kind == statmod.S_IFREG and found is not None:
                item.reuse = self._copyable(found, item.st)  # not probed with read_if
                if item.reuse is not None:
                    self._copied(item)
                elif not self._later_name(item.st):
                    self._file(item, self._entry(found))
            elif kind == statmod.S_IFDIR and found is not None:
                entry = self._entry(found)
                if entry.is_dir:
                    self._pending[item.rel] = entry.ino
            elif kind == statmod.S_IFREG and not self._later_name(item.st):
                self._file(item, None)
            yield item

    def readlink(self, item: SourceItem) -> bytes:
        return self.inner.readlink(item)

    def open(self, item: SourceItem) -> Content:
        return self.inner.open(item)

    def _later_name(self, st: Stat) -> bool:
        """Whether ``st`` is a hard-linked file met before (the builder links to its first)."""
        if st.st_nlink < 2:
            return False
        key = (st.st_dev, st.st_ino)
        seen = key in self._linked
        self._linked.add(key)
        return seen

    def _old_children(self, ino: int | None) -> dict[bytes, tuple[int, bytes]]:
        """OLD's entries in directory ``ino`` by name: (inode, value), decoded only when used."""
        if ino is None:
            return {}
        reader = self.base.reader
        directory = reader.entry(ino)
        version = reader.marker.format_version
        raw = reader.iter_raw(directory.first_child, directory.size)
        return {fmt.entry_name(value, version): (i, value) for i, value in raw}

    def _entry(self, found: tuple[int, bytes]) -> fmt.Entry:
        """OLD's entry, decoded; a hard link's later name resolved to the file that holds the
        content."""
        reader = self.base.reader
        entry = reader.decode(*found)
        return reader.entry(entry.target) if entry.is_link else entry

    def _copyable(self, found: tuple[int, bytes], st: Stat) -> Reuse | None:
        """What the builder needs to copy OLD's entry ``found`` (inode, value) for the file of
        status ``st``, when the file is unchanged (``Base.trusted``) and its new entry would be
        that value byte for byte but for the owner and content type indexes (the builder checks
        those): the same mode, one link, content, no NLINK, LINK or user data in OLD."""
        base = self.base
        if not base.copies or st.st_nlink != 1:
            return None
        ino, value = found
        fields = fmt.reusable_file(value)
        if fields is None:
            return None
        mode, size, mtime_ns, owner, shard, content_type = fields
        types = base.reader.content_types
        if (st.st_mode, st.st_size, st.st_mtime_ns) != (mode, size, mtime_ns) or not size:
            return None
        if not base.settled(mtime_ns, self.tick):
            return None  # racy: compared by content
        if shard >= base.count or content_type >= len(types) or owner >= len(base.reader.owners):
            return None  # an index out of range: decode it in full (it is refused)
        if base.strict and not base.same_source(ino, st):
            return None
        media_type = None if content_type == fmt.NO_CONTENT_TYPE else types[content_type]
        return value, owner, content_type, media_type, shard

    def _copied(self, item: SourceItem) -> None:
        """Count ``item``, which arrives with OLD's value to copy (``SourceItem.reuse``)."""
        assert item.reuse is not None
        self.base.used.add(item.reuse[4])
        counts = self.base.reuse
        counts.reused_files += 1
        counts.reused_bytes += item.st.st_size

    def _file(self, item: SourceItem, entry: fmt.Entry | None) -> None:
        """Set ``item.stored`` when its content is OLD's; counts either way."""
        base, counts = self.base, self.base.reuse
        size = item.st.st_size
        if not size and not item.data:  # empty: needs no shard, and no sniffing of OLD's type
            st = item.before if item.before is not None else item.st
            item.stored = StoredContent(0, 0, 0, 0, st, b"", digest=EMPTY_DIGEST)
            item.data = None
            counts.stored_files += entry is None
        elif entry is not None and base.trusted(entry, item.st, self.tick):
            item.stored = base.reused(entry, item.st)
            counts.reused_files += 1
            counts.reused_bytes += size
        elif entry is not None and entry.is_file and size == entry.size and self._same(item, entry):
            st = item.before if item.before is not None else item.st
            item.stored = base.reused(entry, st)
            item.data = None
            counts.same_files += 1
            counts.same_bytes += size
        else:
            counts.stored_files += 1
            counts.stored_bytes += size

    def _same(self, item: SourceItem, entry: fmt.Entry) -> bool:
        """Whether SRC's file holds OLD's bytes (read now unless read ahead). OLD's bytes
        damaged: not the same (SRC's are stored anew; ``verify`` of OLD reports the damage).
        Counts a file strict compares for want of OLD's source record."""
        if self.base.strict and strict.unrecorded(self.base.reader, entry):
            self.base.reuse.unrecorded_files += 1
        try:
            return self._compare(item, entry)
        except BundleError:
            return False

    def _compare(self, item: SourceItem, entry: fmt.Entry) -> bool:
        base = self.base
        if item.data is not None:
            assert item.before is not None and item.after is not None
            steady = (item.before.st_mtime_ns, item.before.st_size) == (
                item.after.st_mtime_ns,
                item.after.st_size,
            )
            return steady and same_bytes(base.shards, base.reader, base.reuse, entry, item.data)
        try:
            content = self.inner.open(item)
        except OSError:
            return False  # the store that follows reports it, by the pack's rules
        try:
            before = content.stat()
            if not statmod.S_ISREG(before.st_mode):
                return False
            if same_stream(base.shards, base.reader, base.reuse, entry, content, before):
                item.before = before
                return True
            return False
        except OSError:
            return False
        finally:
            content.close()
