"""The packer's vocabulary: ``PackOptions``, ``PackProgress``, ``PackSummary``, ``PackSource``,
``UserData``, ``CompactOptions`` and ``CompactSummary`` (``compact``'s, and ``pack --compact``'s),
and the option checks every pack, merge and distributed pack makes before reading anything
(``check_options``, ``parse_compression``, ``creation_time``).

Every other module of ``bundlefs.packing`` imports these from here, never from ``packer``: the
packer orchestrates the modules below it and is imported by none of them.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``,
``bundlefs.packing.sources.base``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.errors import BundleError, PackError
from bundlefs.packing.sources.base import EntrySource, Stat
from bundlefs.storage.codec import zstd_module
from bundlefs.storage.liveness import DEFAULT_MIN_LIVE, Liveness
from bundlefs.storage.objectstore.upload_progress import UploadProgress

DEFAULT_SHARD_SIZE = 4 * 1024**3
GEOMETRIC_FACTOR = 2.0  # compact's geometric rule: git repack --geometric's default
CHECKS = ("stat", "strict", "content")  # how a pack on a base knows a file unchanged
ZSTD_LEVELS = (-7, 22)  # the levels zstd:LEVEL accepts (zstd's fast levels to its slowest)

# Called with (relative path bytes, lstat result); returns bytes to attach to the entry or None.
UserData = Callable[[bytes, Stat], bytes | None]

# What ``pack`` packs: a directory; an archive file (tar, compressed or not, or zip) or "-" (a
# tar on stdin); several archives (tar shards) into one tree; an object-store prefix
# (``s3://bucket/prefix/``); or any ``EntrySource``.
PackSource = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | EntrySource


@dataclass(frozen=True)
class PackOptions:
    record_size: int = fmt.DEFAULT_RECORD_SIZE
    block_size: int = fmt.DEFAULT_BLOCK_SIZE
    compression: str = "lz4"
    shard_size: int = DEFAULT_SHARD_SIZE
    excludes: tuple[str, ...] = ()
    force: bool = False
    skip_errors: bool = False
    # Threads that stat and read small files ahead of the writer and compress records: source
    # reads overlap (a cold disk or NFS serves many requests at once) and lz4 uses every core,
    # while the output stays in one deterministic order.
    jobs: int = 4
    # Called with (relative path bytes, lstat result — an os.stat_result from a directory source);
    # returns bytes to attach to the entry or None.
    user_data: UserData | None = None
    # Content types: detected from names and first bytes unless off; (glob, media type) rules
    # override detection, the last matching one winning ("" for no type).
    detect_content_types: bool = True
    content_types: tuple[tuple[str, str], ...] = ()
    # The bundle's own metadata: text keys and values (docs/format.md §3.7).
    meta: tuple[tuple[str, str], ...] = ()
    # When the bundle was made, in ns since the epoch: None takes SOURCE_DATE_EPOCH when set
    # (reproducible builds), else the clock. Two packs are byte-identical only when it is fixed.
    created_ns: int | None = None
    # A directory source: record each file's ctime and inode number (the ``sources`` database,
    # format version 6) for a later ``pack --base --check strict``. They are the source
    # machine's, not the tree's: packs of two copies of a tree are byte-identical only without.
    record_sources: bool = True
    # A DEST that is a URL (s3://bucket/x.bundle) or a SRC that is a prefix (s3://bucket/raw/):
    # the store's options (credentials, endpoint; docs/storage.md); and the local directory the
    # bundle for a URL DEST is built in before it is uploaded (None: the temporary directory).
    storage_options: dict[str, Any] | None = None
    staging: str | None = None
    # Pack only these paths of the directory SRC (relative to it), storing content in this order
    # (``pack --files-from``; sources/listed.py); None: the whole tree.
    files_from: Sequence[str | bytes] | None = None
    # A pack on a base bundle (``pack(..., base=OLD)``, packing/delta.py): how a file is known
    # unchanged since OLD ("stat": type, size and mtime; "strict": those and the ctime and inode
    # number OLD's ``sources`` recorded, else its bytes; "content": its bytes), and how many
    # seconds before OLD's creation a file's mtime (and ctime) must lie for its stat to be trusted.
    check: str = "stat"
    racy_seconds: float = 2.0
    # Whole-file dedup (``pack --dedup``, packing/content.py): a file whose content a file stored
    # before in the same pack holds gets that file's place instead of a copy.
    dedup: bool = False
    # A pack to an object store on a base there (packing/remote_base.py): copy the base's shards
    # the new bundle uses into its own prefix, server-side, instead of referencing them (the new
    # bundle then stands alone). A local base's are linked either way.
    materialize: bool = False
    # A pack on a base that also compacts (``pack(..., base=OLD, compact=True)``): NEW is what
    # ``compact`` makes of the pack's result, shards less live than ``min_live`` rewritten
    # (packing/compact.py; new shards cut at ``shard_size``), in one publish.
    compact: bool = False
    min_live: float = DEFAULT_MIN_LIVE


def parse_compression(spec: str) -> tuple[str, int | None]:
    """``lz4``, ``none``, ``zstd`` or ``zstd:LEVEL`` -> (name, level or None)."""
    name, _, level = spec.partition(":")
    if name not in fmt.COMPRESSION_NAMES:
        raise PackError(f"unknown compression {spec!r} (choose lz4, zstd[:LEVEL] or none)")
    if not level:
        return name, None
    if name != "zstd":
        raise PackError(f"compression {spec!r}: {name} takes no level (only zstd does)")
    if not level.lstrip("-").isdigit():
        raise PackError(f"compression {spec!r}: the level must be a whole number, from -7 to 22")
    if not ZSTD_LEVELS[0] <= int(level) <= ZSTD_LEVELS[1]:
        raise PackError(
            f"compression {spec!r}: zstd level {int(level)} is out of range "
            f"(from {ZSTD_LEVELS[0]} to {ZSTD_LEVELS[1]})"
        )
    return name, int(level)


def creation_time(created_ns: int | None) -> int:
    """The time to record: the caller's, else ``SOURCE_DATE_EPOCH``'s, else the clock's."""
    if created_ns is None:
        epoch = os.environ.get("SOURCE_DATE_EPOCH")
        if epoch is None or epoch == "":
            return time.time_ns()
        # reproducible-builds.org: a malformed value must stop the build, not be ignored.
        if not epoch.isdigit():
            raise PackError(f"SOURCE_DATE_EPOCH={epoch!r} is not a whole number of seconds")
        created_ns = int(epoch) * 10**9
    if not -(2**63) <= created_ns < 2**63:
        raise PackError("the creation time is outside what a bundle stores (years 1678 to 2262)")
    return created_ns


