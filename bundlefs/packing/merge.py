"""Merging bundles without copying their data: ``merge`` and its options.

A merged bundle's index covers every input's tree, each at its own prefix or overlaid at the root,
and its shards are the inputs' shard files, reused with their bytes unchanged
(``reuse.ReusedShards``: hard-linked, else reflinked, else copied, their shard table imported).
The index is built by the packer's own ``EntryBuilder`` from ``sources.stored.StoredSource``, an
``EntrySource`` whose files are already stored: a merge numbers inodes exactly as a pack of the
union tree would, which is how a distributed pack (``bundlefs.packing.distributed``) ends identical
to a pack on one machine. Name clashes follow ``MergeOptions.on_clash`` (``sources.stored`` says
how); the result is published by ``destination.publish_built``, as a pack's is.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.packing``
below it (``options``, ``sources``, ``content``, ``builder``, ``destination``, ``reuse``,
``delta``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.errors import BundleError, PackError
from bundlefs.packing.builder import EntryBuilder
from bundlefs.packing.content import ContentWriter
from bundlefs.packing.delta_base import Base
from bundlefs.packing.destination import check_places, publish_built
from bundlefs.packing.options import PackProgress, creation_time
from bundlefs.packing.reuse import ReusedShards
from bundlefs.packing.sources.base import SourceErrors
from bundlefs.packing.sources.stored import CLASH_RULES, StoredSource
from bundlefs.storage import publish
from bundlefs.storage.index import IndexReader
from bundlefs.storage.index_writer import IndexWriter
from bundlefs.storage.location import parse_location
from bundlefs.storage.objectstore.upload import RemotePublisher


@dataclass(frozen=True)
class MergeOptions:
    # One prefix per input ("" or "." for the root), or None: every input overlaid at the root.
    at: tuple[str, ...] | None = None
    # A name that is not a directory in every input holding it: "error", or which input wins.
    on_clash: str = "error"
    force: bool = False
    # The new bundle's metadata (docs/format.md §3.7); the inputs' own is not carried over.
    meta: tuple[tuple[str, str], ...] = ()
    created_ns: int | None = None  # None: SOURCE_DATE_EPOCH, else the clock (as pack)
    storage_options: dict[str, Any] | None = None  # a DEST that is a URL
    staging: str | None = None  # where a URL's bundle is built (None: the temporary directory)


@dataclass
class MergeSummary:
    dest: str
    config: fmt.Config
    inputs: int
    linked: int  # shard files hard-linked
    reflinked: int  # shard files cloned (a copy-on-write file system across a link boundary)
    copied: int  # shard files copied: neither worked (another file system)
    index_bytes: int
    seconds: float
    overridden: list[str] = field(default_factory=list)  # names an earlier input lost (clashes)

    def to_dict(self) -> dict[str, object]:
        c = self.config
        return {
            "dest": self.dest,
            "inputs": self.inputs,
            "files": c.file_count,
            "dirs": c.dir_count,
            "symlinks": c.symlink_count,
            "hardlinks": c.hardlink_count,
            "specials": c.special_count,
            "data_bytes": c.data_bytes,
            "shards": c.shard_count,
            "linked": self.linked,
            "reflinked": self.reflinked,
            "copied": self.copied,
            "index_bytes": self.index_bytes,
            "seconds": round(self.seconds, 3),
            "overridden": self.overridden,
        }


def merge(
    inputs: Sequence[str | os.PathLike[str]],
    dest: str,
    options: MergeOptions = MergeOptions(),  # noqa: B008 - frozen, safe as a default
    progress: Callable[[PackProgress], None] | None = None,
    *,
    base: Base | None = None,
) -> MergeSummary:
    """Merge the bundles ``inputs`` (local directories) into a new bundle at ``dest`` (a
    directory, or a URL: built locally, then uploaded).

    ``base``: the inputs are packs on that base bundle (the tasks of a distributed pack on a
    base), each describing the base's shards at their own numbers before its own (holding their
    files or not: they are never read from an input): the merged bundle holds them once, those
    a file uses linked from the base (``delta_base.Base.finish``), and each input's own after them.

    Raises ``PackError`` for every failure (an input that is not a bundle, inputs that cannot
    share one bundle, a clash the rule refuses, a DEST that overlaps an input), and leaves
    nothing behind then; an existing DEST is replaced only with ``force``.
    """
    started = time.monotonic()
    if not inputs:
        raise PackError("nothing to merge: no input bundle given")
    paths = _local_paths([os.fspath(p) for p in inputs])
    if options.on_clash not in CLASH_RULES:
        raise PackError(f"unknown clash rule {options.on_clash!r} (choose error, last or first)")
    prefixes = _prefixes(options.at, len(paths))
    created_ns = creation_time(options.created_ns)
    try:
        location = parse_location(dest, options.storage_options)
    except PackError:
        raise
    except BundleError as e:
        raise PackError(str(e)) from None
    remote = None if location.is_local else RemotePublisher(location)
    readers = _open_inputs(paths, 0 if base is None else base.count)
    try:
        if remote is not None:
            remote.check(options.force)
        else:
            for path in paths:
                check_places(path, location.path, options.force)
        merger = _Merger(readers, paths, prefixes, options, created_ns, progress, base)
        summary, where = publish_built(
            location,
            remote,
            merger.run,
            force=options.force,
            staging=options.staging,
            what="cannot merge the bundles",
        )
    finally:
        for reader in readers:
            reader.close()
    summary.dest = where
    summary.seconds = time.monotonic() - started
    return summary


def _prefixes(at: tuple[str, ...] | None, count: int) -> list[tuple[bytes, ...]]:
    """Each input's prefix as path components (() for the root)."""
    if at is None:
        return [()] * count
    if len(at) != count:
        raise PackError(f"{len(at)} prefixes for {count} bundles: give one --at per bundle")
    out = []
    for prefix in at:
        parts = tuple(p for p in os.fsencode(prefix).split(b"/") if p not in (b"", b"."))
        for part in parts:
            if part == b".." or len(part) > fmt.MAX_NAME:
                raise PackError(f"prefix {prefix!r} is not a path inside the new bundle")
        out.append(parts)
    return out


