"""The write half of the LMDB index: ``IndexWriter`` (sorted appends, deterministic commits).

LMDB's errors end here: callers see ``IndexWriteError`` (or ``FormatError`` for a key written
twice). The read half is ``IndexReader`` (storage/index.py).

May import: ``bundlefs.core``, ``bundlefs.errors``.
"""

from __future__ import annotations

import os

import lmdb

from bundlefs.core import format as fmt
from bundlefs.core.format.keys import encode_sources, entry_keys
from bundlefs.errors import FormatError, IndexWriteError


class IndexWriter:
    """Writes a fresh index with sorted appends. Owned by the packer; one writer per index.

    Every LMDB failure (a full disk or map, an I/O error) is raised as ``IndexWriteError``, so no
    caller above the storage layer needs to know LMDB.
    """

    # Deterministic commit points keep the dirty set bounded and the output byte-identical.
    COMMIT_EVERY = 50_000
    # Entries (and source records) are appended in batches of up to this many (one ``putmulti``
    # each): the same puts, with the same commit points, as one ``put`` each, at a fraction of
    # the calls. Any other write puts the batches first, so the order of the puts is fixed.
    BATCH = 512

    def __init__(self, index_dir: str, map_size: int = 1 << 40) -> None:
        os.makedirs(index_dir, exist_ok=True)
        try:
            self._env = lmdb.open(
                index_dir,
                map_size=map_size,
                subdir=True,
                lock=False,  # we own the directory exclusively; no lock.mdb in the bundle
                max_dbs=len(fmt.ALL_DBS) + 1,
                sync=False,  # the packer fsyncs once at the end
                metasync=False,
            )
        except lmdb.Error as e:
            raise IndexWriteError(str(e)) from e
        try:
            self._dbs = {name: self._env.open_db(name) for name in fmt.ALL_DBS}
            self._txn = self._env.begin(write=True)
        except lmdb.Error as e:
            self._env.close()
            raise IndexWriteError(str(e)) from e
        self._pending = 0
        self._entries: list[tuple[bytes, bytes]] = []  # (key, value) appends not yet put
        self._sources: list[tuple[bytes, bytes]] = []  # the same, in ``sources`` (version 6)

    def _put(self, db: bytes, key: bytes, value: bytes, *, append: bool) -> None:
        self._put_batches()
        try:
            if not self._txn.put(key, value, db=self._dbs[db], append=append, overwrite=not append):
                raise FormatError(f"index key {key!r} was written twice")
            self._written(1)
        except lmdb.Error as e:
            raise IndexWriteError(str(e)) from e

    def put_entry(self, entry: fmt.Entry) -> None:
        self.put_entry_value(entry.ino, fmt.encode_entry(entry))

    def put_entry_value(self, ino: int, value: bytes) -> None:
        """An entry already encoded in this version's layout (``compact`` copies a bundle's
        entries, relocating only files' content; a delta pack its base's unchanged files')."""
        self._entries.append((fmt.entry_key(ino), value))
        if len(self._entries) >= self.BATCH:
            self._entries = self._put_batch(fmt.DB_ENTRIES, self._entries)

    def put_copied_run(
        self, ino: int, values: list[bytes], ctimes: list[int] | None, inodes: list[int]
    ) -> None:
        """Encoded entries (``put_entry_value``: a delta pack's base's values of its unchanged
        files) at inodes ``ino`` onwards and, unless ``ctimes`` is None, their source records
        (``put_source`` of each ctime and inode): the same puts in the same order as a call
        each (every batch put as the file that fills it is added, the entries' before the
        source records'), without the call per file that was most of their cost."""
        keys, count, done, batch = entry_keys(ino, len(values)), len(values), 0, self.BATCH
        sources = None if ctimes is None else encode_sources(ctimes, inodes)
        entries, records = self._entries, self._sources
        while done < count:
            room = batch - len(entries)
            if sources is not None:
                room = min(room, batch - len(records))
            end = min(count, done + room)
            entries.extend(zip(keys[done:end], values[done:end], strict=True))
            if sources is not None:
                records.extend(zip(keys[done:end], sources[done:end], strict=True))
            done = end
            if len(entries) >= batch:
                entries = self._entries = self._put_batch(fmt.DB_ENTRIES, entries)
            if len(records) >= batch:
                records = self._sources = self._put_batch(fmt.DB_SOURCES, records)

    def put_source(self, ino: int, ctime_ns: int, st_ino: int) -> None:
        """File ``ino``'s source record (version 6: its source's ctime and inode number when it
        was packed), in inode order."""
        self._sources.append((fmt.entry_key(ino), fmt.encode_source(ctime_ns, st_ino)))
        if len(self._sources) >= self.BATCH:
            self._sources = self._put_batch(fmt.DB_SOURCES, self._sources)

    def put_raw_records(self, records: list[tuple[bytes, bytes]], *, append: bool = True) -> None:
        """Records as (key, value) in this version's layout, in key order, copied as they are (a
        delta pack's base's: not decoded and encoded again); not ``append``: as ``put_record``."""
        self._put_batches()
        self._put_batch(fmt.DB_RECORDS, records, append=append)

    def _put_batches(self) -> None:
        if self._entries:
            self._entries = self._put_batch(fmt.DB_ENTRIES, self._entries)
        if self._sources:
            self._sources = self._put_batch(fmt.DB_SOURCES, self._sources)

    def _put_batch(
        self, name: bytes, batch: list[tuple[bytes, bytes]], append: bool = True
    ) -> list:
        """``batch`` put into database ``name`` in order (one ``putmulti`` per commit), committing
        where ``_put`` would; a key written twice is a ``FormatError``. The next batch (empty)."""
        db, done = self._dbs[name], 0
        try:
            while done < len(batch):
                part = batch[done : done + self.COMMIT_EVERY - self._pending]
                added = self._txn.cursor(db=db).putmulti(part, append=append, overwrite=False)[1]
                if added != len(part):
                    raise FormatError(f"index key {part[added][0]!r} was written twice")
                done += len(part)
                self._written(len(part))
        except lmdb.Error as e:
            raise IndexWriteError(str(e)) from e
        return []

    def _written(self, count: int) -> None:
        """Count ``count`` puts; commit once ``COMMIT_EVERY`` are pending (bounded transactions)."""
        self._pending += count
        if self._pending >= self.COMMIT_EVERY:
            self._txn.commit()
            self._txn = self._env.begin(write=True)
            self._pending = 0

    def replace_entry(self, entry: fmt.Entry) -> None:
        """Rewrite an entry already written (the packer keeps the value's length, so LMDB
        overwrites it in place)."""
        self._put(fmt.DB_ENTRIES, fmt.entry_key(entry.ino), fmt.encode_entry(entry), append=False)

    def put_totals(self, ino: int, totals: fmt.TreeTotals) -> None:
        """A directory's totals (version 5), in inode order."""
        self._put(fmt.DB_TOTALS, fmt.totals_key(ino), fmt.encode_totals(totals), append=True)

    def put_record(self, record: fmt.Record, *, append: bool = True) -> None:
        """A record; not ``append``: one that sorts before records already written (a delta
        pack's base shards, imported after its own were written)."""
        key = fmt.record_key(record.shard, record.offset)
        self._put(fmt.DB_RECORDS, key, fmt.encode_record(record), append=append)

    def put_shard(self, index: int, info: fmt.ShardInfo, *, append: bool = True) -> None:
        value = fmt.encode_shard_info(info, fmt.FORMAT_VERSION, index)
        self._put(fmt.DB_SHARDS, fmt.shard_key(index), value, append=append)

    def put_bases(self, bases: list[fmt.BaseRef]) -> None:
        """The base bundles the shard table names (version 6), base k at ``bases[k - 1]``."""
        for number, base in enumerate(bases, 1):
            self._put(fmt.DB_BASES, fmt.base_key(number), fmt.encode_base(base), append=True)

    def put_owner(self, index: int, uid: int, gid: int) -> None:
        self._put(fmt.DB_OWNERS, fmt.owner_key(index), fmt.encode_owner(uid, gid), append=True)

    def put_content_type(self, index: int, media_type: str) -> None:
        key = fmt.content_type_key(index)
        self._put(fmt.DB_TYPES, key, fmt.encode_content_type(media_type), append=True)

    def put_meta(self, items: dict[str, str]) -> None:
        """The bundle's metadata, all at once (LMDB sorts the keys)."""
        if len(items) > fmt.MAX_META_KEYS:
            raise FormatError(f"more than {fmt.MAX_META_KEYS} metadata items")
        for key in sorted(items, key=str.encode):
            value = fmt.encode_meta_value(items[key])
            self._put(fmt.DB_META, fmt.meta_key(key), value, append=True)

    def put_config(self, config: fmt.Config) -> None:
        self._put(fmt.DB_CONFIG, fmt.CONFIG_KEY, fmt.encode_config(config), append=False)

    def close(self) -> None:
        """Commit, flush to disk and close."""
        self._put_batches()
        try:
            self._txn.commit()
            self._env.sync(True)
            self._env.close()
        except lmdb.Error as e:
            raise IndexWriteError(str(e)) from e

    def abort(self) -> None:
        """Discard what was written and close; LMDB errors raise ``IndexWriteError``."""
        self._entries, self._sources = [], []
        try:
            try:
                self._txn.abort()
            finally:
                self._env.close()
        except lmdb.Error as e:
            raise IndexWriteError(str(e)) from e
