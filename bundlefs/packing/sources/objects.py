"""An object-store prefix as a source of a bundle: ``ObjectSource``.

Every object below the prefix (``s3://bucket/some/prefix/``) becomes a regular file at its key
relative to the prefix; directories are implied by the keys ("/"-separated), and a zero-byte
"directory marker" (a key ending in "/") is a directory, not a file (an empty one if nothing is
below it). What each entry gets:

- a file: mode 0644, the owner given (by default the uid and gid of the packing process; on
  Dask, the driver's), mtime = the object's LastModified, size = the listing's; its content is
  read from the store when the builder stores it: small objects (up to ``_READ_AHEAD_MAX``)
  whole and up to ``_READ_AHEAD_FILES`` ahead on the pack's threads, larger ones streamed in
  bounded ranged GETs (``bundlefs.storage.objectstore.listing``). An object that changed size
  since it was listed is stored as read and reported in ``changed``, as a file that changed. On a
  base (``packing.delta``) an object is unchanged by its size and LastModified to the second
  (``mtime_tick``), and then never fetched;
- a directory (the root included): mode 0755, the same owner, mtime = the pack's creation time
  (deterministic, and the same in every partition of a distributed pack, which a time taken from
  the objects below a directory would not be);
- a name: the key's UTF-8 bytes. A key that cannot be a bundle path (``synthetic.name_problem``:
  an empty component, as "a//b" has, a "." or ".." component, a component over 255 bytes, a NUL)
  is refused in one sentence, or skipped with ``skip_errors``; so is a file whose name a
  directory also has (keys "a" and "a/b": the directory wins). ``excludes`` match as in a
  directory pack.

The listing is read once, when the builder asks for the root, into a tree in memory; nothing is
read twice. Memory: ~200 bytes plus the name per object (a dict slot, the name, and a tuple of
two ints), ~250 bytes plus the name per directory.

May import: ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.packing.sources`` (``base``,
``synthetic``).
"""

from __future__ import annotations

import errno
import logging
import os
import stat as statmod
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor

from bundlefs.errors import PackError
from bundlefs.packing.sources.base import (
    SECOND_MTIME,
    Content,
    MtimeTick,
    SourceErrors,
    SourceItem,
    Stat,
    excluded_below,
)
from bundlefs.packing.sources.synthetic import SyntheticStat, name_problem
from bundlefs.storage.location import Location
from bundlefs.storage.objectstore.listing import ObjectInfo, ObjectReader, ObjectStore

log = logging.getLogger(__name__)

FILE_MODE = statmod.S_IFREG | 0o644
DIR_MODE = statmod.S_IFDIR | 0o755
_READ_AHEAD_FILES = 64  # small objects fetched ahead of the builder, on the pack's threads
_READ_AHEAD_MAX = 1024 * 1024  # an object this small is fetched whole, in one GET


class _Dir:
    __slots__ = ("children", "marked")

    def __init__(self) -> None:
        # name -> _Dir, or (size, mtime_ns) for an object
        self.children: dict[bytes, _Dir | tuple[int, int]] = {}
        self.marked = False  # a directory marker object names it