def _local_paths(paths: list[str]) -> list[str]:
    """The inputs as local directories (``file://`` URLs too); ``PackError`` for a remote one."""
    out = []
    for path in paths:
        try:
            location = parse_location(path)
        except BundleError as e:
            raise PackError(str(e)) from None
        if not location.is_local:
            raise PackError(f"{path}: merge links shard files, so its inputs must be local bundles")
        out.append(location.path)
    return out


def _open_inputs(paths: list[str], shared: int) -> list[IndexReader]:
    """The inputs' indexes, checked to fit one bundle (``shared``: the shards each holds of a
    common base, counted once)."""
    readers: list[IndexReader] = []
    try:
        for path in paths:
            if not os.path.isdir(path):
                raise PackError(f"{path} is not a bundle (no such directory)")
            try:
                readers.append(IndexReader(path))
            except BundleError as e:
                raise PackError(f"{path} is not a bundle that can be merged: {e}") from None
        sizes = {r.config.block_size for r in readers}
        if len(sizes) > 1:
            raise PackError(
                "the bundles have different block sizes "
                f"({', '.join(str(s) for s in sorted(sizes))}); a merged bundle has one"
            )
        if any(r.config.shard_count < shared for r in readers):
            raise PackError("an input is not a pack on the base: it has fewer shards")
        if sum(r.config.shard_count - shared for r in readers) + shared > fmt.MAX_SHARDS:
            raise PackError(f"the bundles have more than {fmt.MAX_SHARDS} shards together")
    except BaseException:
        for reader in readers:
            reader.close()
        raise
    return readers


class _Merger:
    """One merge into ``work``: shards reused, entries built over them."""

    def __init__(
        self,
        readers: list[IndexReader],
        paths: list[str],
        prefixes: list[tuple[bytes, ...]],
        options: MergeOptions,
        created_ns: int,
        progress: Callable[[PackProgress], None] | None,
        base: Base | None = None,
    ) -> None:
        self.readers = readers
        self.prefixes = prefixes
        self.options = options
        self.created_ns = created_ns
        self.report = progress
        self.progress = PackProgress()
        self.base = base
        self.shared = 0 if base is None else base.count  # the base's shards, in every input
        select = None
        if base is not None:  # each input's own shards, after the base's
            select = [range(self.shared, r.config.shard_count) for r in readers]
        self.shards = ReusedShards(readers, paths, first=self.shared, select=select)

    def run(self, work: str, work_id: tuple[int, int]) -> MergeSummary:
        ways = self.shards.link(work, self._linked)
        errors = SourceErrors(False)
        source = StoredSource(
            self.readers,
            [first - self.shared for first in self.shards.base],
            self.prefixes,
            self.options.on_clash,
            errors,
            shared=self.shared,
        )
        index = IndexWriter(os.path.join(work, fmt.INDEX_DIR))
        try:
            config = self._config()
            # Never given a file to store (every file arrives stored): it writes no shard.
            content = ContentWriter(work, config, index, errors, self.progress, shard_size=1)
            builder = EntryBuilder(
                source,
                content,
                index,
                errors,
                self.progress,
                user_data=lambda _rel, st: st.user_data,  # type: ignore[attr-defined]
                content_types=None,
            )
            builder.build()
            self.shards.import_table(index)
            own: list[int] = []
            if self.base is not None:  # the base's shards the files use, at their numbers
                self.base.used = source.shared_used
                own = self.base.finish(work, index, config)
                config = self.base.final_config(config)
            index.put_meta(dict(self.options.meta))
            config = builder.config(config, self.shards.count)
            index.put_config(config)
        except BaseException:
            with contextlib.suppress(BundleError):
                index.abort()
            raise
        index.close()  # a close that fails is not followed by an abort
        marker = publish.seal(work, self.shards.count, own_shards=own)
        return MergeSummary(
            dest="",
            config=config,
            inputs=len(self.readers),
            linked=ways.count("link"),
            reflinked=ways.count("reflink"),
            copied=ways.count("copy"),
            index_bytes=marker.index_size,
            seconds=0.0,
            overridden=source.overridden,
        )

    def _config(self) -> fmt.Config:
        first = self.readers[0].config
        return fmt.Config(
            block_size=first.block_size,
            record_size=max(r.config.record_size for r in self.readers),
            large_file_threshold=first.large_file_threshold,
            # What a reader needs: zstd if any linked shard is (a bundle is refused at open
            # where zstd is missing, not at its first read of such a shard).
            compression=(
                fmt.COMPRESSION_ZSTD
                if fmt.COMPRESSION_ZSTD in self.shards.codecs()
                else first.record_codec
            ),
            created_ns=self.created_ns,
        )

    def _linked(self, size: int) -> None:
        self.progress.bytes_read += size
        if self.report is not None:
            self.report(self.progress)
