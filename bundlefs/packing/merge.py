"""Merging bundles without copying their data: ``merge`` and its options.

A merged bundle's index covers every input's tree, each at its own prefix or overlaid at the root,
and its shards are the inputs' shard files, hard-linked (else reflinked, else copied) under the new
bundle's names with their bytes unchanged. The shard table (docs/format.md §3.5, format version 3)
records each linked shard's codec and the header it carries, so nothing in a shard is rewritten.
The index is built by the packer's own ``EntryBuilder`` from ``MergedSource``, an ``EntrySource``
whose files are already stored: a merge numbers inodes exactly as a pack of the union tree would,
which is how a distributed pack (``bundlefs.integrations.dask``) ends identical to a pack on one
machine.

Name clashes: directories present in several inputs merge (their attributes are the last input's,
or with ``on_clash="first"`` the first's); any other name present in several inputs is an error,
unless ``on_clash`` says which input wins ("last" or "first"), the way a later layer of an overlay
file system hides an earlier one.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.packing``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import heapq
import itertools
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.errors import BundleError, PackError
from bundlefs.packing.builder import EntryBuilder
from bundlefs.packing.content import ContentWriter
from bundlefs.packing.packer import (
    PackProgress,
    check_places,
    creation_time,
    publish_built,
)
from bundlefs.packing.sources import SourceErrors, SourceItem, StoredContent
from bundlefs.storage import publish
from bundlefs.storage.index import IndexReader, IndexWriter
from bundlefs.storage.location import parse_location
from bundlefs.storage.publish_remote import RemotePublisher

CLASH_RULES = ("error", "last", "first")
_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


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
) -> MergeSummary:
    """Merge the bundles ``inputs`` (local directories) into a new bundle at ``dest`` (a
    directory, or a URL: built locally, then uploaded).

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
    readers = _open_inputs(paths)
    try:
        if remote is not None:
            remote.check(options.force)
        else:
            for path in paths:
                check_places(path, location.path, options.force)
        merger = _Merger(readers, paths, prefixes, options, created_ns, progress)
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


def _open_inputs(paths: list[str]) -> list[IndexReader]:
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
        if sum(r.config.shard_count for r in readers) > fmt.MAX_SHARDS:
            raise PackError(f"the bundles have more than {fmt.MAX_SHARDS} shards together")
    except BaseException:
        for reader in readers:
            reader.close()
        raise
    return readers


# -- the merged tree ------------------------------------------------------------------------------


@dataclass(slots=True)
class _MergedStat:
    """What the builder reads of a merged entry (the ``Stat`` protocol), with what the entry
    carries that a stat result does not."""

    st_mode: int
    st_uid: int
    st_gid: int
    st_mtime_ns: int
    st_size: int
    st_nlink: int = 1
    st_dev: int = 0  # the input's number: with st_ino, names one file across the inputs
    st_ino: int = 0
    st_rdev: int = 0  # a device's number
    symlink: bytes = b""
    user_data: bytes = b""


# A layer of a merged directory: an input's directory (input number, inode), or a node of the
# prefix tree (the directories the --at prefixes make).
@dataclass
class _PrefixNode:
    children: dict[bytes, _PrefixNode] = field(default_factory=dict)
    roots: list[int] = field(default_factory=list)  # inputs whose prefix ends here


_Layer = tuple[int, int] | _PrefixNode


