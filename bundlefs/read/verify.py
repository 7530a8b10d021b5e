"""``verify``: the full consistency and checksum scan of a bundle.

It owns the answer to "is this bundle intact, and if not, which files are damaged?". It reads
everything — the marker, the index checksum, every shard header, every record (CRC and
decompression), every entry and the directory tree they form, and every file's content CRC — and
keeps going after damage, so one run names every damaged file. Damage never raises: it becomes a
``Problem`` in the report. Only a directory that cannot be opened as a bundle at all raises.

The tree invariants and count fields are core/integrity.py's rules, the same ones the reader
enforces; here every rule is applied to every entry and each broken one is collected.

A bundle at a URL is verified where it lives: the index fetched (checked against the marker, as
every open does), the shard objects listed and their headers and records fetched, never served
from the on-disk record cache (which would verify the cache, not the store).
May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.read``.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.core import integrity
from bundlefs.errors import BundleError, CorruptDataError, FormatError
from bundlefs.read.bundle import Bundle, ShardDamage
from bundlefs.storage.index import check_index_file
from bundlefs.storage.location import Location, parse_location
from bundlefs.storage.publish import read_marker
from bundlefs.storage.remote import (
    DEFAULT_STORE_TIMEOUT,
    RemoteShardStore,
    check_store_timeout,
    fetch_index,
    list_shard_names,
)
from bundlefs.storage.shards import ShardSet
from bundlefs.storage.store import LocalShardStore

# Per-inode kinds in the scan's compact table (one byte per inode, so millions of entries fit).
_BAD, _FILE, _DIR, _SYMLINK, _LINK, _SPECIAL = 0, 1, 2, 3, 4, 5
_NAME_AFTER_PREVIOUS = 0x10  # bit: this entry's name sorts after the previous inode's name


@dataclass(frozen=True)
class Problem:
    """One thing found wrong; ``kind`` is marker, index, config, shard, record, entry or file."""

    kind: str
    message: str
    path: str | None = None
    shard: int | None = None
    record: int | None = None

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, object]:
        """As ``bundlefs verify --json`` lists it (the record offset is in the message)."""
        return {"kind": self.kind, "message": self.message, "path": self.path, "shard": self.shard}


@dataclass(frozen=True)
class VerifyProgress:
    phase: str  # "index", "records", "entries", "files"
    done: int
    total: int
    bytes_checked: int
    started: float


@dataclass
class VerifyReport:
    bundle: str
    entries: int = 0
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    hardlinks: int = 0
    specials: int = 0  # FIFOs, sockets, devices
    shards: int = 0
    records: int = 0
    # Shard bytes read and found sound: each shard's header block and its records' stored
    # bytes (to the block boundary each is padded to). An intact bundle's equals
    # ``stored_bytes``, what ``info`` prints as "stored bytes"; it never exceeds it.
    bytes_checked: int = 0
    stored_bytes: int = 0  # the shard files' sizes by the shard table
    data_bytes: int | None = None  # the files' bytes, as ``info`` prints them; None: unopened
    index_bytes: int = 0  # the index file, checked whole (its CRC) before anything else
    seconds: float = 0.0
    problems: list[Problem] = field(default_factory=list)
    damaged_files: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, object]:
        """The report as ``bundlefs verify --json`` prints it."""
        return {
            "bundle": self.bundle,
            "ok": self.ok,
            "entries": self.entries,
            "files": self.files,
            "dirs": self.dirs,
            "symlinks": self.symlinks,
            "hardlinks": self.hardlinks,
            "specials": self.specials,
            "shards": self.shards,
            "records": self.records,
            "bytes_checked": self.bytes_checked,
            "stored_bytes": self.stored_bytes,
            "data_bytes": self.data_bytes,
            "index_bytes": self.index_bytes,
            "seconds": round(self.seconds, 3),
            "problems": [p.to_dict() for p in self.problems],
            "damaged_files": self.damaged_files,
        }


def verify(
    bundle_path: str | os.PathLike,
    progress: Callable[[VerifyProgress], None] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    disk_cache: str | os.PathLike[str] | None = None,
    disk_cache_size: int | None = None,
    store_timeout: float | None = None,
) -> VerifyReport:
    """Scan a whole bundle. Raises only if ``bundle_path`` is not a bundle at all.

    ``bundle_path`` may be a URL; ``storage_options`` and ``disk_cache`` are then ``Bundle``'s
    (the index is cached there; records are not: ``disk_cache_size`` is accepted for the CLI's
    sake and ignored, as verify reads every record from the store itself), ``store_timeout``
    bounds each fetch as it does ``Bundle``'s.
    """
    location = parse_location(os.fsdecode(os.fspath(bundle_path)), storage_options)
    timeout = DEFAULT_STORE_TIMEOUT if store_timeout is None else store_timeout
    return _Verifier(location, progress, disk_cache, check_store_timeout(timeout)).run()


class _Verifier:
    def __init__(
        self,
        location: Location,
        progress,
        disk_cache: str | os.PathLike[str] | None = None,
        store_timeout: float = DEFAULT_STORE_TIMEOUT,
    ) -> None:
        self.location = location
        self._timeout = store_timeout
        # A local bundle's directory, or (after run() fetched it) a remote one's cached index.
        self.path = location.path if location.is_local else location.url
        self._local_dir = self.path
        self._disk_cache = disk_cache
        self._remote: RemoteShardStore | None = None
        self.report = VerifyReport(self.path)
        self._progress = progress
        self._last_tick = 0.0
        self._started = time.monotonic()
        self._damaged_files: set[str] = set()
        # shard -> sorted [(start, end)] of stream ranges whose records are damaged or missing
        self._bad_ranges: dict[int, list[tuple[int, int]]] = {}
        self._shard_sizes: dict[int, int] = {}

    def problem(self, kind: str, message: str, **where) -> None:
        self.report.problems.append(Problem(kind, message, **where))

    def _open(self) -> Bundle:
        if self.location.is_local:
            return Bundle(self.path, check_index=False, cache_size=64 * 1024 * 1024)
        # No records on disk: the files are checked as the store holds them.
        return Bundle(
            self.location.url,
            check_index=False,
            cache_size=64 * 1024 * 1024,
            storage_options=self.location.storage_options,
            disk_cache=self._disk_cache,
            disk_cache_size=0,
            store_timeout=self._timeout,
        )

    def _store(self, bundle: Bundle, marker: fmt.Marker) -> LocalShardStore | RemoteShardStore:
        if self.location.is_local:
            return LocalShardStore(self.path)
        sizes = {
            fmt.shard_filename(i, marker.format_version): bundle.content.shard_info(i).file_size
            for i in range(bundle.config.shard_count)
        }
        self._remote = RemoteShardStore(
            self.location,
            marker.bundle_id,
            shard_sizes=sizes,
            disk_cache_size=0,
            store_timeout=self._timeout,
        )
        return self._remote

    def run(self) -> VerifyReport:
        # A missing or invalid marker means "not a bundle": that raises, as opening would.
        if not self.location.is_local:
            # Fetched and checked against the remote marker (a mismatch raises: the index the
            # marker vouches for is not there); the checks below then run on the local copy.
            self._local_dir = fetch_index(self.location, self._disk_cache, timeout=self._timeout)
        marker = read_marker(self._local_dir)
        if self._check_index_file(marker):
            try:
                bundle = self._open()
            except (FormatError, OSError) as e:
                self.problem("index", f"the index cannot be read: {e}")
            else:
                # A ShardSet of our own loads records without going through (or filling) the cache.
                self._shards = ShardSet(
                    self._store(bundle, marker), marker, bundle.content.shard_info
                )
                self._version = marker.format_version
                self._bundle_id = marker.bundle_id
                try:
                    with bundle:
                        self._scan(bundle)
                finally:
                    self._shards.close()
        self.report.damaged_files = sorted(self._damaged_files)
        self.report.seconds = time.monotonic() - self._started
        return self.report

    def _scan(self, bundle: Bundle) -> None:
        self.report.shards = bundle.config.shard_count
        self._check_shard_names(bundle.config.shard_count)
        self._check_shards(bundle)
        self._merge_bad_ranges()
        tree = self._check_entries(bundle)
        if tree is not None:
            self._check_files(bundle, tree)

    def _tick(self, phase: str, done: int, total: int) -> None:
        if self._progress is None:
            return
        now = time.monotonic()
        if now - self._last_tick >= 0.2 or done == total:
            self._last_tick = now
            self._progress(
                VerifyProgress(phase, done, total, self.report.bytes_checked, self._started)
            )

    # -- marker and index file ---------------------------------------------------------------------

    def _check_index_file(self, marker: fmt.Marker) -> bool:
        """Size, LMDB meta pages and checksum of data.mdb; False if LMDB must not open it."""
        self._tick("index", 0, 1)
        try:
            check_index_file(self._local_dir, marker)
        except BundleError as e:
            self.problem("index", f"the index is damaged: {e}")
            return False
        self.report.index_bytes = marker.index_size
        return True

    # -- shards and records ------------------------------------------------------------------------

    def _check_shards(self, bundle: Bundle) -> None:
        self.report.data_bytes = bundle.config.data_bytes
        for shard in range(bundle.config.shard_count):
            try:
                info = bundle.content.shard_info(shard)
            except FormatError as e:
                self.problem("shard", f"shard {shard}: descriptor unreadable: {e}", shard=shard)
                self._mark_bad(shard, 0, fmt.MAX_SHARD_STREAM)
                continue
            self._shard_sizes[shard] = info.uncompressed_size
            self.report.stored_bytes += info.file_size
            file_size = self._check_shard_file(bundle, shard, info)
            self._check_records(bundle, shard, info, file_size)

    def _check_shard_names(self, shard_count: int) -> None:
        """Every ``shard-*`` file must be one the index lists, named as the bundle's version
        names shards: a hex name in a version-2 bundle (or the reverse) is a shard renamed by
        hand or copied from another bundle, and a stray shard is not part of this bundle."""
        expected = {fmt.shard_filename(i, self._version) for i in range(shard_count)}
        try:
            if self._remote is not None:
                names = list_shard_names(self.location, self._remote.filesystem)
            else:
                names = sorted(n for n in os.listdir(self.path) if n.startswith(fmt.SHARD_PREFIX))
        except OSError as e:
            self.problem("shard", f"cannot list {self.path}: {e.strerror or e}")
            return
        except Exception as e:  # an object store's listing: any failure is "cannot list"
            self.problem("shard", f"cannot list {self.path}: {e}")
            return
        other = 1 if self._version >= 2 else 2
        for name in names:
            if name in expected:
                continue
            digits = name[len(fmt.SHARD_PREFIX) :]
            index = _shard_index_of(digits, other)
            if index is not None and index < shard_count:
                message = (
                    f"{name} is named as format version {other} names shard {index}; this "
                    f"bundle is version {self._version} and reads it as "
                    f"{fmt.shard_filename(index, self._version)}"
                )
            else:
                message = f"{name} is not a shard of this bundle (the index lists {shard_count})"
            self.problem("shard", message)

    def _check_shard_file(self, bundle: Bundle, shard: int, info: fmt.ShardInfo) -> int | None:
        name = fmt.shard_filename(shard, self._version)
        path = self.location.child(name)
        try:
            if self._remote is not None:
                size, header = self._remote.size_and_header(name, fmt.SHARD_HEADER_SIZE)
            else:
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    header = f.read(fmt.SHARD_HEADER_SIZE)
        except OSError as e:
            reason = e.strerror or str(e)
            self.problem("shard", f"shard {shard}: cannot read {path}: {reason}", shard=shard)
            return None
        # First: a shard of the wrong size (truncated, most often) explains what follows.
        if size != info.file_size:
            self.problem("shard", str(ShardDamage(shard, name, info.file_size, size)), shard=shard)
        try:
            fmt.check_shard_header(header, shard, self._bundle_id, info)
        except BundleError as e:
            self.problem("shard", f"shard {shard}: bad header: {e}", shard=shard)
        else:
            self.report.bytes_checked += min(size, bundle.config.block_size)
        return size

    def _check_records(
        self, bundle: Bundle, shard: int, info: fmt.ShardInfo, file_size: int | None
    ) -> None:
        expected = 0  # next stream offset a record must start at
        stored_end = bundle.config.block_size  # records follow the header block, in order
        count = 0
        records = bundle.content.records(shard)
        while True:
            try:
                record = next(records)
            except StopIteration:
                break
            except FormatError as e:
                self.problem("record", f"shard {shard}: record index damaged: {e}", shard=shard)
                self._mark_bad(shard, expected, max(expected + 1, info.uncompressed_size))
                return
            count += 1
            self.report.records += 1
            # Where it is in the file (what a user can compare with the shard's size); the
            # stream offset is what the index and the damaged files' messages use.
            where = (
                f"shard {shard} record stored at byte {record.stored_offset:,} "
                f"(stream offset {record.offset:,})"
            )
            bad = None
            if record.offset != expected:
                what = "gap before" if record.offset > expected else "overlap at"
                bad = f"{what} {where} (expected offset {expected})"
                self._mark_bad(shard, min(expected, record.offset), max(expected, record.offset))
            elif record.stored_length and record.stored_offset < stored_end:
                bad = f"{where}: stored bytes overlap the previous record"
            elif file_size is not None and record.stored_offset + record.stored_length > file_size:
                bad = f"{where}: stored bytes run past the end of the shard file"
            if bad is None:
                try:
                    self._shards.load(record)
                    if record.stored_length:
                        end = record.stored_offset + record.stored_length
                        padded = fmt.pad_to(end, bundle.config.block_size)
                        self.report.bytes_checked += min(padded, file_size or end) - (
                            record.stored_offset
                        )
                except CorruptDataError as e:
                    bad = f"{where}: {e.detail}"
            if bad is not None:
                self.problem("record", bad, shard=shard, record=record.offset)
                self._mark_bad(shard, record.offset, record.end)
            expected = max(expected, record.end)
            if record.stored_length:
                stored_end = max(
                    stored_end,
                    fmt.pad_to(
                        record.stored_offset + record.stored_length, bundle.config.block_size
                    ),
                )
            self._tick("records", self.report.records, 0)
        if expected != info.uncompressed_size:
            self.problem(
                "record",
                f"shard {shard}: records cover {expected} bytes of a "
                f"{info.uncompressed_size}-byte stream",
                shard=shard,
            )
            self._mark_bad(shard, min(expected, info.uncompressed_size), fmt.MAX_SHARD_STREAM)
        if count != info.record_count:
            self.problem(
                "record",
                f"shard {shard}: {count} records, the index says {info.record_count}",
                shard=shard,
            )

    def _mark_bad(self, shard: int, start: int, end: int) -> None:
        self._bad_ranges.setdefault(shard, []).append((start, end))

    def _merge_bad_ranges(self) -> None:
        """Sort and merge each shard's damaged ranges, so a lookup is one bisection."""
        for shard, ranges in self._bad_ranges.items():
            merged: list[tuple[int, int]] = []
            for lo, hi in sorted(ranges):
                if merged and lo <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
                else:
                    merged.append((lo, hi))
            self._bad_ranges[shard] = merged

    def _bad_range_in(self, shard: int, start: int, end: int) -> tuple[int, int] | None:
        """A damaged range of ``shard`` overlapping stream bytes ``start … end−1``, if any."""
        ranges = self._bad_ranges.get(shard)
        if not ranges or start >= end:
            return None
        i = bisect.bisect_right(ranges, (end - 1, fmt.MAX_SHARD_STREAM + 1)) - 1
        if i >= 0 and ranges[i][1] > start:
            return ranges[i]
        return None

    # -- entries and the directory tree ------------------------------------------------------------

    def _check_entries(self, bundle: Bundle) -> _Tree | None:
        config, tree_model = bundle.config, bundle.tree
        n = config.entry_count
        tree = _Tree(bundle, n)
        counts = integrity.TreeCounts()
        links: list[tuple[int, int]] = []  # (LINK entry, target)
        nlinks: dict[int, int] = {}  # file with an NLINK part -> its nlink
        previous: bytes | None = None
        for ino in range(1, n + 1):
            self._tick("entries", ino, n)
            try:
                entry = tree_model.stored_entry(ino)
            except FormatError as e:
                self.problem("entry", f"entry {ino}: {e}")
                previous = None
                continue
            counts.add(entry)
            kind = _BAD
            if entry.is_link:
                kind = _LINK
                links.append((ino, entry.target))
            elif entry.is_file:
                kind = _FILE
                if entry.flags & fmt.FLAG_NLINK:
                    nlinks[ino] = entry.nlink
            elif entry.is_dir:
                kind = _DIR
                tree.add_dir(entry)
            elif entry.is_symlink:
                kind = _SYMLINK
            elif entry.is_special:
                kind = _SPECIAL
            # Which directory lists an inode is known only once every directory is read: keep
            # the one bit the name-order rule needs against the inode before it.
            if previous is not None and integrity.child_order(0, previous, entry.name) is None:
                kind |= _NAME_AFTER_PREVIOUS
            tree.kinds[ino] = kind
            previous = entry.name
        self.report.entries = n
        self.report.files, self.report.dirs = counts.files, counts.dirs
        self.report.symlinks, self.report.hardlinks = counts.symlinks, counts.hardlinks
        self.report.specials = counts.specials
        try:
            extra = next(tree_model.stored_entries(n + 1, 1), None)
        except FormatError:
            extra = None  # "no entry n+1": as it should be
        if extra is not None:
            self.problem("entry", f"entry {n + 1} exists past the entry count {n}")
        for message in counts.problems_against(config):
            self.problem("config", message)
        self._check_tree(tree)
        self._check_links(tree, links, nlinks)
        return tree

    def _check_tree(self, tree: _Tree) -> None:
        kinds = tree.kinds
        if kinds[fmt.ROOT_INO] & 0x0F != _DIR:
            self.problem("entry", "the root entry is not a readable directory")
        tree.sort()
        covered = fmt.ROOT_INO + 1  # the next inode a child range must start at
        for first, count, directory in tree.ranges:
            end = first + count
            if first != covered:
                what = "no directory holds" if first > covered else "two directories hold"
                lo, hi = min(first, covered), max(first, covered) - 1
                self.problem("entry", f"{what} entries {lo}…{hi}")
            if end - 1 > len(kinds) - 1:
                self.problem("entry", f"directory {directory} lists children past the last entry")
            covered = max(covered, end)
            subdirs = 0
            for ino in range(first, min(end, len(kinds))):
                kind = kinds[ino]
                if kind & 0x0F == _DIR:
                    subdirs += 1
                if ino > first and kind and kinds[ino - 1] and not kind & _NAME_AFTER_PREVIOUS:
                    names = tree.name(ino - 1), tree.name(ino)
                    message = integrity.child_order(directory, *names)
                    self.problem("entry", f"{tree.path(ino)}: {message}", path=tree.path(ino))
            parent, nlink = tree.dirs[directory]
            message = integrity.directory_nlink(nlink, subdirs)
            if message is not None:
                self.problem("entry", f"directory {tree.path(directory)} {message}")
        if covered != len(kinds):
            self.problem("entry", f"no directory holds entries {covered}…{len(kinds) - 1}")
        for directory, (parent, _nlink) in tree.dirs.items():
            holder = tree.holder(directory)
            expected = fmt.ROOT_INO if directory == fmt.ROOT_INO else holder
            message = integrity.child_directory_parent(directory, parent, expected)
            if message is not None:
                self.problem("entry", f"{tree.path(directory)}: {message}")

    def _check_links(self, tree: _Tree, links: list, nlinks: dict[int, int]) -> None:
        names: dict[int, int] = {}
        for ino, target in links:
            is_file = 1 <= target < len(tree.kinds) and tree.kinds[target] & 0x0F == _FILE
            message = integrity.link_target(ino, target, bool(is_file))
            if message is not None:
                self.problem("entry", f"{tree.path(ino)}: {message}", path=tree.path(ino))
                continue
            names[target] = names.get(target, 1) + 1
        for ino in set(names) | set(nlinks):
            message = integrity.link_count(nlinks.get(ino, 1), names.get(ino, 1))
            if message is not None:
                self.problem("entry", f"{tree.path(ino)}: {message}", path=tree.path(ino))

    # -- file content ------------------------------------------------------------------------------

    def _check_files(self, bundle: Bundle, tree: _Tree) -> None:
        n = len(tree.kinds) - 1
        for ino in range(1, n + 1):
            self._tick("files", ino, n)
            if tree.kinds[ino] & 0x0F != _FILE:
                continue
            try:
                entry = bundle.tree.stored_entry(ino)
            except FormatError:
                continue  # reported by the entry scan
            path = tree.path(ino)
            message = self._check_file(bundle, entry, path)
            if message is not None:
                self._damaged_files.add(path)
                for link in tree.links_to(ino):
                    self._damaged_files.add(tree.path(link))
                self.problem("file", f"{path}: {message}", path=path, shard=entry.shard)

    def _check_file(self, bundle: Bundle, entry: fmt.Entry, path: str) -> str | None:
        """Why the file is damaged, or None."""
        if entry.shard not in self._shard_sizes:
            return f"stored in shard {entry.shard}, which does not exist or is unreadable"
        if entry.offset + entry.size > self._shard_sizes[entry.shard]:
            return f"extends past the end of shard {entry.shard}'s stream"
        message = None
        try:
            for _piece in bundle.content.iter_content(entry, path):
                pass  # its CRC is checked as it is read; the records' bytes are counted above
        except CorruptDataError as e:
            message = e.detail + (f" (shard {e.shard})" if e.shard is not None else "")
            if e.record is not None:
                message = f"{e.detail} (shard {e.shard}, record at stream offset {e.record:,})"
        except (BundleError, OSError) as e:
            message = str(e)
        bad = self._bad_range_in(entry.shard, entry.offset, entry.offset + entry.size)
        if message is None and bad is not None:
            # Its own bytes check out, but it shares a damaged record: name it all the same.
            message = f"shares a damaged record (shard {entry.shard}, stream offset {bad[0]:,})"
        return message


