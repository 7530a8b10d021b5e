"""The read half of the LMDB index: ``IndexReader`` (validated, read-only, lock-free, fork-safe).

The file is checked before LMDB maps it and, from version 6, each page before LMDB reads it
(``index_check``): LMDB trusts its file completely. LMDB's own errors end here as
``FormatError``. The environment per process and the at-fork rule are ``lmdb_env``'s; the write
half is ``IndexWriter``. May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``
``.marker``, ``.lmdb_env``, ``.entry_scan``, ``.index_fill``, ``.index_check``, ``.native``
(compiled steps).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Iterator

import lmdb

from bundlefs.core import format as fmt
from bundlefs.core import integrity
from bundlefs.core.libc import ResidentMapping, unmap_file_pages
from bundlefs.errors import BundleClosedError, FormatError, NotABundleError
from bundlefs.storage import lmdb_env, native
from bundlefs.storage.entry_scan import record_pairs, value_chunks
from bundlefs.storage.index_check import check_index_file
from bundlefs.storage.index_fill import RangeGet, refuse_sparse
from bundlefs.storage.marker import read_marker


class IndexReader:
    """Read-only view of a bundle's index. Safe to share between threads and across fork().
    ``fetch``: a sparse copy of a version-6 index, its missing pages fetched (``index_check``)."""

    def __init__(
        self, bundle_dir: str, *, check_checksum: bool = True, fetch: RangeGet | None = None
    ) -> None:
        self.bundle_dir = bundle_dir
        self._fetch = fetch
        if fetch is None:
            refuse_sparse(bundle_dir)
        self.marker = read_marker(bundle_dir)
        self._env: lmdb.Environment | None = None
        self._local = threading.local()
        self._closed = False
        self._resident: ResidentMapping | None = None
        self._resident_lock = threading.Lock()
        self._codecs: dict[int, int] = {}  # shard -> codec, version 3 (at most 65,536 items)
        self._identity, self._pages = check_index_file(  # (st_dev, st_ino); the page checks
            bundle_dir, self.marker, check_checksum, fetch
        )
        try:
            self._open()
            self.config = fmt.decode_config(
                self._get(self._dbs[fmt.DB_CONFIG], fmt.CONFIG_KEY, "config")
            )
            if self.config.format_version != self.marker.format_version:
                raise FormatError("config and completion marker disagree on the format version")
            if self.config.shard_count != self.marker.shard_count:
                raise FormatError("config and completion marker disagree on the shard count")
            # Readers size tables by entry_count (verify keeps a byte per inode): a forged count
            # must not make them allocate gigabytes. LMDB knows how many keys there really are.
            held = self._txn().stat(self._dbs[fmt.DB_ENTRIES])["entries"]
            integrity.enforce(integrity.entry_count(self.config, held))
            self.owners = _load_owners(self)
            self.content_types = _load_content_types(self)
            self.meta()  # checked once at open: at most 1,024 items, so a bad one fails here
            _check_totals(self)
            self.bases = _load_bases(self)  # version 6: base bundles the shard table names
        except BaseException:
            self.close()  # else the shared environment would stay open for the process's life
            raise
        lmdb_env.on_fork(self)

    # -- opening ---------------------------------------------------------------------------------

    @property
    def index_path(self) -> str:
        return os.path.join(self.bundle_dir, fmt.INDEX_DIR, fmt.INDEX_FILE)

    def unmap_pages(self) -> None:
        """Take the index's mapped pages out of this process's resident set (they stay in the
        page cache; the next lookup maps what it touches): for a scan of every entry, which
        would otherwise hold the whole index in its RSS by its end (``verify``)."""
        unmap_file_pages(self.index_path)

    def _open(self) -> None:
        try:
            st = os.stat(self.index_path)
            self._env_key = (st.st_dev, st.st_ino)
            if self._env_key != self._identity:
                # Replaced since it was validated (a `pack --force` over it, then a fork):
                # serving the new index with the old marker and caches could mix two bundles.
                raise FormatError("the bundle was replaced on disk; open it again")
            self._env = lmdb_env.acquire(
                os.path.join(self.bundle_dir, fmt.INDEX_DIR),
                self._env_key,
                max_dbs=len(fmt.ALL_DBS) + 1,
            )
            version = self.marker.format_version
            self._dbs = {
                name: self._env.open_db(name, create=False) for name in fmt.databases(version)
            }
            for name in fmt.databases(version, optional=True):  # may be absent (version 6)
                with contextlib.suppress(lmdb.NotFoundError):
                    self._dbs[name] = self._env.open_db(name, create=False)
            self._pages.bind(self._dbs)
        except OSError as e:
            raise NotABundleError(
                f"cannot read the index {self.index_path}: {e.strerror}"
            ) from None
        except lmdb.Error as e:
            self._release_env()
            raise FormatError(f"index cannot be opened: {e}") from None
        self._local = threading.local()

    def _release_env(self) -> None:
        """Stop using the environment; the last of its readers in this process closes it."""
        env, self._env = self._env, None
        if env is None:
            return
        lmdb_env.release(self._env_key, env)

    def forked(self) -> None:
        """In a child after ``fork()`` (lmdb_env calls it): the parent's read transactions are
        not this process's; every thread starts its own on the inherited environment (see
        ``lmdb_env._inherited`` for why it is not reopened)."""
        self._local = threading.local()
        self._pages.forked()

    def hold_resident(self) -> int:
        """Fault the whole index into memory and keep it mapped until ``close``; its size.

        See ``lmdb_env.resident_mapping``: the lookups on the caller's thread (the mount's event
        loop) then pay no disk reads. Raises ``OSError`` where the kernel cannot.
        """
        if self._fetch is not None:  # its holes would be faulted in as zeros
            raise OSError("the index is fetched page by page from its object store")
        mapping = lmdb_env.resident_mapping(self.index_path, self._identity)
        with self._resident_lock:
            if self._closed or self._resident is not None:
                mapping.close()
            else:
                self._resident = mapping
        return mapping.size

    def close(self) -> None:
        """Close the index. Must not race reads in other threads (LMDB would be unmapped)."""
        self._closed = True
        with self._resident_lock:
            if self._resident is not None:
                self._resident.close()
                self._resident = None
        self._local = threading.local()  # every thread's transaction goes with the environment
        lmdb_env.forget(self)
        self._release_env()
        self._pages.close()

    # -- transactions ----------------------------------------------------------------------------

    def _txn(self) -> lmdb.Transaction:
        # The bundle is immutable and opened without a lock table, so a long-lived read transaction
        # per thread is safe and saves ~1.5 µs per call over beginning one each time.
        txn = getattr(self._local, "txn", None)
        if txn is None:
            if self._closed:
                raise BundleClosedError("the bundle is closed")
            if self._env is None:
                raise FormatError("the index is not open")
            txn = self._local.txn = self._env.begin(buffers=False)
        return txn

    def _get(self, db, key: bytes, what: str) -> bytes:
        self._pages.key(db, key)
        try:
            value = self._txn().get(key, db=db)
        except lmdb.Error as e:
            raise FormatError(f"index is damaged reading {what}: {e}") from None
        if value is None:
            raise FormatError(f"index has no {what}")
        return value

    # -- queries ---------------------------------------------------------------------------------

    def meta(self) -> dict[str, str]:
        """The bundle's metadata (``pack --meta``), in key order; empty in version 1."""
        db = self._dbs.get(fmt.DB_META)
        if db is None:
            return {}
        found: dict[str, str] = {}
        self._pages.span(db)
        try:
            for key, value in self._txn().cursor(db=db):
                if len(found) >= fmt.MAX_META_KEYS:
                    raise FormatError(f"index has more than {fmt.MAX_META_KEYS} metadata items")
                k, v = fmt.decode_meta(key, value)
                found[k] = v
        except lmdb.Error as e:
            raise FormatError(f"index is damaged reading metadata: {e}") from None
        return found

    def content_type(self, entry: fmt.Entry) -> str | None:
        """The media type of a file entry (decoded, so its index is in range), or None."""
        if entry.content_type == fmt.NO_CONTENT_TYPE:
            return None
        return self.content_types[entry.content_type]

    def entry(self, ino: int) -> fmt.Entry:
        if not 1 <= ino <= self.config.entry_count:
            raise FormatError(f"inode {ino} is out of range")
        return self._decode(ino, self._get(self._dbs[fmt.DB_ENTRIES], fmt.entry_key(ino), "entry"))

    def _decode(self, ino: int, value: bytes) -> fmt.Entry:
        entry = native.decode_entry(ino, value, self.marker.format_version)
        if entry.owner >= len(self.owners):
            raise FormatError(f"entry {ino} names owner {entry.owner}, which does not exist")
        if entry.content_type >= len(self.content_types):
            raise FormatError(
                f"entry {ino} names content type {entry.content_type}, which does not exist"
            )
        return entry

    def decode(self, ino: int, value: bytes) -> fmt.Entry:
        """Entry ``ino`` from its value as ``iter_raw`` gave it, checked as ``entry`` checks."""
        return self._decode(ino, value)

    def find_child(self, first: int, count: int, name: bytes) -> int | None:
        """The child among ``first … first+count−1`` (a directory's) named ``name``, or None."""
        args = (self._dbs[fmt.DB_ENTRIES], first, count, name, self.marker.format_version)
        return native.find_child(self._txn(), self._pages, self._get, *args)

    def iter_entries(self, first: int, count: int) -> Iterator[fmt.Entry]:
        """Entries ``first … first+count−1`` with one cursor scan."""
        for ino, value in self.iter_raw(first, count):
            yield self._decode(ino, value)

    def iter_raw(self, first: int, count: int) -> Iterator[tuple[int, bytes]]:
        """(inode, undecoded value) for inodes ``first … first+count−1``."""
        return zip(itertools.count(first), self.values(first, count))

    def values(self, first: int, count: int) -> Iterator[bytes]:
        """The undecoded values of inodes ``first … first+count−1``: one cursor scan in checked
        chunks (``entry_scan``)."""
        if count <= 0:
            return iter(())
        db = self._dbs[fmt.DB_ENTRIES]
        self._pages.span(db, fmt.entry_key(first), fmt.entry_key(first + count - 1))
        cursor = self._txn().cursor(db=db)
        return itertools.chain.from_iterable(value_chunks(cursor, first, count))

    def iter_values(self) -> Iterator[bytes]:
        """Every entry's undecoded value in inode order, the keys unread: for scans of one field
        of every entry (``storage.liveness``): no key is read or checked, so it is for scans
        that must see every entry, not a range."""
        self._pages.span(self._dbs[fmt.DB_ENTRIES])
        try:
            cursor = self._txn().cursor(db=self._dbs[fmt.DB_ENTRIES])
            if cursor.first():
                yield from cursor.iternext(keys=False, values=True)
        except lmdb.Error as e:
            raise FormatError(f"index is damaged listing entries: {e}") from None

    def iter_names(self, first: int, count: int) -> Iterator[tuple[int, bytes]]:
        """(inode, name) for inodes ``first … first+count−1``, nothing else decoded."""
        for ino, value in self.iter_raw(first, count):
            yield ino, fmt.entry_name(value, self.marker.format_version)

    def record_at(self, shard: int, offset: int) -> fmt.Record:
        """The record of ``shard`` whose uncompressed range holds ``offset``."""
        key = fmt.record_key(shard, offset)
        self._pages.span(self._dbs[fmt.DB_RECORDS], key, key)
        try:
            cursor = self._txn().cursor(db=self._dbs[fmt.DB_RECORDS])
            if found := native.record_at(cursor, key, shard, offset, self.config, self._codecs):
                return found  # compiled (where built), for a shard whose codec is known
            if not cursor.set_range(key):
                positioned = cursor.last()
            elif cursor.key() != key:
                positioned = cursor.prev()
            else:
                positioned = True
            if not positioned:
                raise FormatError(f"no record holds shard {shard} offset {offset}")
            rec_shard, rec_offset = fmt.decode_record_key(cursor.key())
            value = cursor.value()
        except lmdb.Error as e:
            raise FormatError(f"index is damaged looking up a record: {e}") from None
        record = fmt.decode_record(
            rec_shard, rec_offset, value, self.config, self._shard_codec(rec_shard)
        )
        if rec_shard != shard or not record.offset <= offset < record.end:
            raise FormatError(f"no record holds shard {shard} offset {offset}")
        return record

    def iter_records(self, shard: int) -> Iterator[fmt.Record]:
        db, first = self._dbs[fmt.DB_RECORDS], fmt.record_key(shard, 0)
        self._pages.span(db, first, fmt.record_key(shard + 1, 0))
        try:
            cursor = self._txn().cursor(db=db)
            if not cursor.set_range(first):
                return
            for key, value in cursor:
                rec_shard, offset = fmt.decode_record_key(key)
                if rec_shard != shard:
                    return
                yield fmt.decode_record(
                    rec_shard, offset, value, self.config, self._shard_codec(rec_shard)
                )
        except lmdb.Error as e:
            raise FormatError(f"index is damaged listing records: {e}") from None

    def shard_info(self, shard: int) -> fmt.ShardInfo:
        """Shard ``shard``'s descriptor: from version 3 on, its entry in the shard table."""
        if not 0 <= shard < self.config.shard_count:
            raise FormatError(f"shard {shard} does not exist")
        value = self._get(self._dbs[fmt.DB_SHARDS], fmt.shard_key(shard), f"shard {shard}")
        info = fmt.decode_shard_info(value, self.marker.format_version, shard, self.config)
        if info.base > len(self.bases):
            raise FormatError(f"shard {shard} is in base {info.base}, which the index lacks")
        return info

    def _shard_codec(self, shard: int) -> int | None:
        """How ``shard``'s compressed records are stored; None (the config says) before
        version 3. Cached: every record lookup asks."""
        if self.marker.format_version < 3:
            return None
        codec = self._codecs.get(shard)
        if codec is None:
            codec = self._codecs[shard] = self.shard_info(shard).codec
        return codec


