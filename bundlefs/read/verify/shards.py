"""``verify``'s shard phase: the shard files' names, sizes and headers, and every record.

Each record is loaded (CRC and decompression) straight from the ``ShardSet``, not through the
record cache. What is damaged is kept as stream ranges per shard (``BadRanges``), so the file
phase can name every file stored in a damaged record, even one whose own bytes check out.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.read``.
"""

from __future__ import annotations

import bisect
import contextlib
import os

from bundlefs.core import format as fmt
from bundlefs.errors import BundleError, CorruptDataError, FormatError
from bundlefs.read.assemble import BundleParts
from bundlefs.read.facts import ShardDamage
from bundlefs.read.verify.report import Findings
from bundlefs.storage.objectstore.shard_store import list_shard_names


class BadRanges:
    """Per shard, the stream ranges whose records are damaged or missing."""

    def __init__(self) -> None:
        self._ranges: dict[int, list[tuple[int, int]]] = {}

    def mark(self, shard: int, start: int, end: int) -> None:
        self._ranges.setdefault(shard, []).append((start, end))

    def merge(self) -> None:
        """Sort and merge each shard's ranges, so a lookup is one bisection."""
        for shard, ranges in self._ranges.items():
            merged: list[tuple[int, int]] = []
            for lo, hi in sorted(ranges):
                if merged and lo <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
                else:
                    merged.append((lo, hi))
            self._ranges[shard] = merged

    def overlapping(self, shard: int, start: int, end: int) -> tuple[int, int] | None:
        """A damaged range of ``shard`` overlapping stream bytes ``start … end−1``, if any."""
        ranges = self._ranges.get(shard)
        if not ranges or start >= end:
            return None
        i = bisect.bisect_right(ranges, (end - 1, fmt.MAX_SHARD_STREAM + 1)) - 1
        if i >= 0 and ranges[i][1] > start:
            return ranges[i]
        return None