class MergedSource:
    """The union of the inputs' trees as an ``EntrySource`` whose files are already stored.

    The builder lists directories breadth first; each directory it was given is remembered (as
    the layers it merges) until the builder lists it, so memory holds the directories of about two
    levels of the tree, like the builder's own queue.
    """

    def __init__(
        self,
        readers: list[IndexReader],
        shard_base: list[int],
        prefixes: list[tuple[bytes, ...]],
        on_clash: str,
        errors: SourceErrors,
    ) -> None:
        self.readers = readers
        self.shard_base = shard_base
        self.on_clash = on_clash
        self.errors = errors
        self.overridden: list[str] = []
        self._tree = _PrefixNode()
        for number, parts in enumerate(prefixes):
            node = self._tree
            for part in parts:
                node = node.children.setdefault(part, _PrefixNode())
            node.roots.append(number)
        self._pending: dict[bytes, list[_Layer]] = {}

    # -- EntrySource --

    def root(self) -> SourceItem:
        layers: list[_Layer] = [self._tree]
        self._pending[b""] = layers
        return SourceItem(b"", b"", self._dir_stat(layers))

    def children(self, rel: bytes) -> Iterator[SourceItem]:
        layers = self._pending.pop(rel)
        listings = [self._listing(number, layer) for number, layer in enumerate(layers)]
        merged = heapq.merge(*listings, key=lambda named: (named[0], named[1]))
        for name, group in itertools.groupby(merged, key=lambda named: named[0]):
            found = [(order, layer) for _name, order, layer in group]
            child_rel = rel + b"/" + name if rel else name
            chosen = self._resolve(child_rel, found)
            if isinstance(chosen, list):
                self._pending[child_rel] = chosen
                yield SourceItem(child_rel, name, self._dir_stat(chosen))
            else:
                yield self._item(child_rel, name, chosen)

    def readlink(self, item: SourceItem) -> bytes:
        return item.st.symlink  # type: ignore[attr-defined]  # a _MergedStat

    def open(self, item: SourceItem):  # pragma: no cover - every file arrives stored
        raise AssertionError("a merged file is never read")

    # -- listing and clashes --

    def _listing(self, order: int, layer: _Layer) -> Iterator[tuple[bytes, int, _Layer | Any]]:
        """(name, layer order, what) for a layer's children, in name order: a prefix node's
        sub-nodes, or an input directory's entries as (input, entry)."""
        if isinstance(layer, _PrefixNode):
            subtrees = sorted(layer.children.items())
            roots = [(number, fmt.ROOT_INO) for number in layer.roots]
            if not roots:
                for name, node in subtrees:
                    yield name, order, node
                return
            # The inputs rooted here list their children too: merge them with the sub-nodes,
            # which come last, so a prefix's directory counts as the later layer.
            yield from heapq.merge(
                *(self._input_listing(order, number, ino) for number, ino in roots),
                ((name, order, node) for name, node in subtrees),
                key=lambda named: named[0],
            )
            return
        number, ino = layer
        yield from self._input_listing(order, number, ino)

    def _input_listing(self, order: int, number: int, ino: int) -> Iterator:
        reader = self.readers[number]
        directory = reader.entry(ino)
        for entry in reader.iter_entries(directory.first_child, directory.size):
            yield entry.name, order, (number, entry)

    def _resolve(self, rel: bytes, found: list[tuple[int, Any]]) -> list[_Layer] | tuple:
        """What a name present in ``found`` layers becomes: a merged directory (its layers) or
        one input's entry, by the clash rule."""
        # By input: a prefix's directory ranks as the first (or last) input placed in it.
        found = sorted(found, key=lambda f: self._rank(f[1]))
        if all(_is_dir(what) for _order, what in found):
            return [_as_layer(what) for _order, what in found]
        if self.on_clash == "error" and len(found) > 1:
            raise PackError(
                f"{os.fsdecode(rel)} is in more than one bundle and is not a directory in all of "
                "them (choose which wins with --on-clash last or first)"
            )
        ordered = found if self.on_clash == "first" else found[::-1]
        winner = ordered[0][1]
        if len(found) > 1:
            self.overridden.append(os.fsdecode(rel))
        if not _is_dir(winner):
            return winner
        # A directory wins: it merges with the directories next to it, up to the first
        # layer that is not one (which it hides, with everything beyond it).
        layers = list(itertools.takewhile(lambda w: _is_dir(w[1]), ordered))
        if self.on_clash == "last":
            layers.reverse()
        return [_as_layer(what) for _order, what in layers]

    def _rank(self, what: Any) -> int:
        """Which input a candidate counts as: its own, or for a prefix's directory the first
        (with "first") or last input placed at or below it."""
        if not isinstance(what, _PrefixNode):
            return what[0]
        below = _inputs_below(what)
        return min(below) if self.on_clash == "first" else max(below)

    # -- items --

    def _dir_stat(self, layers: list[_Layer]) -> _MergedStat:
        """A merged directory's attributes: its last (or with "first", its first) input
        directory's; a directory only a prefix makes takes the first input root's."""
        inputs = [layer for layer in layers if not isinstance(layer, _PrefixNode)]
        for layer in layers:
            if isinstance(layer, _PrefixNode):
                inputs += [(number, fmt.ROOT_INO) for number in layer.roots]
        if inputs:
            pick = min if self.on_clash == "first" else max
            number, ino = pick(inputs, key=lambda layer: layer[0])
        else:
            number, ino = 0, fmt.ROOT_INO
        entry = self.readers[number].entry(ino)
        return self._stat(number, entry)

    def _stat(self, number: int, entry: fmt.Entry) -> _MergedStat:
        uid, gid = self.readers[number].owners[entry.owner]
        return _MergedStat(
            st_mode=entry.mode,
            st_uid=uid,
            st_gid=gid,
            st_mtime_ns=entry.mtime_ns,
            st_size=entry.size,
            # A file the input's packer saw with several links carries NLINK even when its
            # other names were not packed (nlink 1): kept, so the merge writes what a pack would.
            st_nlink=max(entry.nlink, 2) if entry.flags & fmt.FLAG_NLINK else entry.nlink,
            st_dev=number,
            st_ino=entry.ino,
            st_rdev=entry.rdev,
            symlink=entry.symlink,
            user_data=entry.user_data,
        )

    def _item(self, rel: bytes, name: bytes, chosen: tuple[int, fmt.Entry]) -> SourceItem:
        number, entry = chosen
        reader = self.readers[number]
        if entry.is_link:  # a later name of a hard-linked file: the file it names, whose
            target = reader.entry(entry.target)  # attributes and user data it shares
            if not target.is_file or target.is_link:
                raise fmt.FormatError(
                    f"{os.fsdecode(rel)} is a hard link to entry {entry.target}, not to a file"
                )
            entry = target
        st = self._stat(number, entry)
        stored = None
        if entry.is_file:
            stored = StoredContent(
                shard=self.shard_base[number] + entry.shard,
                offset=entry.offset,
                size=entry.size,
                crc32c=entry.crc32c,
                st=st,
                head=b"",
                content_type=reader.content_type(entry),
            )
        return SourceItem(rel, name, st, stored=stored)


