"""A pack on a base bundle from a source that stores its own content (a ``StreamingSource``: tar
and zip archives, read once in archive order, and ``--files-from``): ``DeltaSink``, and
``on_base``, which puts any source of ``pack`` on a base.

Such a source hands each regular member to its ``ContentSink`` (``store_stream``) with its path,
its status, how fine its mtime is (``tick``) and, if it can, a way to read it again
(``again``). ``DeltaSink`` looks the path up in OLD (``OldPaths``) and applies ``delta``'s rules:

- no regular file there, or another size: stored by the ``ContentWriter``, as in any pack;
- unchanged by its stat (``Base.trusted``: the same size and mtime, the mtime settled before
  OLD's racy window by at least a tick of the source's; a zip's DOS time never is): OLD's bytes,
  and the member's bytes are never read (tarfile skips them, a zip member is never opened);
- else compared with OLD's digest (or bytes) before anything is stored: a member up to
  ``COMPARE_WHOLE`` is taken whole, compared, then stored or not; a larger one is compared as it
  is read and, if it differs, read ``again`` (a zip member, a listed file) or, from a stream that
  cannot be read twice (a tar), taken back from a spool file it was copied into while it was
  compared (an unlinked temporary file in the bundle's work directory, never part of it). So a
  member whose content is OLD's stores nothing, whatever its size or source.

Counts go to ``Base.reuse`` as a directory walk's do. ``--dedup`` works as ever: what is stored
goes through the ``ContentWriter``. Memory: the names of the OLD directories members were
recently looked up in (``OldPaths``, at most ``NAMES_HELD`` names) and one member up to
``COMPARE_WHOLE`` bytes.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.packing``
below it (``sources``, ``compare``, ``delta``).
"""

from __future__ import annotations

import functools
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

from bundlefs.core import format as fmt
from bundlefs.errors import BundleError, PackError
from bundlefs.packing.compare import same_bytes, same_chunks
from bundlefs.packing.delta import DeltaSource
from bundlefs.packing.delta_base import EMPTY_DIGEST, Base
from bundlefs.packing.sources.base import (
    EXACT_MTIME,
    READ_CHUNK,
    ContentSink,
    EntrySource,
    MtimeTick,
    ReadAgain,
    Stat,
    StoredContent,
    StreamingSource,
)
from bundlefs.packing.sources.directory import DirectorySource
from bundlefs.packing.sources.objects import ObjectSource
from bundlefs.storage.index import IndexReader

COMPARE_WHOLE = 1024 * 1024  # a member this small is compared whole, before it is stored
NAMES_HELD = 1_000_000  # names of OLD's directories held for lookups (~120 bytes each)


def on_base(
    source: EntrySource, base: Base, content: ContentSink, work: str
) -> tuple[EntrySource, ContentSink]:
    """``source`` and the sink its content goes to, packed on ``base``: a walked source inside a
    ``DeltaSource``, a streaming source with a ``DeltaSink``; ``PackError`` for any other."""
    if isinstance(source, DirectorySource | ObjectSource):
        return DeltaSource(source, base), content
    if isinstance(source, StreamingSource):
        return source, DeltaSink(content, base, work)
    raise PackError(
        "a pack on a base (--base) needs a directory, archives, an object-store prefix or "
        "--files-from as SRC"
    )


class OldPaths:
    """OLD's regular files by path, for members that come in their source's order rather than
    the tree's: each directory's names (name -> inode) held once read, least recently used
    dropped first beyond ``held`` names (members of one directory mostly come together)."""

    def __init__(self, reader: IndexReader, held: int = NAMES_HELD) -> None:
        self.reader = reader
        self.held = held
        self._names: OrderedDict[bytes, dict[bytes, int]] = OrderedDict()
        self._count = 0

    def file(self, rel: bytes) -> fmt.Entry | None:
        """OLD's regular file at ``rel`` (a later name of a hard link resolved), or None."""
        parent, _, name = rel.rpartition(b"/")
        names = self._directory(parent)
        ino = None if names is None else names.get(name)
        if ino is None:
            return None
        entry = self.reader.entry(ino)
        if entry.is_link:
            entry = self.reader.entry(entry.target)
        return entry if entry.is_file else None

    def _directory(self, rel: bytes) -> dict[bytes, int] | None:
        """The names in OLD's directory ``rel``, or None if OLD has no directory there."""
        names = self._names.get(rel)
        if names is not None:
            self._names.move_to_end(rel)
            return names
        if rel:
            parent, _, name = rel.rpartition(b"/")
            above = self._directory(parent)
            ino = None if above is None else above.get(name)
            if ino is None:
                return None
            directory = self.reader.entry(ino)
        else:
            directory = self.reader.entry(fmt.ROOT_INO)
        if not directory.is_dir:
            return None
        listed = self.reader.iter_names(directory.first_child, directory.size)
        names = {child: ino for ino, child in listed}
        self._names[rel] = names
        self._count += len(names)
        while self._count > self.held and len(self._names) > 1:
            _, dropped = self._names.popitem(last=False)
            self._count -= len(dropped)
        return names


