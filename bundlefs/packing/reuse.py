"""Reusing stored bundles' shards in a new bundle, their bytes unchanged: ``ReusedShards``.

A new bundle can take over the shard files of bundles already stored (a merge takes all of its
inputs'; a delta pack would take its base's): each file is hard-linked (else reflinked, else
copied, ``link_or_copy``) under the new bundle's name for it, checked against the index that
describes it, and its records and shard descriptor are imported into the new index, renumbered
after the shards before it. The shard table (docs/format.md §3.5, format version 3) records each
reused shard's codec and the header it carries (``ShardInfo.header_id``), so nothing in a shard is
rewritten. File entries that point into reused shards are the stored source's business
(``sources.stored``), which numbers them with the same ``base``.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import itertools
import os
import shutil
from collections.abc import Callable, Iterator, Sequence

from bundlefs.core import format as fmt
from bundlefs.errors import BundleError, PackError
from bundlefs.storage.index import IndexReader, raw_records
from bundlefs.storage.index_writer import IndexWriter

_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


class ReusedShards:
    """The shards of the stored bundles ``readers`` (at ``paths``), in order, as shards
    ``first`` … of a new bundle: bundle ``n``'s shard ``s`` becomes shard ``base[n] + s``.

    ``select`` (one sequence per bundle) takes only those shards of each, in that order:
    bundle ``n``'s ``select[n][i]`` becomes shard ``base[n] + i`` (``compact`` keeps some), or
    with ``keep_numbers`` shard ``base[n] + select[n][i]``, the others' numbers left for the
    caller to fill (a delta pack, whose entries point at its base's shard numbers).

    ``adopt``: the stored bundle is one built only to be compacted and then discarded (``pack
    --base --compact``): the shards it wrote itself are moved, not linked, and become the new
    bundle's own (stamped by ``seal`` with its id and their new numbers)."""

    def __init__(
        self,
        readers: Sequence[IndexReader],
        paths: Sequence[str],
        first: int = 0,
        select: Sequence[Sequence[int]] | None = None,
        *,
        keep_numbers: bool = False,
        adopt: bool = False,
    ):
        self.readers = list(readers)
        self.paths = list(paths)
        self.taken = [
            list(range(r.config.shard_count)) if select is None else list(select[n])
            for n, r in enumerate(self.readers)
        ]
        self.keep_numbers = keep_numbers
        self.adopt = adopt
        sizes = [
            r.config.shard_count if keep_numbers else len(t)
            for r, t in zip(self.readers, self.taken, strict=True)
        ]
        self.base = list(itertools.accumulate([first, *sizes]))

    @property
    def count(self) -> int:
        """How many shards the new bundle has up to the last reused one."""
        return self.base[-1]

    def _each(self) -> Iterator[tuple[IndexReader, int, int, int]]:
        """(reader, its bundle's number, the shard there, its number in the new bundle)."""
        for number, reader in enumerate(self.readers):
            for position, shard in enumerate(self.taken[number]):
                yield (
                    reader,
                    number,
                    shard,
                    self.base[number] + (shard if self.keep_numbers else position),
                )

    def codecs(self) -> set[int]:
        """The record codecs of every reused shard."""
        return {reader.shard_info(shard).codec for reader, _n, shard, _new in self._each()}

    def link(self, work: str, linked: Callable[[int], None] | None = None) -> list[str]:
        """Link (else clone, else copy) every reused shard file into ``work``, each checked
        against its index; ``linked(bytes)`` after each. How, per shard ("link", "reflink",
        "copy"; "move" for an adopted one)."""
        ways = []
        for reader, number, shard, new in self._each():
            version = reader.marker.format_version
            src = os.path.join(self.paths[number], fmt.shard_filename(shard, version))
            dst = os.path.join(work, fmt.shard_filename(new))
            if self.adopt and reader.shard_info(shard).header_id == fmt.OWN_BUNDLE_ID:
                os.rename(src, dst)  # one name: ``seal`` stamps no file with other names
                ways.append("move")
            else:
                ways.append(link_or_copy(src, dst))
            check_linked(reader, shard, src, dst)
            if linked is not None:
                linked(os.path.getsize(dst))
        return ways

    def import_table(
        self, index: IndexWriter, *, append: bool = True, records: bool = True
    ) -> list[int]:
        """Every reused shard's records (unless not ``records``) and descriptor into ``index``,
        renumbered; not ``append``: records of later shards are written already (a delta pack's
        own). Returns the shards adopted (``adopt``), for ``seal`` to stamp with NEW's id."""
        for reader, _number, shard, new in self._each() if records else ():
            if (
                new == shard
                and self.keep_numbers
                and reader.marker.format_version == fmt.FORMAT_VERSION
            ):
                # A delta pack's base: keys and values as they are (its readers decode them):
                # ~1 µs a record, not ~10: most of Base.finish, ~0.1 s at 100,000 files.
                index.put_raw_records(raw_records(reader, shard), append=append)
                continue
            for record in reader.iter_records(shard):
                record.shard = new
                index.put_record(record, append=append)
        adopted = []
        for reader, _number, shard, new in self._each():
            info = reader.shard_info(shard)
            own = info.header_id == fmt.OWN_BUNDLE_ID
            described = fmt.ShardInfo(
                info.file_size,
                info.uncompressed_size,
                info.record_count,
                info.codec,
                info.header_version,
                shard if info.header_index is None else info.header_index,
                reader.marker.bundle_id if own else info.header_id,
            )
            if own and self.adopt:  # ``seal`` stamps it as the new bundle's, at its number
                adopted.append(new)
                described = dataclasses.replace(
                    described,
                    header_version=fmt.FORMAT_VERSION,
                    header_index=None,
                    header_id=fmt.OWN_BUNDLE_ID,
                )
            index.put_shard(new, append=append, info=described)
        return adopted


def check_linked(reader: IndexReader, shard: int, src: str, dst: str) -> None:
    """The file linked is the one the bundle's index describes: a bundle replaced since its
    index was read (a pack --force) would otherwise give a bundle that cannot read."""
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