def _inputs_below(node: _PrefixNode) -> list[int]:
    """The inputs placed at ``node`` or below it."""
    out = list(node.roots)
    for child in node.children.values():
        out += _inputs_below(child)
    return out


def _is_dir(what: Any) -> bool:
    if isinstance(what, _PrefixNode):
        return True
    return what[1].is_dir


def _as_layer(what: Any) -> _Layer:
    if isinstance(what, _PrefixNode):
        return what
    number, entry = what
    return (number, entry.ino)


# -- building -------------------------------------------------------------------------------------


class _Merger:
    """One merge into ``work``: shards linked, records and shard table copied, entries built."""

    def __init__(
        self,
        readers: list[IndexReader],
        paths: list[str],
        prefixes: list[tuple[bytes, ...]],
        options: MergeOptions,
        created_ns: int,
        progress: Callable[[PackProgress], None] | None,
    ) -> None:
        self.readers = readers
        self.paths = paths
        self.prefixes = prefixes
        self.options = options
        self.created_ns = created_ns
        self.report = progress
        self.progress = PackProgress()
        self.shard_base = list(itertools.accumulate([0] + [r.config.shard_count for r in readers]))

    def run(self, work: str, work_id: tuple[int, int]) -> MergeSummary:
        ways = self._link_shards(work)
        first = self.readers[0].config
        codecs = {r.shard_info(i).codec for r in self.readers for i in range(r.config.shard_count)}
        zstd = fmt.COMPRESSION_ZSTD in codecs
        config = fmt.Config(
            block_size=first.block_size,
            record_size=max(r.config.record_size for r in self.readers),
            large_file_threshold=first.large_file_threshold,
            # What a reader needs: zstd if any linked shard is (a bundle is refused at open
            # where zstd is missing, not at its first read of such a shard).
            compression=fmt.COMPRESSION_ZSTD if zstd else first.record_codec,
            created_ns=self.created_ns,
        )
        errors = SourceErrors(False)
        source = MergedSource(
            self.readers, self.shard_base, self.prefixes, self.options.on_clash, errors
        )
        index = IndexWriter(os.path.join(work, fmt.INDEX_DIR))
        try:
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
            self._copy_shard_table(index)
            index.put_meta(dict(self.options.meta))
            shard_count = self.shard_base[-1]
            config = builder.config(config, shard_count)
            index.put_config(config)
        except BaseException:
            with contextlib.suppress(BundleError):
                index.abort()
            raise
        index.close()  # a close that fails is not followed by an abort
        marker = publish.seal(work, shard_count, own_shards=())
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

    def _copy_shard_table(self, index: IndexWriter) -> None:
        """Each input's records and shard descriptors, renumbered after the inputs before it."""
        for number, reader in enumerate(self.readers):
            base = self.shard_base[number]
            for shard in range(reader.config.shard_count):
                for record in reader.iter_records(shard):
                    record.shard = base + shard
                    index.put_record(record)
        for number, reader in enumerate(self.readers):
            base = self.shard_base[number]
            for shard in range(reader.config.shard_count):
                info = reader.shard_info(shard)
                own = info.header_id == fmt.OWN_BUNDLE_ID
                index.put_shard(
                    base + shard,
                    fmt.ShardInfo(
                        info.file_size,
                        info.uncompressed_size,
                        info.record_count,
                        info.codec,
                        info.header_version,
                        shard if info.header_index is None else info.header_index,
                        reader.marker.bundle_id if own else info.header_id,
                    ),
                )

    def _link_shards(self, work: str) -> list[str]:
        """Link (else clone, else copy) every input shard file into ``work``; how, per shard."""
        ways = []
        for number, reader in enumerate(self.readers):
            version = reader.marker.format_version
            for shard in range(reader.config.shard_count):
                src = os.path.join(self.paths[number], fmt.shard_filename(shard, version))
                dst = os.path.join(work, fmt.shard_filename(self.shard_base[number] + shard))
                ways.append(link_or_copy(src, dst))
                self._check_linked(reader, shard, src, dst)
                self.progress.bytes_read += os.path.getsize(dst)
                if self.report is not None:
                    self.report(self.progress)
        return ways

    @staticmethod
    def _check_linked(reader: IndexReader, shard: int, src: str, dst: str) -> None:
        """The file linked is the one the input's index describes: an input replaced since
        its index was read (a pack --force) would otherwise give a bundle that cannot read."""
        info = reader.shard_info(shard)
        with open(dst, "rb") as f:
            header, size = f.read(fmt.SHARD_HEADER_SIZE), os.fstat(f.fileno()).st_size
        try:
            fmt.check_shard_header(header, shard, reader.marker.bundle_id, info)
            if size != info.file_size:
                raise fmt.FormatError(f"it is {size} bytes, its index says {info.file_size}")
        except BundleError as e:
            raise PackError(f"{src} is not the shard its bundle's index describes: {e}") from None


def link_or_copy(src: str, dst: str) -> str:
    """Make ``dst`` a file with ``src``'s bytes: a hard link, else a reflink (a copy-on-write
    clone), else a copy. Returns which: "link", "reflink" or "copy"."""
    try:
        os.link(src, dst)
        return "link"
    except OSError as e:
        # EXDEV: another file system; EPERM: hard links refused (fs.protected_hardlinks, some
        # network file systems); EMLINK: too many links already.
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
    with open(src, "rb") as source, open(dst, "xb") as target:
        try:
            fcntl.ioctl(target.fileno(), _FICLONE, source.fileno())
            os.fsync(target.fileno())  # the clone's extents, durable before COMPLETE is
            return "reflink"
        except OSError:
            pass  # not a copy-on-write file system, or not the same one
        shutil.copyfileobj(source, target, 1024 * 1024)
        target.flush()
        os.fsync(target.fileno())
    shutil.copystat(src, dst)
    return "copy"
