"""Compacting a bundle: ``compact`` writes a new bundle of the same tree without its dead records.

After a few generations (a merge whose clash rule hid files, packs on a base whose files
changed) a bundle's shards hold records no file of it uses (``storage.liveness``), and many
small shards. ``compact(B, NEW)`` writes NEW, a complete bundle of B's tree — the same entries
byte for byte but for where files' content is, the same owners, content types, metadata and
creation time, a new bundle id — where:

- a shard at least ``min_live`` live, and not small, is reused as it is (``reuse.ReusedShards``:
  hard-linked, else reflinked, else copied; never rewritten);
- the others are **rewritten**: their live records are copied, in stream order, into new shards
  as they are stored (``ShardWriter.write_stored``: bytes, flags and CRC unchanged, checked
  against the CRC as read, never decompressed), one series of new shards per codec, cut at
  ``shard_size`` but never between two records a file runs across; dead records are dropped;
- small shards (under a quarter of ``shard_size``) that are live enough join the rewrite on
  git repack's geometric rule (``plan``), so compacting again and again copies each byte
  O(log n) times, not once per run.

A file's new location is its record's new place plus its offset in the record (records move
whole). B is never modified; NEW is built and published by ``destination.publish_built``, as
a pack's is, so a killed compact leaves nothing that opens as NEW. ``compact_into`` compacts a
bundle built inside NEW's partial directory only to be compacted (``pack --base --compact``):
its own shards are moved in, not linked, and it is gone before NEW is sealed.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.packing``
below it (``options``, ``destination``, ``reuse``).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import os
import shutil
import time
from array import array
from collections.abc import Callable, Iterable, Sequence

from bundlefs.core import format as fmt
from bundlefs.core import integrity
from bundlefs.core.checksum import crc32c
from bundlefs.errors import BundleError, PackError
from bundlefs.packing.destination import check_places, publish_built
from bundlefs.packing.options import (
    DEFAULT_SHARD_SIZE,
    GEOMETRIC_FACTOR,
    CompactOptions,
    CompactSummary,
)
from bundlefs.packing.reuse import ReusedShards, check_linked
from bundlefs.storage import publish
from bundlefs.storage.index import IndexReader
from bundlefs.storage.index_writer import IndexWriter
from bundlefs.storage.liveness import DEFAULT_MIN_LIVE, Liveness, ShardLiveness, shard_liveness
from bundlefs.storage.location import parse_location
from bundlefs.storage.objectstore.upload import RemotePublisher
from bundlefs.storage.shard_writer import ShardWriter
from bundlefs.storage.totals import iter_totals

SMALL_SHARD = 0.25  # a shard under this fraction of the target size is small: merged geometrically


def plan(
    shards: Sequence[ShardLiveness],
    min_live: float = DEFAULT_MIN_LIVE,
    small_bytes: int = int(DEFAULT_SHARD_SIZE * SMALL_SHARD),
    factor: float = GEOMETRIC_FACTOR,
) -> list[int]:
    """The shards to rewrite, in order: every shard less live than ``min_live``, and the small
    ones (streams under ``small_bytes`` of file data) the geometric rule rolls up with them.

    The rule is git repack's ``--geometric``: weigh the small shards by their live bytes, in
    ascending order; the heaviest ones that form a progression (each at least ``factor`` times
    the one before it) stay, the ones below the highest break in it are rolled up, and so is each
    next one lighter than ``factor`` times everything rolled up so far (the sparse shards' live
    bytes included). Shards stay roughly doubling in size, so a byte is copied O(log n) times
    over many compactions. One small shard alone is never rewritten for nothing.
    """
    sparse = [s for s in shards if s.live_fraction < min_live]
    small = sorted(
        (s for s in shards if s.live_fraction >= min_live and s.stream_size < small_bytes),
        key=lambda s: (s.live_bytes, s.shard),
    )
    weights = [s.live_bytes for s in small]
    split = 0
    for i in range(len(weights) - 1, 0, -1):
        if weights[i] < factor * weights[i - 1]:
            split = i + 1  # the heavier of the pair that breaks the progression goes too
            break
    total = sum(s.live_bytes for s in sparse) + sum(weights[:split])
    while split < len(weights) and weights[split] < factor * total:
        total += weights[split]
        split += 1
    return sorted(s.shard for s in sparse + small[:split])


def compact(
    src: str | os.PathLike[str],
    dest: str,
    options: CompactOptions = CompactOptions(),  # noqa: B008 - frozen, safe as a default
) -> CompactSummary:
    """Write ``dest`` (a new directory, or a URL: built locally, then uploaded), a bundle of the
    local bundle ``src``'s tree without the records no file uses; see the module docstring.

    Raises ``PackError`` for every failure (``src`` not a local bundle or damaged where a record
    is copied, ``dest`` overlapping it or existing without ``force``) and leaves nothing behind.
    """
    started = time.monotonic()
    if not 0 <= options.min_live <= 1:
        raise PackError(f"--min-live {options.min_live} is not a fraction from 0 to 1")
    if options.shard_size <= 0:
        raise PackError("the shard size must be positive")
    path = _local_bundle(os.fspath(src))
    try:
        location = parse_location(dest, options.storage_options)
    except PackError:
        raise
    except BundleError as e:
        raise PackError(str(e)) from None
    remote = None if location.is_local else RemotePublisher(location)
    try:
        reader = IndexReader(path)
    except BundleError as e:
        raise PackError(f"{path} is not a bundle that can be compacted: {e}") from None
    try:
        if remote is not None:
            remote.check(options.force)
        else:
            if os.path.realpath(location.path) == os.path.realpath(path):
                raise PackError("compact never replaces its bundle: give a new path for NEW")
            check_places(path, location.path, options.force)
        compactor = Compactor(reader, path, options)
        summary, where = publish_built(
            location,
            remote,
            compactor.run,
            force=options.force,
            staging=options.staging,
            what="cannot compact the bundle",
        )
    finally:
        reader.close()
    summary.dest = where
    summary.seconds = time.monotonic() - started
    return summary


def compact_into(
    path: str, work: str, work_id: tuple[int, int], options: CompactOptions
) -> CompactSummary:
    """Compact the bundle just built at ``path``, a directory inside ``work``, into ``work``
    and seal it there: the shards it wrote that are kept are moved in as NEW's own, and ``path``
    is removed before NEW is sealed (``pack --base --compact``: one publish)."""
    started = time.monotonic()
    readers = [IndexReader(path)]

    def discard() -> None:
        readers.pop().close()
        shutil.rmtree(path)

    try:
        compactor = Compactor(readers[0], path, options, adopt=True)
        summary = compactor.run(work, work_id, discard)
    finally:
        for reader in readers:
            reader.close()
    summary.seconds = time.monotonic() - started
    return summary


def _local_bundle(path: str) -> str:
    try:
        location = parse_location(path)
    except BundleError as e:
        raise PackError(str(e)) from None
    if not location.is_local:
        raise PackError(f"{path}: compact links shard files, so its bundle must be local")
    if not os.path.isdir(location.path):
        raise PackError(f"{path} is not a bundle (no such directory)")
    return location.path


class Compactor:
    """One compaction of ``reader``'s bundle (at ``path``) into ``work`` (``run``, which seals
    it). ``adopt``: the bundle was built only to be compacted and is discarded after (``pack
    --base --compact``, ``packer``): its own shards kept are moved into NEW as NEW's own."""

    def __init__(
        self, reader: IndexReader, path: str, options: CompactOptions, *, adopt: bool = False
    ) -> None:
        self.reader = reader
        self.path = path
        self.options = options
        self.adopt = adopt
        self.shards = shard_liveness(reader)
        small = int(options.shard_size * SMALL_SHARD)
        self.rewrite = plan(self.shards, options.min_live, small, options.factor)
        gone = set(self.rewrite)
        self.keep = [s for s in range(len(self.shards)) if s not in gone]
        self.kept_as = {shard: new for new, shard in enumerate(self.keep)}
        self.moved: dict[int, tuple[array, array]] = {}  # shard -> (new shard, new start)

    def run(
        self, work: str, work_id: tuple[int, int], sealing: Callable[[], None] | None = None
    ) -> CompactSummary:
        """Build NEW in ``work`` and seal it; ``sealing()`` just before (the reader still open:
        an adopted bundle is discarded then)."""
        reused = ReusedShards([self.reader], [self.path], select=[self.keep], adopt=self.adopt)
        ways = reused.link(work)
        copier = _Copier(work, self.reader.config, reused.count, self.options.shard_size)
        try:
            for shard in self.rewrite:
                self.moved[shard] = copier.copy(self.path, self.reader, self.shards[shard])
            if reused.count == 0 and not copier.numbers:
                copier.empty()  # every bundle has a shard, even one whose every byte was dead
            copier.close()
        except BaseException:
            copier.abort()
            raise
        count = reused.count + len(copier.done)
        index = IndexWriter(os.path.join(work, fmt.INDEX_DIR))
        try:
            self._entries(index)
            self._totals(index)
            self._tables(index)
            adopted = reused.import_table(index)
            for number, (info, records) in enumerate(copier.done, reused.count):
                for record in records:
                    index.put_record(record)
                index.put_shard(number, info)
            config = self._config(count, reused.codecs() | {i.codec for i, _r in copier.done})
            index.put_config(config)
        except BaseException:
            with contextlib.suppress(BundleError):
                index.abort()
            raise
        index.close()  # a close that fails is not followed by an abort
        if sealing is not None:
            sealing()
        own = [*adopted, *range(reused.count, count)]
        marker = publish.seal(work, count, own_shards=own)
        kept = [self.shards[s] for s in self.keep]
        return CompactSummary(
            dest="",
            config=config,
            before=Liveness.of(self.shards, self.options.min_live),
            kept=len(self.keep),
            rewritten=len(self.rewrite),
            dropped=sum(1 for s in self.rewrite if not any(self.shards[s].live)),
            written=len(copier.done),
            records_copied=copier.records,
            ways=ways,
            stored_bytes=sum(s.file_size for s in kept)
            + sum(info.file_size for info, _records in copier.done),
            index_bytes=marker.index_size,
            own_bytes=sum(os.path.getsize(os.path.join(work, fmt.shard_filename(n))) for n in own),
            dead_bytes=sum(s.file_size - s.live_bytes for s in kept),  # written shards: all live
        )

    def _entries(self, index: IndexWriter) -> None:
        """B's entries in inode order, each as it is but for where a file's content went."""
        reader, version = self.reader, self.reader.marker.format_version
        count = reader.config.entry_count
        if version < 3:  # an older layout: decoded, and encoded in this version's
            for entry in reader.iter_entries(fmt.ROOT_INO, count):
                if entry.is_file and not entry.is_link:
                    shard, offset = self._relocated(entry.shard, entry.offset, entry.size)
                    entry = dataclasses.replace(entry, shard=shard, offset=offset)
                index.put_entry(entry)
            return
        values = (value for _ino, value in reader.iter_raw(fmt.ROOT_INO, count))
        for ino, value in enumerate(fmt.relocate_files(values, self._relocated), fmt.ROOT_INO):
            index.put_entry_value(ino, value)

    def _totals(self, index: IndexWriter) -> None:
        """The directory totals (format version 5): B's, or added up from B's entries when B
        is older."""
        reader, count = self.reader, self.reader.config.entry_count
        found: Iterable[tuple[int, fmt.TreeTotals]] = iter_totals(reader)
        if reader.marker.format_version < fmt.FIRST_V5_VERSION:
            found = integrity.totals_of(reader.iter_entries(fmt.ROOT_INO, count))
        for ino, totals in found:
            index.put_totals(ino, totals)

    def _relocated(self, shard: int, offset: int, size: int) -> tuple[int, int]:
        """Where stream byte ``offset`` of B's ``shard`` is in NEW."""
        if shard in self.kept_as:
            return self.kept_as[shard], offset
        if not size:
            return 0, 0  # an empty file's place is any shard's start
        if shard not in self.moved:
            raise fmt.FormatError(f"a file names shard {shard}, which the bundle does not have")
        starts = self.shards[shard].starts
        i = bisect.bisect_right(starts, offset) - 1
        new_shards, new_starts = self.moved[shard]
        if new_shards[i] < 0:  # never for a valid index: a file's records are live
            raise fmt.FormatError(f"a file of shard {shard} is stored in no record")
        return new_shards[i], new_starts[i] + offset - starts[i]

    def _tables(self, index: IndexWriter) -> None:
        """Owners, content types and metadata, as B has them (the entries' indexes into them)."""
        reader = self.reader
        for number, (uid, gid) in enumerate(reader.owners):
            index.put_owner(number, uid, gid)
        for number, media_type in enumerate(reader.content_types):
            index.put_content_type(number, media_type)
        index.put_meta(reader.meta())

    def _config(self, shard_count: int, codecs: set[int]) -> fmt.Config:
        """B's config (counts, layout, creation time) in this version, with NEW's shards; zstd
        if any shard is, as a merge says it."""
        config = self.reader.config
        codec = fmt.COMPRESSION_ZSTD if fmt.COMPRESSION_ZSTD in codecs else config.record_codec
        return dataclasses.replace(
            config,
            shard_count=shard_count,
            compression=codec,
            format_version=fmt.FORMAT_VERSION,
        )


