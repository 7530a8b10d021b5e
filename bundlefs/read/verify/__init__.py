"""``verify``: the full consistency and checksum scan of a bundle.

It owns the answer to "is this bundle intact, and if not, which files are damaged?". It reads
everything — the marker, the index checksum, every shard header, every record (CRC and
decompression), every entry and the directory tree they form, and every file's content CRC — and
keeps going after damage, so one run names every damaged file. Damage never raises: it becomes a
``Problem`` in the report. Only a directory that cannot be opened as a bundle at all raises.

The phases, in order, each in its own module: the index file (here), the shards and their
records (``shards``), the entries and the tree (``tree``), the files (``files``); ``report``
holds what they find. The tree invariants and count fields are core/integrity.py's rules, the
same ones the reader enforces; here every rule is applied to every entry and each broken one is
collected.

Order (bottom first): report, tree | shards, files

``verify(…, shards=…)`` checks only some shards (their headers, records and files), after an
incremental transfer; the index and the tree are still checked whole.

The bundle is opened as every reader opens it (read/assemble.py). A bundle at a URL is verified
where it lives: the index fetched (checked against the marker, as every open does), the shard
objects listed and their headers and records fetched, never served from the on-disk record cache
(which would verify the cache, not the store).
May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.read``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.core.format.pages import FIRST_PAGE_CHECK_VERSION
from bundlefs.errors import BundleError, FormatError
from bundlefs.read.assemble import BundleParts, index_directory, store_timeout
from bundlefs.read.options import ReadOptions, RemoteOptions
from bundlefs.read.verify.files import check_files
from bundlefs.read.verify.report import (
    Findings,
    Problem,
    UnknownShard,
    VerifyProgress,
    VerifyReport,
)
from bundlefs.read.verify.shards import ShardScan
from bundlefs.read.verify.tree import TreeCheck
from bundlefs.storage.index_check import check_every_page
from bundlefs.storage.location import Location, parse_location
from bundlefs.storage.marker import read_marker

__all__ = ["Problem", "UnknownShard", "VerifyProgress", "VerifyReport", "verify"]

# The record cache of the file phase: files read in stored order touch each record once or twice.
# 32 MiB (128 records of 256 KiB): most of what verify holds beside a bit per inode (issue 27:
# ≤ 128 MB at 100,000,000 files).
_CACHE_SIZE = 32 * 1024 * 1024


def verify(
    bundle_path: str | os.PathLike,
    progress: Callable[[VerifyProgress], None] | None = None,
    *,
    remote: RemoteOptions | None = None,
    shards: Iterable[int] | None = None,
    **keywords: Any,
) -> VerifyReport:
    """Scan a whole bundle. Raises only if ``bundle_path`` is not a bundle at all.

    ``shards`` (shard numbers) checks only those shards' headers and records and the files whose
    bytes they hold, as after transferring a few (the index and the tree are always checked: they
    say where everything is); a number the bundle has no shard for raises ``UnknownShard`` (a
    ``ValueError``).

    ``bundle_path`` may be a URL; ``remote`` (or its fields as keywords: ``storage_options``,
    ``disk_cache``, ``store_timeout``) are then ``Bundle``'s. The index is cached in the disk
    cache; records are not: ``disk_cache_size`` is accepted for the CLI's sake and ignored, as
    verify reads every record from the store itself.
    """
    remote = dataclasses.replace(remote or RemoteOptions(), **{**keywords, "disk_cache_size": 0})
    options = ReadOptions(cache_size=_CACHE_SIZE, check_index=False, remote=remote)
    location = parse_location(os.fsdecode(os.fspath(bundle_path)), remote.storage_options)
    store_timeout(options)  # an unusable timeout is refused before anything is read
    only = None if shards is None else frozenset(shards)
    return _Verifier(location, options, Findings(_shown(location), progress), only).run()


def _shown(location: Location) -> str:
    return location.path if location.is_local else location.url


class _Verifier:
    """The phases over one bundle: the index file, then (if LMDB may open it) the rest."""

    def __init__(
        self,
        location: Location,
        options: ReadOptions,
        findings: Findings,
        only: frozenset[int] | None,
    ) -> None:
        self.location = location
        self.options = options
        self.findings = findings
        self.only = only  # the shards to check; None: all

    def run(self) -> VerifyReport:
        # A missing or invalid marker means "not a bundle": that raises, as opening would. A
        # bundle at a URL: its index fetched and checked against the remote marker (a mismatch
        # raises: the index the marker vouches for is not there); the checks run on that copy.
        checked = dataclasses.replace(self.options, check_index=True)
        index_dir = index_directory(self.location, checked, whole=True)
        marker = read_marker(index_dir)
        if self._check_index_file(index_dir, marker):
            # Checked whole above; from version 6 the reader checks pages as it reads, which
            # costs nothing more and keeps a damaged page's bytes out of the scan.
            paged = marker.format_version >= FIRST_PAGE_CHECK_VERSION
            options = dataclasses.replace(self.options, check_index=paged)
            try:
                parts = BundleParts.open(self.location, options, index_dir=index_dir)
            except (FormatError, OSError) as e:
                self.findings.problem("index", f"the index cannot be read: {e}")
            else:
                try:
                    self._scan(parts)
                finally:
                    parts.close()
        return self.findings.finished()

    def _check_index_file(self, index_dir: str, marker: fmt.Marker) -> bool:
        """Size, LMDB meta pages and checksum of data.mdb; False if LMDB must not open it."""
        self.findings.tick("index", 0, 1)
        try:
            damaged = check_every_page(index_dir, marker)
        except BundleError as e:
            self.findings.problem("index", f"the index is damaged: {e}")
            return False
        for pgno in damaged:  # version 6: local damage, the entries behind it are found below
            self.findings.problem("index", f"index page {pgno} fails its checksum")
        self.findings.report.index_bytes = marker.index_size
        return True

    def _scan(self, parts: BundleParts) -> None:
        count = parts.index.config.shard_count
        if self.only is not None:
            missing = sorted(s for s in self.only if not 0 <= s < count)
            if missing:
                have = f"shards 0-{count - 1}" if count else "no shards"
                raise UnknownShard(f"this bundle has {have}: no shard {missing[0]}")
            self.findings.report.shards_checked = sorted(self.only)
        shards = ShardScan(parts, self.findings, self.only)
        shards.run()
        # Both scans read every entry: the index's mapped pages are taken out of the resident
        # set as they go (a 100,000,000-file index is ~5.7 GB), so what verify holds is its own.
        unmap = parts.index.unmap_pages
        table = TreeCheck(parts.tree, parts.index.config, self.findings, unmap).run()
        check_files(parts.tree, parts.content, table, shards, self.findings, unmap)