class _Tree:
    """Compact facts about the directory tree, enough to check it and to name any inode's path."""

    def __init__(self, bundle: Bundle, entry_count: int) -> None:
        self._bundle = bundle
        self.kinds = bytearray(entry_count + 1)
        self.dirs: dict[int, tuple[int, int]] = {}  # directory -> (parent field, nlink)
        self._children: dict[int, tuple[int, int]] = {}  # directory -> (first_child, count)
        self.ranges: list[tuple[int, int, int]] = []  # (first_child, count, directory), sorted
        self._firsts: list[int] = []
        self._links: dict[int, list[int]] | None = None

    def add_dir(self, entry: fmt.Entry) -> None:
        self.dirs[entry.ino] = (entry.parent, entry.nlink)
        if entry.size:
            self._children[entry.ino] = (entry.first_child, entry.size)

    def sort(self) -> None:
        self.ranges = sorted((f, c, d) for d, (f, c) in self._children.items())
        self._firsts = [f for f, _c, _d in self.ranges]

    def holder(self, ino: int) -> int | None:
        """The directory whose child range holds ``ino``."""
        i = bisect.bisect_right(self._firsts, ino) - 1
        if i >= 0:
            first, count, directory = self.ranges[i]
            if first <= ino < first + count:
                return directory
        return None

    def name(self, ino: int) -> bytes:
        try:
            return self._bundle.tree.stored_entry(ino).name
        except FormatError:
            return b""

    def path(self, ino: int) -> str:
        """The path of an inode from the root, as well as a damaged tree allows."""
        parts: list[bytes] = []
        seen = set()
        while ino != fmt.ROOT_INO:
            if ino in seen or len(parts) > 4096:
                return f"<inode {ino}: directory cycle>"
            seen.add(ino)
            try:
                parts.append(self._bundle.tree.stored_entry(ino).name)
            except FormatError:
                parts.append(b"<inode %d>" % ino)
            holder = self.holder(ino)
            if holder is None:
                parts.append(b"<detached>")
                break
            ino = holder
        return os.fsdecode(b"/".join(reversed(parts))) or "/"

    def links_to(self, target: int) -> list[int]:
        """LINK entries that name ``target`` (built on first use: only damaged files need it)."""
        if self._links is None:
            self._links = {}
            tree = self._bundle.tree
            for ino, kind in enumerate(self.kinds):
                if kind & 0x0F == _LINK:
                    try:
                        self._links.setdefault(tree.stored_entry(ino).target, []).append(ino)
                    except FormatError:
                        continue
        return self._links.get(target, [])


def _shard_index_of(digits: str, version: int) -> int | None:
    """The shard index a ``shard-`` suffix means under ``version``'s naming, if any."""
    if len(digits) != 8:
        return None
    allowed = "0123456789abcdef" if version == 1 else "0123456789"
    if any(c not in allowed for c in digits):
        return None
    return int(digits, 16 if version == 1 else 10)