class DeltaSink:
    """The ``ContentSink`` of a streaming source packed on ``base``: members OLD holds unchanged
    take OLD's bytes, the others go to ``content`` (module docstring)."""

    def __init__(self, content: ContentSink, base: Base, work: str) -> None:
        self.content = content
        self.base = base
        self.work = work  # where a spool file goes
        self.paths = OldPaths(base.reader)

    def store_stream(
        self,
        rel: bytes,
        chunks: Iterable[bytes],
        st: Stat,
        *,
        tick: MtimeTick = EXACT_MTIME,
        again: ReadAgain | None = None,
    ) -> StoredContent:
        base, counts = self.base, self.base.reuse
        entry = self.paths.file(rel)
        size = st.st_size
        if not size:
            return self._empty(rel, chunks, st, entry)
        if entry is None or entry.size != size:
            return self._stored(rel, chunks, st)
        if base.trusted(entry, st, tick):
            counts.reused_files += 1
            counts.reused_bytes += size
            return base.reused(entry, st)
        if size <= COMPARE_WHOLE:
            data = b"".join(chunks)
            if self._compared(same_bytes, entry, data):
                return self._same(entry, st)
            return self._stored(rel, [data], st)
        if again is not None:
            if self._compared(same_chunks, entry, chunks):
                return self._same(entry, st)
            return self._stored(rel, again(), st)
        return self._spooled(rel, chunks, st, entry)

    def _spooled(
        self, rel: bytes, chunks: Iterable[bytes], st: Stat, entry: fmt.Entry
    ) -> StoredContent:
        """A large member of a stream read once: copied to a spool file as it is compared,
        stored from there if it differs."""
        with tempfile.TemporaryFile(dir=self.work) as spool:
            teed = _tee(chunks, spool.write)
            same = self._compared(same_chunks, entry, teed)
            for _chunk in teed:  # the rest of the member, past the first difference
                pass
            if same:
                return self._same(entry, st)
            spool.seek(0)
            return self._stored(rel, iter(functools.partial(spool.read, READ_CHUNK), b""), st)

    def _compared(self, compare: Callable[..., bool], entry: fmt.Entry, member: object) -> bool:
        """Whether ``member`` (its bytes, or their chunks) is OLD's content of ``entry``, by
        ``compare.same_bytes`` or ``same_chunks``; False where OLD's bytes are damaged (the member
        is stored anew; ``verify`` of OLD reports the damage). A failure to read SRC is the
        pack's."""
        base = self.base
        try:
            return compare(base.shards, base.reader, base.reuse, entry, member)
        except PackError:
            raise
        except BundleError:
            return False

    def _same(self, entry: fmt.Entry, st: Stat) -> StoredContent:
        counts = self.base.reuse
        counts.same_files += 1
        counts.same_bytes += entry.size
        return self.base.reused(entry, st)

    def _stored(self, rel: bytes, chunks: Iterable[bytes], st: Stat) -> StoredContent:
        counts = self.base.reuse
        counts.stored_files += 1
        counts.stored_bytes += st.st_size
        return self.content.store_stream(rel, chunks, st)

    def _empty(
        self, rel: bytes, chunks: Iterable[bytes], st: Stat, entry: fmt.Entry | None
    ) -> StoredContent:
        """An empty member needs no shard (a ``ContentWriter`` would open one); one that grew
        since its status was taken is stored as read."""
        data = b"".join(chunks)
        if data:
            return self._stored(rel, [data], st)
        self.base.reuse.stored_files += entry is None
        return StoredContent(0, 0, 0, 0, st, b"", digest=EMPTY_DIGEST)


def _tee(chunks: Iterable[bytes], write: Callable[[bytes], object]) -> Iterator[bytes]:
    """``chunks``, each also given to ``write`` as it passes."""
    for chunk in chunks:
        write(chunk)
        yield chunk