# -- what open loads and checks (totals: version 5; bases: version 6): outside the class (budget) --


def _load_owners(index: IndexReader) -> list[tuple[int, int]]:
    db, count = index._dbs[fmt.DB_OWNERS], index.config.owner_count
    return [fmt.decode_owner(index._get(db, fmt.owner_key(i), "owner")) for i in range(count)]


def _load_content_types(index: IndexReader) -> list[str]:
    """The media types entries name by index (version 2; none in version 1)."""
    count = index.config.content_type_count
    if count > fmt.MAX_CONTENT_TYPES:
        raise FormatError(f"config claims {count} content types")
    db = index._dbs.get(fmt.DB_TYPES)
    if db is None:
        return []
    held = index._txn().stat(db)["entries"]
    if held != count:
        raise FormatError(f"index holds {held} content types, the config says {count}")
    return [
        fmt.decode_content_type(index._get(db, fmt.content_type_key(i), "content type"))
        for i in range(count)
    ]


def _load_bases(index: IndexReader) -> list[fmt.BaseRef]:
    """Version 6: the base bundles, keys 1 … n without gaps (``bases[k - 1]`` is base k)."""
    db = index._dbs.get(fmt.DB_BASES)
    if db is not None:
        index._pages.span(db)
    try:
        items = [] if db is None else list(index._txn().cursor(db=db))
    except lmdb.Error as e:
        raise FormatError(f"index is damaged reading its bases: {e}") from None
    return [fmt.decode_base(n, key, value) for n, (key, value) in enumerate(items, 1)]


def _check_totals(index: IndexReader) -> None:
    """Version 5, at open: one totals key per directory, and the root's totals are the config's
    counts (an LMDB count and one lookup: no scan)."""
    db = index._dbs.get(fmt.DB_TOTALS)
    if db is None:
        return
    held = index._txn().stat(db)["entries"]
    if held != index.config.dir_count:
        raise FormatError(
            f"index holds totals of {held} directories, the config counts {index.config.dir_count}"
        )
    root = fmt.decode_totals(fmt.ROOT_INO, index._get(db, fmt.totals_key(fmt.ROOT_INO), "totals"))
    integrity.enforce(integrity.root_totals(index.config, root))


def raw_records(index: IndexReader, shard: int) -> list[tuple[bytes, bytes]]:
    """``shard``'s records as stored (``entry_scan.record_pairs``), their pages checked as
    ``iter_records``'s: for a copy into an index of this version (a pack on a base), whose
    readers decode them."""
    db, first = index._dbs[fmt.DB_RECORDS], fmt.record_key(shard, 0)
    index._pages.span(db, first, fmt.record_key(shard + 1, 0))
    return record_pairs(index._txn().cursor(db=db), shard)
