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
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from bundlefs.core import format as fmt
from bundlefs.errors import IndexWriteError, PackError
from bundlefs.packing.builder import EntryBuilder, UserData
from bundlefs.packing.content import ContentWriter
from bundlefs.packing.sources import DirectorySource, SourceErrors
from bundlefs.storage import publish
from bundlefs.storage.index import IndexWriter

DEFAULT_SHARD_SIZE = 4 * 1024**3


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


@dataclass
class PackProgress:
    """Counters updated while packing; ``total_*`` are unknown (0) unless the caller set them."""

    files: int = 0
    dirs: int = 0
    bytes_read: int = 0
    bytes_stored: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass
class PackSummary:
    dest: str
    config: fmt.Config
    stored_bytes: int
    index_bytes: int
    seconds: float
    skipped: list[str] = field(default_factory=list)  # special files and (with skip_errors) errors
    changed: list[str] = field(default_factory=list)  # files that changed while being read

    def to_dict(self) -> dict[str, object]:
        """The summary as JSON-ready facts (the counts of ``bundlefs pack``'s summary line)."""
        c = self.config
        return {
            "dest": self.dest,
            "files": c.file_count,
            "dirs": c.dir_count,
            "symlinks": c.symlink_count,
            "hardlinks": c.hardlink_count,
            "bytes": c.data_bytes,
            "stored_bytes": self.stored_bytes,
            "index_bytes": self.index_bytes,
            "ratio": round(c.data_bytes / self.stored_bytes, 4) if self.stored_bytes else 0.0,
            "seconds": round(self.seconds, 3),
            "skipped": self.skipped,
            "changed": self.changed,
        }


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _check_places(source: str, dest: str, force: bool) -> None:
    """Refuse a DEST that overlaps the source (either way, through any symlink) or is not ours."""
    if not os.path.isdir(source):
        raise PackError(f"source {source} is not a directory")
    parent, name = os.path.split(os.path.abspath(dest))
    if not os.path.isdir(parent):
        raise PackError(f"the directory to hold {dest} does not exist")
    # DEST itself may be a symlink (refused below); where it will be written is parent/name.
    dest_real = os.path.join(os.path.realpath(parent), name)
    source_real = os.path.realpath(source)
    if _inside(dest_real, source_real):
        raise PackError("the bundle cannot be written inside the tree being packed")
    if _inside(source_real, dest_real):
        raise PackError("the tree being packed is inside DEST, which a pack would replace")
    if os.path.lexists(dest):
        if not force:
            raise PackError(f"{dest} already exists (use --force to replace it)")
        if not publish.is_bundle(dest):
            raise PackError(publish.NOT_A_BUNDLE)


def pack(
    source: str,
    dest: str,
    options: PackOptions = PackOptions(),  # noqa: B008 - frozen, safe as a default
    progress: Callable[[PackProgress], None] | None = None,
) -> PackSummary:
    """Pack the tree at ``source`` into a new bundle at ``dest``.

    Raises ``PackError`` for every failure: a bad option, an unreadable source (unless
    ``skip_errors``), a DEST that overlaps the source or (with ``force``) is not a bundle, a full
    disk. Nothing is left behind then, and an existing DEST is untouched.
    """
    if options.compression not in fmt.COMPRESSION_NAMES:
        raise PackError(f"unknown compression {options.compression!r} (choose lz4 or none)")
    try:
        fmt.validate_layout(options.block_size, options.record_size)
    except fmt.FormatError as e:
        raise PackError(str(e)) from None
    _check_places(source, dest, options.force)
    try:
        with publish.stage(dest) as (work, work_id):
            summary = _Packer(source, work, work_id, options, progress).run()
            publish.publish(work, dest, options.force)
    except IndexWriteError as e:
        raise PackError(f"cannot write the index of {dest}: {e.reason}") from e
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise PackError(f"cannot write the bundle {dest}: {e.strerror or e}{where}") from e
    except fmt.FormatError as e:
        raise PackError(f"cannot pack {source}: {e}") from e
    summary.dest = dest
    return summary


class _Packer:
    """One pack into ``work``: the source, the builder and the content writer, wired together."""

    def __init__(self, source, work, work_id: tuple[int, int], options: PackOptions, progress):
        self.source = source
        self.work = work
        # (st_dev, st_ino) of ``work``: skipped if the walk meets it (a bind mount, say), so the
        # packer never reads its own growing output.
        self.work_id = work_id
        self.options = options
        self.report = progress
        self.progress = PackProgress()
        self._last_report = 0.0
        self.config = fmt.Config(
            block_size=options.block_size,
            record_size=options.record_size,
            compression=fmt.COMPRESSION_NAMES[options.compression],
        )

    def run(self) -> PackSummary:
        started = time.monotonic()
        options = self.options
        pool = ThreadPoolExecutor(options.jobs) if options.jobs > 1 else None
        errors = SourceErrors(options.skip_errors)
        index: IndexWriter | None = None
        content: ContentWriter | None = None
        try:
            index = IndexWriter(os.path.join(self.work, fmt.INDEX_DIR))
            source = DirectorySource(
                self.source, errors, excludes=options.excludes, pool=pool, skip=self.work_id
            )
            tick = self._tick if self.report is not None else None
            content = ContentWriter(
                self.work,
                self.config,
                index,
                errors,
                self.progress,
                shard_size=options.shard_size,
                pool=pool,
                tick=tick,
            )
            builder = EntryBuilder(
                source, content, index, errors, self.progress, user_data=options.user_data
            )
            builder.build()
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

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._last_report >= 0.2:
            self._last_report = now
            self.report(self.progress)