class ShardScan:
    """Checks every shard of one bundle, writing what it finds to ``findings``."""

    def __init__(
        self, parts: BundleParts, findings: Findings, only: frozenset[int] | None = None
    ) -> None:
        self.parts = parts
        self.findings = findings
        self.only = only  # the shards to check (``verify --shard``); None: all
        self.problem = findings.problem
        self.config = parts.index.config
        self.version = parts.index.marker.format_version
        self.bad = BadRanges()
        self.stream_sizes: dict[int, int] = {}  # shard -> its stream's size, if readable

    def run(self) -> None:
        report = self.findings.report
        report.shards = count = self.config.shard_count
        self.check_names(count)
        report.data_bytes = self.config.data_bytes
        for shard in range(count):
            if not self.selected(shard):
                continue
            try:
                info = self.parts.content.shard_info(shard)
            except FormatError as e:
                self.problem("shard", f"shard {shard}: descriptor unreadable: {e}", shard=shard)
                self.bad.mark(shard, 0, fmt.MAX_SHARD_STREAM)
                continue
            self.stream_sizes[shard] = info.uncompressed_size
            report.stored_bytes += info.file_size
            file_size = self._check_file(shard, info)
            self._check_records(shard, info, file_size)
        self.bad.merge()

    def selected(self, shard: int) -> bool:
        """Whether ``shard`` is among those checked."""
        return self.only is None or shard in self.only

    def _listed_names(self) -> list[str] | None:
        remote = self.parts.remote
        if remote is not None:
            return list_shard_names(self.parts.location, remote.filesystem)
        return sorted(n for n in os.listdir(self.parts.path) if n.startswith(fmt.SHARD_PREFIX))

    def check_names(self, shard_count: int) -> None:
        """Every ``shard-*`` file must be one the index lists, named as the bundle's version
        names shards: a hex name in a version-2 bundle (or the reverse) is a shard renamed by
        hand or copied from another bundle, and a stray shard is not part of this bundle."""
        expected = {fmt.shard_filename(i, self.version) for i in self._own_shards(shard_count)}
        path = self.parts.path
        try:
            names = self._listed_names()
        except OSError as e:
            self.problem("shard", f"cannot list {path}: {e.strerror or e}")
            return
        except Exception as e:  # an object store's listing: any failure is "cannot list"
            self.problem("shard", f"cannot list {path}: {e}")
            return
        if names is None:
            return  # a store without listings (a web server): a stray shard goes unseen
        other = 1 if self.version >= 2 else 2
        for name in names:
            if name in expected or self.only is not None:
                continue  # a partial check has no word on the shards it was not asked about
            index = _shard_index_of(name[len(fmt.SHARD_PREFIX) :], other)
            if index is not None and index < shard_count:
                message = (
                    f"{name} is named as format version {other} names shard {index}; this "
                    f"bundle is version {self.version} and reads it as "
                    f"{fmt.shard_filename(index, self.version)}"
                )
            else:
                message = f"{name} is not a shard of this bundle (the index lists {shard_count})"
            self.problem("shard", message)

    def _own_shards(self, shard_count: int) -> list[int]:
        """The shards whose files are in this bundle's directory (not in a base, version 6)."""
        if not self.parts.index.bases:
            return list(range(shard_count))
        own = []
        for shard in range(shard_count):
            with contextlib.suppress(FormatError):  # reported when the shard is checked
                if not self.parts.index.shard_info(shard).base:
                    own.append(shard)
        return own

    def _check_file(self, shard: int, info: fmt.ShardInfo) -> int | None:
        """The shard file's size (None: unreadable), its header checked; a shard in a base
        (version 6) is checked where it is, as every bundle that uses it checks it."""
        name = fmt.store_name(shard, self.version, info)
        try:
            size, header = self.parts.size_and_header(name)
        except OSError as e:
            where = self.parts.where(name)
            reason = e.strerror or str(e)
            self.problem("shard", f"shard {shard}: cannot read {where}: {reason}", shard=shard)
            return None
        # First: a shard of the wrong size (truncated, most often) explains what follows.
        if size != info.file_size:
            self.problem("shard", str(ShardDamage(shard, name, info.file_size, size)), shard=shard)
        try:
            fmt.check_shard_header(header, shard, self.parts.index.marker.bundle_id, info)
        except BundleError as e:
            self.problem("shard", f"shard {shard}: bad header: {e}", shard=shard)
        else:
            self.findings.report.bytes_checked += min(size, self.config.block_size)
        return size

    def _check_records(self, shard: int, info: fmt.ShardInfo, file_size: int | None) -> None:
        block = self.config.block_size
        expected = 0  # next stream offset a record must start at
        stored_end = block  # records follow the header block, in order
        count = 0
        records = self.parts.content.records(shard)
        while True:
            try:
                record = next(records)
            except StopIteration:
                break
            except FormatError as e:
                self.problem("record", f"shard {shard}: record index damaged: {e}", shard=shard)
                self.bad.mark(shard, expected, max(expected + 1, info.uncompressed_size))
                return
            count += 1
            self.findings.report.records += 1
            bad = self._check_record(shard, record, expected, stored_end, file_size)
            if bad is not None:
                self.problem("record", bad, shard=shard, record=record.offset)
                self.bad.mark(shard, record.offset, record.end)
            expected = max(expected, record.end)
            if record.stored_length:
                end = fmt.pad_to(record.stored_offset + record.stored_length, block)
                stored_end = max(stored_end, end)
            self.findings.tick("records", self.findings.report.records, 0)
        self._check_coverage(shard, info, expected, count)

    def _check_record(
        self, shard: int, record: fmt.Record, expected: int, stored_end: int, file_size: int | None
    ) -> str | None:
        """What is wrong with one record (its place, then its bytes), or None."""
        # Where it is in the file (what a user can compare with the shard's size); the stream
        # offset is what the index and the damaged files' messages use.
        where = (
            f"shard {shard} record stored at byte {record.stored_offset:,} "
            f"(stream offset {record.offset:,})"
        )
        if record.offset != expected:
            what = "gap before" if record.offset > expected else "overlap at"
            self.bad.mark(shard, min(expected, record.offset), max(expected, record.offset))
            return f"{what} {where} (expected offset {expected})"
        if record.stored_length and record.stored_offset < stored_end:
            return f"{where}: stored bytes overlap the previous record"
        if file_size is not None and record.stored_offset + record.stored_length > file_size:
            return f"{where}: stored bytes run past the end of the shard file"
        try:
            self.parts.shards.load(record)
        except CorruptDataError as e:
            return f"{where}: {e.detail}"
        if record.stored_length:
            end = record.stored_offset + record.stored_length
            padded = fmt.pad_to(end, self.config.block_size)
            self.findings.report.bytes_checked += min(padded, file_size or end) - (
                record.stored_offset
            )
        return None

    def _check_coverage(self, shard: int, info: fmt.ShardInfo, covered: int, count: int) -> None:
        """The records must cover the shard's whole stream, and be as many as the index says."""
        if covered != info.uncompressed_size:
            self.problem(
                "record",
                f"shard {shard}: records cover {covered} bytes of a "
                f"{info.uncompressed_size}-byte stream",
                shard=shard,
            )
            self.bad.mark(shard, min(covered, info.uncompressed_size), fmt.MAX_SHARD_STREAM)
        if count != info.record_count:
            self.problem(
                "record",
                f"shard {shard}: {count} records, the index says {info.record_count}",
                shard=shard,
            )


def _shard_index_of(digits: str, version: int) -> int | None:
    """The shard index a ``shard-`` suffix means under ``version``'s naming, if any."""
    if len(digits) != 8:
        return None
    allowed = "0123456789abcdef" if version == 1 else "0123456789"
    if any(c not in allowed for c in digits):
        return None
    return int(digits, 16 if version == 1 else 10)
