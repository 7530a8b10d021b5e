"""``Writer``: a bundle built from Python, one entry at a time (docs/python.md).

    with bundlefs.Writer("out.bundle", compression="zstd", created_ns=0) as w:
        w.add("train/0001.jpg", data, mtime=1700000000, user_data=b'{"label": 3}')
        w.add_file("labels.txt", "/data/labels.txt")
        w.add_dir("empty")
        w.add_symlink("latest", "train")

The bundle is ``pack``'s, made by the packer's own parts: each file's content goes into the shards
as it is added (``ContentWriter``; content is stored in add order, which need not be the tree's),
its entry into an ``AddedTree`` (a temporary table in the staging directory), and ``close`` has
the ``EntryBuilder`` number every entry breadth first with names sorted, as in any pack, seals the
bundle and moves it into place or uploads it (``destination.building``): atomically, and nothing
is published if the ``with`` body raises or ``abort`` is called. The same adds in the same order
with the same options (``created_ns`` fixed) give byte-identical bundles.

Memory does not grow with the data added: content is in the shards once added, names in the
table's file behind a fixed page cache.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.packing``
below it (``options``, ``sources``, ``content``, ``builder``, ``destination``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat as statmod
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, Unpack

from bundlefs.core import format as fmt
from bundlefs.core.content_types import ContentTypeRules
from bundlefs.errors import IndexWriteError, InvalidEntryError, PackError
from bundlefs.packing.builder import EntryBuilder
from bundlefs.packing.content import ContentWriter
from bundlefs.packing.destination import building, check_destination
from bundlefs.packing.options import (
    PackOptions,
    PackProgress,
    PackSummary,
    check_options,
    parse_compression,
)
from bundlefs.packing.sources.added import (
    AddedStat,
    AddedTree,
    Attributes,
    check_data,
    content_chunks,
    entry_stat,
    split_path,
)
from bundlefs.packing.sources.base import SourceErrors, Stat, StoredContent
from bundlefs.packing.sources.synthetic import DIR_MODE
from bundlefs.storage import publish
from bundlefs.storage.index_writer import IndexWriter

PathArg = str | bytes | os.PathLike[str] | os.PathLike[bytes]
Data = bytes | bytearray | memoryview | BinaryIO  # or any object with read(size) -> bytes

# PackOptions that choose what of a source to pack: the Writer packs exactly what is added.
_NOT_FOR_WRITER = {"excludes": (), "skip_errors": False, "files_from": None}
_TABLE = ".writer-entries.sqlite"  # in the staging directory; removed before the bundle is sealed


class _Abandoned(Exception):
    """Thrown into the staging context to discard the bundle being built."""


def writer_options(options: PackOptions | None, fields: Mapping[str, Any]) -> PackOptions:
    """``options`` (default ``PackOptions()``) with ``fields`` replacing its fields (``meta`` and
    ``content_types`` may be mappings), unchecked; ``TypeError`` for a field ``PackOptions`` lacks,
    ``PackError`` for one the Writer has no use for."""
    names = {f.name for f in dataclasses.fields(PackOptions)}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise TypeError(f"Writer() got an unexpected keyword argument {unknown[0]!r}")
    given = dict(fields)
    for name in ("meta", "content_types"):
        if isinstance(given.get(name), Mapping):
            given[name] = tuple(given[name].items())
    merged = dataclasses.replace(options or PackOptions(), **given)
    for name, default in _NOT_FOR_WRITER.items():
        if getattr(merged, name) != default:
            raise PackError(f"a Writer takes no {name} option: it packs exactly what is added")
    return merged


class Writer:
    """A new bundle at ``dest`` (a directory, or a URL as ``pack`` takes it), built from what is
    added; published by ``close`` (or leaving its ``with`` block), discarded by ``abort`` (or an
    exception leaving the block). Options are ``PackOptions``' fields, as keywords or as
    ``options`` (keywords override its fields). One add at a time (adds from several threads are
    serialised). Module docstring; docs/python.md."""

    def __init__(
        self, dest: str | os.PathLike[str], options: PackOptions | None = None, **fields: Any
    ) -> None:
        self.options = check_options(writer_options(options, fields))
        self.summary: PackSummary | None = None  # set by close
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._failed: str | None = None  # why an add left the bundle unusable
        self._done = False
        self._pool: ThreadPoolExecutor | None = None
        self._index: IndexWriter | None = None
        self._content: ContentWriter | None = None
        self._tree: AddedTree | None = None
        location, remote = check_destination(None, os.fspath(dest), self.options)
        compression, level = parse_compression(self.options.compression)
        created = self.options.created_ns
        assert created is not None  # check_options fixed it
        self._config = fmt.Config(
            block_size=self.options.block_size,
            record_size=self.options.record_size,
            compression=fmt.COMPRESSION_NAMES[compression],
            created_ns=created,
        )
        # What an entry gets when the add does not say: this process's owner, the creation time.
        self._defaults = AddedStat(DIR_MODE, os.getuid(), os.getgid(), created)
        self._plain: dict[tuple[int, int], AddedStat] = {}  # (kind, mode) -> stat of defaults
        o = self.options
        self._rules = (
            ContentTypeRules(o.content_types, detect=o.detect_content_types)
            if o.detect_content_types or o.content_types
            else None
        )
        self._staging = building(
            location,
            remote,
            force=o.force,
            staging=o.staging,
            what=f"cannot write {os.fspath(dest)}",
        )
        self._staged = self._staging.__enter__()
        self.dest = self._staged.dest
        try:
            self._open(level)
        except BaseException as e:
            self._leave(e)
            raise

    def _open(self, level: int | None) -> None:
        work = self._staged.work
        self._pool = ThreadPoolExecutor(self.options.jobs) if self.options.jobs > 1 else None
        self._index = IndexWriter(os.path.join(work, fmt.INDEX_DIR))
        self._progress = PackProgress()
        self._errors = SourceErrors(skip_errors=False)
        self._content = ContentWriter(
            work,
            self._config,
            self._index,
            self._errors,
            self._progress,
            shard_size=self.options.shard_size,
            pool=self._pool,
            level=level,
            dedup=self.options.dedup,  # contents added whole or of a known size up to 1 MiB
        )
        self._tree = AddedTree(os.path.join(work, _TABLE), self._defaults)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- adding ------------------------------------------------------------------------------------

    def add(
        self,
        path: PathArg,
        data: Data,
        *,
        mode: int = 0o644,
        content_type: str | None = None,
        **attributes: Unpack[Attributes],
    ) -> None:
        """A regular file at ``path`` holding ``data``: bytes, or a binary file object read to
        its end. ``content_type``: default detected as ``pack`` detects it (``""``: none);
        ``attributes``: ``mtime`` or ``mtime_ns``, ``uid``, ``gid``, ``user_data``
        (``sources.added.Attributes``). A bad path or value raises ``InvalidEntryError``, a path
        added before ``DuplicatePathError``, before anything is stored."""
        rel, parts = split_path(path)
        st = self._stat(statmod.S_IFREG, mode, attributes)
        check_data(data)
        if content_type:
            try:
                fmt.encode_content_type(content_type)
            except fmt.FormatError as e:
                raise InvalidEntryError(f"cannot add {os.fsdecode(rel)!r}: {e}") from None
        with self._adding() as tree:
            slot = tree.slot(rel, parts)
            stored = self._store(rel, data)
            if content_type is None and self._rules is not None:
                content_type = self._rules.choose(rel, stored.head)
            tree.put_file(slot, st, stored, content_type or None)

    def add_file(
        self,
        path: PathArg,
        source: PathArg | BinaryIO,
        *,
        mode: int | None = None,
        content_type: str | None = None,
        **attributes: Unpack[Attributes],
    ) -> None:
        """A regular file at ``path`` with the content of ``source``: a file on disk (whose
        mode, owner and mtime are taken too, as ``pack`` records them, unless given) or a binary
        file object (as ``add``)."""
        if not isinstance(source, str | bytes | os.PathLike):
            mode = 0o644 if mode is None else mode
            self.add(path, source, mode=mode, content_type=content_type, **attributes)
            return
        with open(source, "rb") as f:
            st = os.fstat(f.fileno())
            if not statmod.S_ISREG(st.st_mode):
                raise PackError(f"{os.fsdecode(source)} is not a regular file")
            mode = statmod.S_IMODE(st.st_mode) if mode is None else mode
            found = Attributes(mtime_ns=st.st_mtime_ns, uid=st.st_uid, gid=st.st_gid)
            if "mtime" in attributes:
                del found["mtime_ns"]
            self.add(path, f, mode=mode, content_type=content_type, **(found | attributes))

    def add_dir(
        self, path: PathArg, *, mode: int = 0o755, **attributes: Unpack[Attributes]
    ) -> None:
        """A directory at ``path`` (an empty one stays in the bundle); one implied by paths
        added before takes these attributes instead of the defaults (mode 0755)."""
        rel, parts = split_path(path)
        st = self._stat(statmod.S_IFDIR, mode, attributes)
        with self._adding() as tree:
            tree.put_dir(tree.slot(rel, parts, directory=True), st)

    def add_symlink(self, path: PathArg, target: PathArg, **attributes: Unpack[Attributes]) -> None:
        """A symbolic link at ``path`` to ``target``, stored as given (never followed)."""
        rel, parts = split_path(path)
        link = os.fsencode(target)
        if not 1 <= len(link) <= fmt.MAX_SYMLINK_TARGET or b"\0" in link:
            raise InvalidEntryError(
                f"cannot add {os.fsdecode(rel)!r}: a symlink target is 1 to "
                f"{fmt.MAX_SYMLINK_TARGET} bytes without a NUL"
            )
        st = self._stat(statmod.S_IFLNK, 0o777, attributes)
        with self._adding() as tree:
            tree.put_symlink(tree.slot(rel, parts), dataclasses.replace(st, target=link))

    def _stat(self, kind: int, mode: int, attributes: Attributes) -> AddedStat:
        """``entry_stat`` with the Writer's defaults; one made of defaults only is kept and
        reused (most adds give a mode at most)."""
        if attributes:
            return entry_stat(kind, mode, attributes, self._defaults)
        st = self._plain.get((kind, mode))
        if st is None:
            st = self._plain[(kind, mode)] = entry_stat(kind, mode, attributes, self._defaults)
        return st

    @contextlib.contextmanager
    def _adding(self) -> Iterator[AddedTree]:
        """One add, alone: a failure other than a refusal (``InvalidEntryError``, raised before
        anything changes) leaves the Writer failed."""
        with self._lock:
            tree = self._usable()
            try:
                yield tree
            except InvalidEntryError:
                raise
            except BaseException as e:
                self._failed = str(e) or type(e).__name__
                raise

    def _usable(self) -> AddedTree:
        if self._failed is not None:
            raise PackError(f"the Writer failed earlier ({self._failed}); nothing is published")
        if self._done or self._tree is None:
            raise PackError("the Writer is closed")
        return self._tree

    def _store(self, rel: bytes, data: Data) -> StoredContent:
        """``data`` read into the shards; a failure of the bundle's own (a full disk) is a
        ``PackError``."""
        assert self._content is not None
        try:
            chunks, size = content_chunks(rel, data, self._config.large_file_threshold)
            guess = self._config.large_file_threshold + 1 if size is None else size
            st = AddedStat(statmod.S_IFREG, 0, 0, 0, guess)
            return self._content.store_stream(rel, chunks, st, sized=size is not None)
        except IndexWriteError as e:
            raise PackError(f"cannot write the index of {self.dest}: {e.reason}") from e
        except OSError as e:
            raise PackError(f"cannot write the bundle {self.dest}: {e.strerror or e}") from e

    # -- the end -----------------------------------------------------------------------------------

    def close(self) -> PackSummary:
        """Build the index, seal the bundle and publish it; the summary (``pack``'s). A second
        call returns it again. Raises ``PackError`` (nothing published) if it cannot."""
        with self._lock:
            if self.summary is not None:
                return self.summary
            if self._done:
                raise PackError("the Writer is closed")
            self._done = True
            if self._failed is not None:
                self._leave(_Abandoned())
                raise PackError(f"the Writer failed earlier ({self._failed}); nothing is published")
            try:
                summary = self._build()
            except BaseException as e:
                self._leave(e)
                raise
            self._staging.__exit__(None, None, None)  # publish (the stage cleans up if it fails)
            self.summary = summary
            return summary

    def abort(self) -> None:
        """Discard the bundle: nothing is published, the staging directory is removed. Idempotent;
        after ``close`` it does nothing."""
        with self._lock:
            if self.summary is not None or self._done:
                return
            self._done = True
            self._leave(_Abandoned())

    def _build(self) -> PackSummary:
        assert self._tree is not None and self._content is not None and self._index is not None
        builder = EntryBuilder(
            self._tree,
            self._content,
            self._index,
            self._errors,
            self._progress,
            user_data=self._user_data_of,
        )
        builder.build()  # content types were chosen when the files were added
        self._tree.close()
        self._index.put_meta(dict(self.options.meta))
        shards = self._content.finish()
        config = builder.config(self._config, len(shards))
        self._index.put_config(config)
        index, self._index = self._index, None
        index.close()
        if self._pool is not None:
            self._pool.shutdown()
        marker = publish.seal(self._staged.work, len(shards))
        stored = sum(s.file_size for s in shards)
        seconds = time.monotonic() - self._started
        return PackSummary(self.dest, config, stored, marker.index_size, seconds)

    def _user_data_of(self, rel: bytes, st: Stat) -> bytes | None:
        given = getattr(st, "user_data", None)
        if given is not None or self.options.user_data is None:
            return given
        return self.options.user_data(rel, st)

    def _leave(self, error: BaseException) -> None:
        """Release what is open and leave the staging context with ``error``: the directory is
        removed; a failure of the bundle's own is raised as ``PackError`` (``building``)."""
        if self._content is not None:
            self._content.abort()
        if self._index is not None:
            with contextlib.suppress(IndexWriteError):
                self._index.abort()
        if self._tree is not None:
            self._tree.close()
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        self._staging.__exit__(type(error), error, error.__traceback__)
