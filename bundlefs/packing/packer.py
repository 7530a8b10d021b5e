"""Packing a source tree into a bundle, atomically and deterministically: ``pack``.

This module only orchestrates. A source (``sources.directory.DirectorySource`` walking a tree
breadth first with names sorted bytewise, ``sources.archive``, ``sources.objects``,
``sources.listed`` for ``files_from``, or the caller's own ``EntrySource``) delivers entries;
``builder.EntryBuilder`` turns them into index entries;
``content.ContentWriter`` writes file content into the shards; and ``destination.publish_built``
stages the bundle in a locked temporary sibling of DEST, seals it and moves it into place (or
uploads it) only once complete. Every failure is a ``PackError`` naming what went wrong, and
leaves nothing behind. The options and the summary are ``options``'s.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.packing``
below it (``options``, ``sources``, ``content``, ``builder``, ``destination``, ``delta``,
``compact``, ``delta_sink``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor

from bundlefs.core import format as fmt
from bundlefs.core.content_types import ContentTypeRules
from bundlefs.errors import IndexWriteError, PackError
from bundlefs.packing.builder import EntryBuilder
from bundlefs.packing.compact import CompactOptions, compact_into
from bundlefs.packing.content import ContentWriter
from bundlefs.packing.delta_base import Base
from bundlefs.packing.delta_sink import on_base
from bundlefs.packing.destination import (
    check_destination,
    object_prefix,
    publish_built,
    source_paths,
)
from bundlefs.packing.options import (
    PackOptions,
    PackProgress,
    PackSource,
    PackSummary,
    creation_time,
    parse_compression,
    resolve_options,
)
from bundlefs.packing.sources.archive import ArchiveSource
from bundlefs.packing.sources.base import (
    ContentSink,
    EntrySource,
    SourceErrors,
    StreamingSource,
)
from bundlefs.packing.sources.directory import DirectorySource
from bundlefs.packing.sources.listed import ListedSource
from bundlefs.packing.sources.objects import ObjectSource
from bundlefs.packing.sources.streams import STDIN
from bundlefs.storage import publish
from bundlefs.storage.index_writer import IndexWriter
from bundlefs.storage.location import Location
from bundlefs.storage.objectstore.upload import RemotePublisher
from bundlefs.storage.objectstore.upload_progress import UploadProgress

_PACKED = "packed"  # pack --base --compact: the pack's own result, in NEW's partial directory


def _describe(source: PackSource) -> str:
    paths = source_paths(source)
    if paths is None:
        return "the source"
    return " ".join("stdin" if p == STDIN else p for p in paths)


def pack(
    source: PackSource,
    dest: str,
    options: PackOptions = PackOptions(),  # noqa: B008 - frozen, safe as a default
    progress: Callable[[PackProgress], None] | None = None,
    *,
    base: str | os.PathLike[str] | Base | None = None,
    dedup: bool | None = None,
    check: str | None = None,
    compact: bool | None = None,
) -> PackSummary:
    """Pack the tree at ``source`` into a new bundle at ``dest``: a directory, or a URL
    (``s3://bucket/x.bundle``: built locally, then uploaded,
    ``bundlefs.storage.objectstore.upload``).

    ``source`` is a directory, an archive (tar, plain or gzip/bzip2/xz/zstd compressed, or zip;
    "-" is a tar on stdin), a list of archives (tar shards: read in order into one tree), an
    object-store prefix (``s3://bucket/prefix/``, reached with ``options.storage_options``), or
    an ``EntrySource`` (a ``StreamingSource`` is loaded first). docs/archives.md says how archive
    members map to entries, docs/storage.md how objects do.

    Raises ``PackError`` for every failure: a bad option, an unreadable source (unless
    ``skip_errors``), a DEST that overlaps the source or (with ``force``) is not a bundle, a full
    disk, a store that refuses the upload. Nothing is left behind then, and an existing DEST is
    untouched (but a URL replaced with ``force`` no longer opens: its old marker goes first).

    With ``base`` (a bundle, OLD), the new bundle reuses OLD's stored bytes for every file of
    ``source`` (a directory, archives, a prefix, ``files_from``) that did not change since OLD
    (``options.check`` says how that is known; ``check``, when given, is it: "stat", "strict" or
    "content") and stores only the others: ``delta`` and ``delta_sink`` say how,
    docs/versions.md when to. OLD's shards are linked (a local OLD), or referenced where they are
    (an OLD on the object store ``dest`` is on; ``options.materialize``: copied there
    server-side), ``remote_base``. ``base`` may be a ``delta_base.Base`` already opened (a
    distributed pack's task), which ``pack`` closes.

    ``dedup`` (``options.dedup`` when None): store each distinct content once; a later file with
    the same content gets an entry of its own at the first copy's place (``content.DedupTable``).

    ``compact`` (``options.compact`` when None), with ``base``: NEW is what ``compact`` makes of
    the pack on the base, published once (``_pack_compacted``): the shards less live than
    ``options.min_live`` rewritten, small ones merged on the geometric rule.
    """
    started = time.monotonic()
    options = resolve_options(options, base is not None, dedup=dedup, compact=compact, check=check)
    paths = source_paths(source)
    location, remote = check_destination(paths, dest, options)
    opened = None if base is None else _open_base(base, source, paths, dest, options, remote)
    try:
        summary, where = _publish(source, location, remote, options, progress, opened)
    finally:
        if opened is not None:
            opened.close()
    summary.dest = where
    if remote is not None and remote.uploaded is not None:
        # The packer timed the build; the upload after it is the larger part on a slow link.
        summary.build_seconds = summary.seconds
        summary.upload_seconds = remote.uploaded.seconds
        summary.uploaded_bytes = remote.uploaded.total_bytes
        summary.seconds = time.monotonic() - started
    return summary


def _open_base(
    base: str | os.PathLike[str] | Base,
    source: PackSource,
    paths: list[str] | None,
    dest: str,
    options: PackOptions,
    remote: RemotePublisher | None,
) -> Base:
    """The base of a pack, opened (``base`` itself if it is: a distributed pack's task opens its
    own); ``PackError`` if the source is the caller's own ``EntrySource`` (``delta_sink.on_base``
    takes every source a path or URL names)."""
    if isinstance(base, Base):
        return base
    if paths is None:
        raise PackError(
            "a pack on a base (--base) needs a directory, archives, an object-store prefix or "
            "--files-from as SRC, not a source object"
        )
    return Base(os.fspath(base), dest, options, remote)


def _publish(
    source: PackSource,
    location: Location,
    remote: RemotePublisher | None,
    options: PackOptions,
    progress: Callable[[PackProgress], None] | None,
    base: Base | None,
) -> tuple[PackSummary, str]:
    """Build the bundle and publish it (``destination.publish_built``)."""
    uploading = None
    if progress is not None:
        report = progress

        def uploading(upload: UploadProgress) -> None:
            report(PackProgress(started=upload.started, upload=upload))

    return publish_built(
        location,
        remote,
        lambda work, work_id: _build(source, work, work_id, options, progress, base),
        force=options.force,
        staging=options.staging,
        what=f"cannot pack {_describe(source)}",
        upload_progress=uploading,
    )


def _build(
    source: PackSource,
    work: str,
    work_id: tuple[int, int],
    options: PackOptions,
    progress: Callable[[PackProgress], None] | None,
    base: Base | None,
) -> PackSummary:
    """One pack into ``work``, compacted there if asked (``_pack_compacted``)."""
    if base is None or not options.compact:
        return _Packer(source, work, work_id, options, progress, base).run()
    return _pack_compacted(
        _Packer(source, os.path.join(work, _PACKED), work_id, options, progress, base),
        work,
        work_id,
    )


def _pack_compacted(packer: _Packer, work: str, work_id: tuple[int, int]) -> PackSummary:
    """``pack --base --compact``: the pack on the base into ``work/packed``, then compacted
    from there into ``work`` (``compact.compact_into``: its own shards kept are moved, OLD's
    linked, the others' live records copied; ``packed`` removed before NEW is sealed). Time and
    memory: a compact's after the pack's (one more index written)."""
    assert packer.base is not None
    started = time.monotonic()
    os.mkdir(packer.work)
    summary = packer.run()
    options = CompactOptions(min_live=packer.options.min_live, shard_size=packer.options.shard_size)
    compaction = compact_into(packer.work, work, work_id, options)
    reuse, ways = packer.base.reuse, [w for w in compaction.ways if w != "move"]
    reuse.shards_linked, reuse.shards_left = len(ways), packer.base.count - len(ways)
    reuse.ways = {way: ways.count(way) for way in sorted(set(ways))}
    summary.config, summary.compaction = compaction.config, compaction
    summary.stored_bytes, summary.index_bytes = compaction.own_bytes, compaction.index_bytes
    summary.seconds = time.monotonic() - started
    return summary


class _Packer:
    """One pack into ``work``: the source, the builder and the content writer, wired together."""

    def __init__(
        self,
        source: PackSource,
        work,
        work_id: tuple[int, int],
        options: PackOptions,
        progress,
        base: Base | None = None,
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
        self.base = base
        if base is not None:
            given = options.block_size != fmt.DEFAULT_BLOCK_SIZE
            self.config = base.writer_config(self.config, given)

    def run(self) -> PackSummary:
        started = time.monotonic()
        pool = ThreadPoolExecutor(self.options.jobs) if self.options.jobs > 1 else None
        errors = self._errors()
        index: IndexWriter | None = None
        content: ContentWriter | None = None
        try:
            index = IndexWriter(os.path.join(self.work, fmt.INDEX_DIR))
            content = ContentWriter(
                self.work,
                self.config,
                index,
                errors,
                self.progress,
                shard_size=self.options.shard_size,
                level=self.level,
                pool=pool,
                tick=self._tick if self.report is not None else None,
                first_shard=0 if self.base is None else self.base.count,
                dedup=self.options.dedup,
            )
            shard_count, own = self._build(index, content, errors, pool)
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
        marker = publish.seal(self.work, shard_count, own)
        return PackSummary(
            "",
            self.config,
            sum(s.file_size for s in content.shards),
            marker.index_size,
            time.monotonic() - started,
            errors.skipped,
            content.changed,
            reuse=None if self.base is None else self.base.reuse,
            dedup_files=content.dedup.files if content.dedup is not None else 0,
            dedup_bytes=content.dedup.bytes if content.dedup is not None else 0,
        )

    def _build(
        self,
        index: IndexWriter,
        content: ContentWriter,
        errors: SourceErrors,
        pool: Executor | None,
    ) -> tuple[int, list[int] | None]:
        """Every entry and file of the source into ``index`` and the shards; the shard count and
        the shards the bundle wrote (None: all)."""
        options = self.options
        source = self._entry_source(errors, pool)
        sink: ContentSink = content
        if self.base is not None:  # unchanged files arrive stored at the base's bytes
            source, sink = on_base(source, self.base, content, self.work)
        if isinstance(source, StreamingSource):
            source.load(sink)  # an archive: read once, its content stored in its order
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
            record_sources=options.record_sources,
        )
        builder.build()
        index.put_meta(dict(options.meta))
        if self.base is None:
            shards = content.finish()
            self.config = builder.config(self.config, len(shards))
            index.put_config(self.config)
            return len(shards), None
        # The base's shards are numbered before the pack's own, whose table follows theirs.
        own = self.base.finish(self.work, index, self.config)
        first, shards = self.base.count, content.finish()
        own += range(first, first + len(shards))
        self.config = builder.config(self.base.final_config(self.config), first + len(shards))
        index.put_config(self.config)
        return self.config.shard_count, own

    def _errors(self) -> SourceErrors:
        # A source made by the caller reports to its own SourceErrors: the pack shares it, so
        # what the source skipped is in the summary too.
        own = getattr(self.source, "errors", None)
        return own if isinstance(own, SourceErrors) else SourceErrors(self.options.skip_errors)

    def _entry_source(self, errors: SourceErrors, pool: Executor | None) -> EntrySource:
        """A directory walk, an archive reader, an object listing, or the caller's own
        ``EntrySource``."""
        paths = source_paths(self.source)
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
        listed = self.options.files_from
        if listed is not None:  # pack --files-from: those paths of a directory, in that order
            if len(paths) != 1 or not os.path.isdir(paths[0]):
                raise PackError("a list of files to pack (--files-from) needs one directory SRC")
            return ListedSource(paths[0], listed, errors, excludes=self.options.excludes)
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