class _Copier:
    """The live records of rewritten shards into new shards, numbered from ``first``: one open
    shard per codec, cut at ``shard_size`` where no file runs across the cut."""

    def __init__(self, work: str, config: fmt.Config, first: int, shard_size: int) -> None:
        self.work = work
        self.config = dataclasses.replace(config, format_version=fmt.FORMAT_VERSION)
        self.first = first
        self.shard_size = shard_size
        self.open: dict[int, ShardWriter] = {}  # codec -> the shard being written
        self.numbers: list[ShardWriter] = []  # every shard opened, by number - first
        self.infos: dict[int, fmt.ShardInfo] = {}  # number -> descriptor, once finished
        self.done: list[tuple[fmt.ShardInfo, list[fmt.Record]]] = []
        self.records = 0

    def copy(self, path: str, reader: IndexReader, live: ShardLiveness) -> tuple[array, array]:
        """Copy ``live``'s live records from the shard file in ``path``; per record of it, its
        new shard and stream offset (-1 and 0 for a dead one)."""
        name = fmt.shard_filename(live.shard, reader.marker.format_version)
        shard_path = os.path.join(path, name)
        check_linked(reader, live.shard, shard_path, shard_path)  # header and size as indexed
        new_shards = array("l", [-1]) * len(live.starts)
        new_starts = array("Q", [0]) * len(live.starts)
        with open(shard_path, "rb") as f:
            for i, record in enumerate(reader.iter_records(live.shard)):
                if not live.live[i]:
                    continue
                stored = os.pread(f.fileno(), record.stored_length, record.stored_offset)
                if len(stored) != record.stored_length or (
                    stored and crc32c(stored) != record.crc32c
                ):
                    raise PackError(
                        f"{shard_path} is damaged in the record at stream offset "
                        f"{record.offset:,}: compact copies no damaged record "
                        f"('bundlefs verify {path}' names the files it holds)"
                    )
                writer = self._writer(live.codec, bool(live.joined[i]))
                new_shards[i], new_starts[i] = writer.index, writer.stream_size
                writer.write_stored(record.length, stored, record.flags, record.crc32c)
                self.records += 1
        return new_shards, new_starts

    def _writer(self, codec: int, joined: bool) -> ShardWriter:
        """The shard the next record of ``codec`` goes to: a new one past ``shard_size``, unless
        a file runs into the record from the one before."""
        writer = self.open.get(codec)
        if writer is not None and writer.stream_size >= self.shard_size and not joined:
            self._finish(codec)
            writer = None
        if writer is None:
            number = self.first + len(self.numbers)
            if number >= fmt.MAX_SHARDS:
                raise PackError("the compacted bundle would need more than 65,536 shards")
            config = dataclasses.replace(self.config, compression=codec)
            path = os.path.join(self.work, fmt.shard_filename(number))
            writer = self.open[codec] = ShardWriter(path, number, config)
            self.numbers.append(writer)
        return writer

    def _finish(self, codec: int) -> None:
        writer = self.open.pop(codec)
        self.infos[writer.index] = writer.finish()

    def empty(self) -> None:
        """One shard with no record (a bundle without a live byte still has a shard)."""
        self._writer(self.config.record_codec, False)

    def close(self) -> None:
        """Finish every open shard; ``done`` then holds each one's descriptor and records."""
        for codec in list(self.open):
            self._finish(codec)
        for writer in self.numbers:
            self.done.append((self.infos[writer.index], writer.records))

    def abort(self) -> None:
        for writer in self.open.values():
            writer.abort()
        self.open.clear()