class ObjectSource:
    """The tree the objects below ``location`` imply (``EntrySource``).

    ``objects``: the objects to pack instead of listing the store (a Dask partition's share of a
    listing the driver made); ``created_ns``: the mtime of every directory; ``pool``: threads
    that fetch small objects ahead of the builder.
    """

    # LastModified is whole seconds on S3 (the listing says milliseconds, always .000): a pack on
    # a base trusts an object's stat this far (``sources.base``).
    mtime_tick: MtimeTick = SECOND_MTIME

    def __init__(
        self,
        location: Location,
        errors: SourceErrors,
        *,
        created_ns: int,
        excludes: tuple[str, ...] = (),
        pool: Executor | None = None,
        owner: tuple[int, int] | None = None,
        objects: Iterable[ObjectInfo] | None = None,
    ) -> None:
        self.errors = errors  # shared with the pack: what is skipped is in its summary
        self.store = ObjectStore(location)
        self.url = location.url
        self._created_ns = created_ns
        self._excludes = excludes
        self._pool = pool
        self._uid, self._gid = owner if owner is not None else (os.getuid(), os.getgid())
        self._objects = objects
        self._root: _Dir | None = None

    # -- the listing -------------------------------------------------------------------------------

    def _load(self) -> _Dir:
        if self._root is not None:
            return self._root
        root = _Dir()
        listed = 0
        given = self._objects is not None
        objects = self._objects if self._objects is not None else self.store.list()
        for info in objects:
            listed += 1
            self._add(root, info)
        if not listed and not given:
            # Most likely a mistyped prefix: an object store has no "directory" to be empty.
            raise PackError(f"nothing to pack: there are no objects under {self.url}")
        self._root = root
        self._objects = None  # a partition's share: the tree holds it now
        return root

    def _add(self, root: _Dir, info: ObjectInfo) -> None:
        raw = info.key.encode("utf-8", "surrogateescape")
        marker = raw.endswith(b"/")
        parts = (raw[:-1] if marker else raw).split(b"/")
        why = name_problem(parts)
        if why is not None:
            self._refuse(raw, why)
            return
        if self._excludes and excluded_below(parts, self._excludes):
            return
        directory = root
        for i, part in enumerate(parts if marker else parts[:-1]):
            child = directory.children.get(part)
            if not isinstance(child, _Dir):
                if child is not None:
                    # "a" is listed before "a/…" (keys sort so): the directory wins.
                    self._refuse(
                        b"/".join(parts[: i + 1]), "a directory of that name holds other objects"
                    )
                child = directory.children[part] = _Dir()
            directory = child
        if marker:
            directory.marked = True
            return
        if isinstance(directory.children.get(parts[-1]), _Dir):
            self._refuse(raw, "a directory of that name holds other objects")
            return
        directory.children[parts[-1]] = (info.size, info.mtime_ns)

    def _refuse(self, key: bytes, why: str) -> None:
        """A key the bundle will not hold: ``PackError``, or with ``skip_errors`` a warning."""
        shown = os.fsdecode(key)
        if not self.errors.skip_errors:
            raise PackError(f"refusing the object {shown!r} under {self.url}: {why}")
        log.warning("skipping the object %r: %s", shown, why)
        self.errors.skipped.append(shown)

    def _dir(self, rel: bytes) -> _Dir:
        directory = self._load()
        for part in rel.split(b"/") if rel else ():
            child = directory.children[part]
            assert isinstance(child, _Dir)
            directory = child
        return directory

    def listing(self, rel: bytes) -> list[tuple[bytes, int, int, bool]]:
        """The directory ``rel``'s children in name order, each (name, size or -1 for a
        directory, mtime_ns, marked): the tree's shape, for the partition planner."""
        directory = self._dir(rel)
        out = []
        for name in sorted(directory.children):
            node = directory.children[name]
            if isinstance(node, _Dir):
                out.append((name, -1, 0, node.marked))
            else:
                out.append((name, node[0], node[1], False))
        return out

    # -- EntrySource -------------------------------------------------------------------------------

    def _dir_stat(self) -> SyntheticStat:
        return SyntheticStat(DIR_MODE, self._uid, self._gid, self._created_ns)

    def root(self) -> SourceItem:
        self._load()
        return SourceItem(b"", b"", self._dir_stat())

    def children(
        self, rel: bytes, read_if: Callable[[SourceItem], bool] | None = None
    ) -> Iterator[SourceItem]:
        """The children of ``rel``; small objects fetched ahead, those ``read_if`` accepts when
        given (a pack on a base fetches none it takes from the base)."""
        items = []
        for name, size, mtime_ns, _marked in self.listing(rel):
            child_rel = rel + b"/" + name if rel else name
            if size < 0:
                st = self._dir_stat()
            else:
                st = SyntheticStat(FILE_MODE, self._uid, self._gid, mtime_ns, size)
            items.append(SourceItem(child_rel, name, st))
        yield from self._read_ahead(items, read_if)

    def _read_ahead(
        self, items: list[SourceItem], read_if: Callable[[SourceItem], bool] | None
    ) -> Iterator[SourceItem]:
        """``items`` in order, small objects among them fetched whole up to _READ_AHEAD_FILES
        ahead on the pool (the requests overlap; the order stays the same)."""
        if self._pool is None:
            yield from items
            return
        pending: deque = deque()
        for item in items:
            small = statmod.S_ISREG(item.st.st_mode) and item.st.st_size <= _READ_AHEAD_MAX
            small = small and (read_if is None or read_if(item))
            pending.append((item, self._pool.submit(self._fetch, item) if small else None))
            if len(pending) >= _READ_AHEAD_FILES:
                yield _fetched(*pending.popleft())
        while pending:
            yield _fetched(*pending.popleft())

    def _fetch(self, item: SourceItem) -> bytes | None:
        """The whole object, or None: the builder opens it again and reports what fails."""
        try:
            return self.store.read(item.rel.decode("utf-8", "surrogateescape"))
        except OSError:
            return None

    def readlink(self, item: SourceItem) -> bytes:
        raise OSError(errno.EINVAL, "an object store holds no symbolic links")

    def open(self, item: SourceItem) -> Content:
        key = item.rel.decode("utf-8", "surrogateescape")
        return _ObjectContent(self.store.open(key), item.st)


def _fetched(item: SourceItem, future) -> SourceItem:
    if future is not None:
        data = future.result()
        if data is not None:
            # The listing's status before and after: a size that differs from the bytes
            # fetched is how the content writer sees that the object changed.
            item.data, item.before, item.after = data, item.st, item.st
    return item


class _ObjectContent:
    """``Content`` of one object: its listing status, its bytes streamed from the store."""

    __slots__ = ("_reader", "_st")

    def __init__(self, reader: ObjectReader, st: Stat) -> None:
        self._reader = reader
        self._st = st

    def stat(self) -> Stat:
        return self._st

    def read(self, size: int) -> bytes:
        return self._reader.read(size)

    def close(self) -> None:
        self._reader.close()