@dataclass
class PackProgress:
    """Counters updated while packing; ``total_*`` are unknown (0) unless the caller set them."""

    files: int = 0
    dirs: int = 0
    bytes_read: int = 0
    bytes_stored: int = 0
    started: float = field(default_factory=time.monotonic)
    # Set once a pack to a URL is built and uploading (the counters above are then final).
    upload: UploadProgress | None = None


@dataclass
class BaseReuse:
    """What a pack on a base bundle took from it and what it stored anew."""

    base: str
    reused_files: int = 0  # unchanged by stat: their entries point at the base's bytes
    reused_bytes: int = 0
    same_files: int = 0  # read and found equal to the base's (a touch): nothing stored
    same_bytes: int = 0
    digest_compared: int = 0  # files compared by OLD's digest (version 5), OLD's bytes unread
    # check="strict": files OLD has no source record of (an older version, another writer),
    # so compared by content rather than trusted.
    unrecorded_files: int = 0
    stored_files: int = 0  # new or changed: stored in the new bundle's own shards
    stored_bytes: int = 0
    # the base's shards the new bundle holds (ways: link, reflink, copy; on an object store
    # "reference", or "server-side copy" with materialize)
    shards_linked: int = 0
    shards_left: int = 0  # the base's shards no file needs any more: not linked
    ways: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class CompactOptions:
    """How ``compact`` rewrites a bundle (``pack --base --compact`` takes ``min_live`` and
    ``shard_size`` from its ``PackOptions``)."""

    min_live: float = DEFAULT_MIN_LIVE  # a shard less live than this is rewritten
    shard_size: int = DEFAULT_SHARD_SIZE  # where new shards are cut; a quarter of it is "small"
    factor: float = GEOMETRIC_FACTOR  # the geometric rule's progression
    force: bool = False
    storage_options: dict[str, Any] | None = None  # a DEST that is a URL
    staging: str | None = None  # where a URL's bundle is built (None: the temporary directory)


