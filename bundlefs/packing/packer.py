"""Packing a source tree into a bundle, atomically and deterministically: ``pack`` and its options.

This module only orchestrates. ``sources.DirectorySource`` walks the tree breadth first with names
sorted bytewise and reads small files ahead; ``builder.EntryBuilder`` turns what it delivers into
index entries; ``content.ContentWriter`` writes file content into the shards; and
``bundlefs.storage.publish`` stages the bundle in a locked temporary sibling of DEST, seals it and
moves it into place only once complete. Every failure is a ``PackError`` naming what went wrong,
and leaves nothing behind.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.packing``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from bundlefs.core import format as fmt
from bundlefs.core.content_types import ContentTypeRules
from bundlefs.errors import BundleError, IndexWriteError, PackError
from bundlefs.packing.archive import STDIN, ArchiveSource
from bundlefs.packing.builder import EntryBuilder, UserData
from bundlefs.packing.content import ContentWriter
from bundlefs.packing.objects import ObjectSource
from bundlefs.packing.sources import DirectorySource, EntrySource, SourceErrors
from bundlefs.storage import publish
from bundlefs.storage.index import IndexWriter
from bundlefs.storage.location import Location, parse_location
from bundlefs.storage.objects import is_remote_prefix
from bundlefs.storage.publish_remote import RemotePublisher, UploadProgress, staging_path
from bundlefs.storage.shards import zstd_module

DEFAULT_SHARD_SIZE = 4 * 1024**3
ZSTD_LEVELS = (-7, 22)  # the levels zstd:LEVEL accepts (zstd's fast levels to its slowest)


@runtime_checkable
class StreamingSource(Protocol):
    """An ``EntrySource`` that stores file content itself, in its own order, before the builder
    walks it (an archive read once from start to end): ``load`` runs first, with the pack's
    content writer, and sets ``SourceItem.stored`` on the file items it will deliver."""

    def load(self, content: ContentWriter) -> None: ...


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
    # A DEST that is a URL (s3://bucket/x.bundle) or a SRC that is a prefix (s3://bucket/raw/):
    # the store's options (credentials, endpoint; docs/storage.md); and the local directory the
    # bundle for a URL DEST is built in before it is uploaded (None: the temporary directory).
    storage_options: dict[str, Any] | None = None
    staging: str | None = None


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
class PackSummary:
    dest: str
    config: fmt.Config
    stored_bytes: int
    index_bytes: int
    seconds: float
    skipped: list[str] = field(
        default_factory=list
    )  # what a bundle cannot hold; skip_errors errors
    changed: list[str] = field(default_factory=list)  # files that changed while being read
    # Seconds of each phase of a distributed pack (listing, packing, merge); empty otherwise.
    phases: dict[str, float] = field(default_factory=dict)
    # A pack to a URL: ``seconds`` is the whole pack, these its two parts (None for a directory).
    build_seconds: float | None = None
    upload_seconds: float | None = None
    uploaded_bytes: int = 0

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
        if self.upload_seconds is not None and self.build_seconds is not None:
            facts["build_seconds"] = round(self.build_seconds, 3)
            facts["upload_seconds"] = round(self.upload_seconds, 3)
            facts["uploaded_bytes"] = self.uploaded_bytes
        return facts


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _source_paths(source: PackSource) -> list[str] | None:
    """The paths ``source`` names (one directory, or archives); None for an ``EntrySource``."""
    if isinstance(source, str | os.PathLike):
        return [os.fspath(source)]
    if isinstance(source, Sequence):
        paths = [os.fspath(p) for p in source]
        if not paths:
            raise PackError("nothing to pack: no source given")
        return paths
    return None


def _describe(source: PackSource) -> str:
    paths = _source_paths(source)
    if paths is None:
        return "the source"
    return " ".join("stdin" if p == STDIN else p for p in paths)


def object_prefix(paths: list[str] | None, options: PackOptions) -> Location | None:
    """The store location when the source is an object-store prefix (one URL), else None; its
    storage options are the pack's (the same as a URL DEST's)."""
    if paths is None or not any(is_remote_prefix(p) for p in paths):
        return None
    if len(paths) > 1:
        raise PackError("an object-store prefix must be the only source")
    try:
        return parse_location(paths[0], options.storage_options)
    except BundleError as e:  # a URL without a bucket, a malformed BUNDLEFS_STORAGE_OPTIONS
        raise PackError(str(e)) from None


def _check_sources(paths: list[str]) -> None:
    """One directory, an object-store prefix, or archives (regular files, or "-" once): one
    sentence if not."""
    if len(paths) == 1 and paths[0] != STDIN and os.path.isdir(paths[0]):
        return
    if len(paths) == 1 and is_remote_prefix(paths[0]):
        return  # listed when the pack starts: an unreachable store fails then
    for path in paths:
        if path == STDIN:
            continue
        if os.path.isdir(path):
            raise PackError(f"{path} is a directory: several sources must all be archives")
        if not os.path.lexists(path):
            raise PackError(f"source {path} does not exist")
        if not os.path.isfile(path):
            raise PackError(f"source {path} is neither a directory nor an archive file")


def check_places(source: str, dest: str, force: bool) -> None:
    """Refuse a DEST that overlaps the source (either way, through any symlink) or is not ours."""
    parent, name = os.path.split(os.path.abspath(dest))
    if not os.path.isdir(parent):
        raise PackError(f"the directory to hold {dest} does not exist")
    # DEST itself may be a symlink (refused below); where it will be written is parent/name.
    dest_real = os.path.join(os.path.realpath(parent), name)
    source_real = os.path.realpath(source)
    if _inside(dest_real, source_real):
        raise PackError("the bundle cannot be written inside the tree being packed")
    if _inside(source_real, dest_real):
        raise PackError(f"the tree being packed is inside {dest}, which a pack would replace")
    if os.path.lexists(dest):
        if not os.path.isdir(dest) and not os.path.islink(dest):
            # A bundle is a directory the pack creates: --force would not help either.
            raise PackError(
                f"{dest} is a file, not a bundle: a bundle is a new directory "
                "(give a path that does not exist)"
            )
        if not force:
            raise PackError(f"{dest} already exists (use --force to replace it)")
        if not publish.is_bundle(dest):
            raise publish.not_a_bundle(dest)


def check_options(options: PackOptions) -> PackOptions:
    """``options`` checked as ``pack`` checks them before reading anything, with the creation
    time fixed (``creation_time``); ``PackError`` naming the first bad one."""
    compression, _level = parse_compression(options.compression)
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


def check_destination(
    paths: list[str] | None, dest: str, options: PackOptions
) -> tuple[Location, RemotePublisher | None]:
    """Where ``dest`` is, checked against the source ``paths`` (None: an ``EntrySource``) as
    ``pack`` checks it before reading anything: the sources exist, a local DEST does not overlap
    them and is new (or, with ``force``, a bundle), a URL is reachable and holds no bundle (or
    ``force``). Returns the location and, for a URL, its publisher; ``PackError`` if not."""
    try:
        location = parse_location(dest, options.storage_options)
    except PackError:
        raise
    except BundleError as e:  # a URL without a bucket, a malformed BUNDLEFS_STORAGE_OPTIONS
        raise PackError(str(e)) from None
    remote = None if location.is_local else RemotePublisher(location)
    prefix = object_prefix(paths, options)
    if paths is not None:
        _check_sources(paths)
    if prefix is not None and not location.is_local:
        source_root = f"{prefix.protocol}://{prefix.path.strip('/')}/"
        if f"{location.protocol}://{location.path.strip('/')}/".startswith(source_root):
            raise PackError("the bundle cannot be written inside the prefix being packed")
    if remote is not None:
        remote.check(options.force)  # a bad URL or credentials fail now, not after packing
    else:
        local = [os.devnull] if paths is None or prefix is not None else paths
        for path in local:
            if path != STDIN:
                check_places(path, location.path, options.force)
    return location, remote


def pack(
    source: PackSource,
    dest: str,
    options: PackOptions = PackOptions(),  # noqa: B008 - frozen, safe as a default
    progress: Callable[[PackProgress], None] | None = None,
) -> PackSummary:
    """Pack the tree at ``source`` into a new bundle at ``dest``: a directory, or a URL
    (``s3://bucket/x.bundle``: built locally, then uploaded, ``bundlefs.storage.publish_remote``).

    ``source`` is a directory, an archive (tar, plain or gzip/bzip2/xz/zstd compressed, or zip;
    "-" is a tar on stdin), a list of archives (tar shards: read in order into one tree), an
    object-store prefix (``s3://bucket/prefix/``, reached with ``options.storage_options``), or
    an ``EntrySource`` (a ``StreamingSource`` is loaded first). docs/archives.md says how archive
    members map to entries, docs/storage.md how objects do.

    Raises ``PackError`` for every failure: a bad option, an unreadable source (unless
    ``skip_errors``), a DEST that overlaps the source or (with ``force``) is not a bundle, a full
    disk, a store that refuses the upload. Nothing is left behind then, and an existing DEST is
    untouched (but a URL replaced with ``force`` no longer opens: its old marker goes first).
    """
    started = time.monotonic()
    options = check_options(options)
    paths = _source_paths(source)
    location, remote = check_destination(paths, dest, options)
    uploading = None
    if progress is not None:
        report = progress

        def uploading(upload: UploadProgress) -> None:
            report(PackProgress(started=upload.started, upload=upload))

    summary, where = publish_built(
        location,
        remote,
        lambda work, work_id: _Packer(source, work, work_id, options, progress).run(),
        force=options.force,
        staging=options.staging,
        what=f"cannot pack {_describe(source)}",
        upload_progress=uploading,
    )
    summary.dest = where
    if remote is not None and remote.uploaded is not None:
        # The packer timed the build; the upload after it is the larger part on a slow link.
        summary.build_seconds = summary.seconds
        summary.upload_seconds = remote.uploaded.seconds
        summary.uploaded_bytes = remote.uploaded.total_bytes
        summary.seconds = time.monotonic() - started
    return summary


Built = TypeVar("Built")


def publish_built(
    location: Location,
    remote: RemotePublisher | None,
    build: Callable[[str, tuple[int, int]], Built],
    *,
    force: bool,
    staging: str | None,
    what: str,
    upload_progress: Callable[[UploadProgress], None] | None = None,
) -> tuple[Built, str]:
    """Build a bundle with ``build(work, work_id)`` in a locked temporary directory, then move it
    to ``location`` (a directory) or upload it with ``remote`` (a URL): atomically either way,
    and nothing left behind on failure. What ``pack`` and ``merge`` share, once the destination
    is checked. ``what`` begins the sentence of a format error. Returns what ``build`` returned
    and the bundle's local path or URL."""
    if remote is not None:
        dest = location.url
        staged = staging_path(location, staging)
    else:
        staged = dest = location.path  # file://PATH is PATH
    try:
        with publish.stage(staged) as (work, work_id):
            built = build(work, work_id)
            if remote is None:
                publish.publish(work, dest, force)
            else:
                try:  # built and sealed locally, then uploaded with its marker last
                    remote.publish(work, force, progress=upload_progress)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
    except IndexWriteError as e:
        raise PackError(f"cannot write the index of {dest}: {e.reason}") from e
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise PackError(f"cannot write the bundle {dest}: {e.strerror or e}{where}") from e
    except fmt.FormatError as e:
        raise PackError(f"{what}: {e}") from e
    return built, dest


class _Packer:
    """One pack into ``work``: the source, the builder and the content writer, wired together."""

    def __init__(
        self, source: PackSource, work, work_id: tuple[int, int], options: PackOptions, progress
    ):
        self.source = source
        self.work = work
        # (st_dev, st_ino) of ``work``: skipped if the walk meets it (a bind mount, say), so the
        # packer never reads its own growing output.
        self.work_id = work_id
        self.options = options
        self.report = progress
        self.progress = PackProgress()
        self._last_report = 0.0
        compression, self.level = parse_compression(options.compression)
        self.config = fmt.Config(
            block_size=options.block_size,
            record_size=options.record_size,
            compression=fmt.COMPRESSION_NAMES[compression],
            created_ns=creation_time(options.created_ns),
        )

    def run(self) -> PackSummary:
        started = time.monotonic()
        options = self.options
        pool = ThreadPoolExecutor(options.jobs) if options.jobs > 1 else None
        errors = self._errors()
        index: IndexWriter | None = None
        content: ContentWriter | None = None
        try:
            index = IndexWriter(os.path.join(self.work, fmt.INDEX_DIR))
            tick = self._tick if self.report is not None else None
            content = ContentWriter(
                self.work,
                self.config,
                index,
                errors,
                self.progress,
                shard_size=options.shard_size,
                level=self.level,
                pool=pool,
                tick=tick,
            )
            source = self._entry_source(errors, pool)
            if isinstance(source, StreamingSource):
                source.load(content)  # an archive: read once, its content stored in its order
            rules = (
                ContentTypeRules(options.content_types, detect=options.detect_content_types)
                if options.detect_content_types or options.content_types
                else None
            )
            builder = EntryBuilder(
                source,
                content,
                index,
                errors,
                self.progress,
                user_data=options.user_data,
                content_types=rules,
            )
            builder.build()
            index.put_meta(dict(options.meta))
            shards = content.finish()
            self.config = builder.config(self.config, len(shards))
            index.put_config(self.config)
            closing, index = index, None  # a close that fails is not followed by an abort
            closing.close()
        except BaseException:
            # Release what is open without masking the error.
            if content is not None:
                content.abort()
            if index is not None:
                with contextlib.suppress(IndexWriteError):
                    index.abort()
            raise
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
        marker = publish.seal(self.work, len(shards))
        return PackSummary(
            "",
            self.config,
            sum(s.file_size for s in shards),
            marker.index_size,
            time.monotonic() - started,
            errors.skipped,
            content.changed,
        )

    def _errors(self) -> SourceErrors:
        # A source made by the caller reports to its own SourceErrors: the pack shares it, so
        # what the source skipped is in the summary too.
        own = getattr(self.source, "errors", None)
        return own if isinstance(own, SourceErrors) else SourceErrors(self.options.skip_errors)

    def _entry_source(self, errors: SourceErrors, pool) -> EntrySource:
        """A directory walk, an archive reader, an object listing, or the caller's own
        ``EntrySource``."""
        paths = _source_paths(self.source)
        if paths is None:
            return self.source  # type: ignore[return-value]  # an EntrySource by elimination
        prefix = object_prefix(paths, self.options)
        if prefix is not None:
            return ObjectSource(
                prefix,
                errors,
                created_ns=self.config.created_ns,
                excludes=self.options.excludes,
                pool=pool,
            )
        if len(paths) == 1 and paths[0] != STDIN and os.path.isdir(paths[0]):
            return DirectorySource(
                paths[0], errors, excludes=self.options.excludes, pool=pool, skip=self.work_id
            )
        return ArchiveSource(paths, errors, excludes=self.options.excludes)

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._last_report >= 0.2:
            self._last_report = now
            self.report(self.progress)