@dataclass
class CompactSummary:
    """What ``compact`` did (and ``pack --base --compact``, of the pack's own result)."""

    dest: str
    config: fmt.Config
    before: Liveness  # B's stored, live and dead bytes
    kept: int  # shards reused as they are
    rewritten: int  # shards whose live records were copied (``dropped`` included)
    written: int  # new shards
    records_copied: int
    ways: list[str]  # how each kept shard came: "link", "reflink" or "copy"
    stored_bytes: int  # NEW's shard files, added up
    index_bytes: int
    own_bytes: int = 0  # of them, the shards NEW wrote (or adopted: ``pack --base --compact``)
    dropped: int = 0  # of those rewritten, the shards without a live record
    dead_bytes: int = 0  # NEW's dead bytes: those of the shards kept
    seconds: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "dest": self.dest,
            "files": self.config.file_count,
            "shards_before": self.before.shards,
            "shards": self.config.shard_count,
            "kept": self.kept,
            "rewritten": self.rewritten,
            "dropped": self.dropped,
            "written": self.written,
            "linked": self.ways.count("link"),
            "reflinked": self.ways.count("reflink"),
            "copied": self.ways.count("copy"),
            "records_copied": self.records_copied,
            "stored_bytes_before": self.before.stored_bytes,
            "dead_bytes_before": self.before.dead_bytes,
            "stored_bytes": self.stored_bytes,
            "own_bytes": self.own_bytes,
            "dead_bytes": self.dead_bytes,
            "index_bytes": self.index_bytes,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class PackSummary:
    dest: str
    config: fmt.Config
    stored_bytes: int
    index_bytes: int
    seconds: float
    skipped: list[str] = field(default_factory=list)  # unholdable names; skip_errors errors
    changed: list[str] = field(default_factory=list)  # files that changed while being read
    # Seconds of each phase of a distributed pack (listing, packing, merge); empty otherwise.
    phases: dict[str, float] = field(default_factory=dict)
    # A pack to a URL: ``seconds`` is the whole pack, these its two parts (None for a directory).
    build_seconds: float | None = None
    upload_seconds: float | None = None
    uploaded_bytes: int = 0
    reuse: BaseReuse | None = None  # a pack on a base bundle: what it reused
    # With dedup: the files that got an earlier file's content, and their bytes (not stored).
    dedup_files: int = 0
    dedup_bytes: int = 0
    compaction: CompactSummary | None = None  # ``compact=True``: what the compaction did

    def to_dict(self) -> dict[str, object]:
        """The summary as JSON-ready facts (the counts of ``bundlefs pack``'s summary line)."""
        c = self.config
        facts: dict[str, object] = {
            "dest": self.dest,
            "files": c.file_count,
            "dirs": c.dir_count,
            "symlinks": c.symlink_count,
            "hardlinks": c.hardlink_count,
            "specials": c.special_count,
            "bytes": c.data_bytes,
            "stored_bytes": self.stored_bytes,
            "index_bytes": self.index_bytes,
            "ratio": round(c.data_bytes / self.stored_bytes, 4) if self.stored_bytes else 0.0,
            "seconds": round(self.seconds, 3),
            "skipped": self.skipped,
            "changed": self.changed,
        }
        if self.phases:
            facts["phases"] = {name: round(s, 3) for name, s in self.phases.items()}
        if self.dedup_files:
            facts["dedup"] = {"files": self.dedup_files, "bytes": self.dedup_bytes}
        if self.reuse is not None:
            facts["reuse"] = self.reuse.to_dict()
        if self.compaction is not None:
            done = self.compaction.to_dict()
            facts["compaction"] = {k: v for k, v in done.items() if k not in ("dest", "files")}
        if self.upload_seconds is not None and self.build_seconds is not None:
            facts["build_seconds"] = round(self.build_seconds, 3)
            facts["upload_seconds"] = round(self.upload_seconds, 3)
            facts["uploaded_bytes"] = self.uploaded_bytes
        return facts


def check_options(options: PackOptions) -> PackOptions:
    """``options`` checked as ``pack`` checks them before reading anything, with the creation
    time fixed (``creation_time``); ``PackError`` naming the first bad one."""
    compression, _level = parse_compression(options.compression)
    if options.check not in CHECKS:
        raise PackError(f"unknown check {options.check!r} (choose stat, strict or content)")
    if not 0 <= options.racy_seconds < 2**32:
        raise PackError(f"racy_seconds {options.racy_seconds}: a number of seconds from 0")
    if not 0 <= options.min_live <= 1:
        raise PackError(f"min_live {options.min_live} is not a fraction from 0 to 1")
    # Fixed now, before anything is read: a bad SOURCE_DATE_EPOCH fails at once, not at the end.
    options = dataclasses.replace(options, created_ns=creation_time(options.created_ns))
    if compression == "zstd":
        try:
            zstd_module()
        except BundleError as e:
            raise PackError(str(e)) from None
    try:
        fmt.validate_layout(options.block_size, options.record_size)
        for key, value in options.meta:
            fmt.meta_key(key)
            fmt.encode_meta_value(value)
        if len(options.meta) > fmt.MAX_META_KEYS:
            raise PackError(f"more than {fmt.MAX_META_KEYS} metadata items")
        for _pattern, media_type in options.content_types:
            if media_type:
                fmt.encode_content_type(media_type)
    except fmt.FormatError as e:
        raise PackError(str(e)) from None
    return options


def resolve_options(
    options: PackOptions,
    on_base: bool,
    *,
    dedup: bool | None,
    compact: bool | None,
    check: str | None,
) -> PackOptions:
    """``options`` with ``pack``'s keyword choices (None: the options'), checked
    (``check_options``); compacting only on a base."""
    options = check_options(
        dataclasses.replace(
            options,
            dedup=options.dedup if dedup is None else dedup,
            compact=options.compact if compact is None else compact,
            check=options.check if check is None else check,
        )
    )
    if options.compact and not on_base:
        raise PackError("compacting (--compact) is for a pack on a base: give a base (--base OLD)")
    if options.materialize and not on_base:
        raise PackError("--materialize copies a base's shards: it goes with --base")
    return options
