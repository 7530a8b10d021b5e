"""Building the entries of a bundle from what an ``EntrySource`` delivers.

The builder assigns inode numbers breadth first with names in the source's (bytewise) order, as
docs/format.md §3.3 requires, which lets every index write be a sorted append and makes each
directory's children one contiguous inode range. It keeps the table of distinct (uid, gid) pairs,
gives later names of a multiply-linked file the inode of its first, attaches user data, records
each file's source ctime and inode when told the source is a directory on disk (``sources``,
format version 6) and counts what it built; file content goes to the ``ContentWriter``. It does
not know where entries come from. Memory holds the queue of directories still to list (up to
every directory of two adjacent levels of the tree), the owners table, one entry per
multiply-linked file seen and the directory totals (``DirectoryTotals``: 40 bytes per
directory): not the entries of the whole tree, but not bounded by a constant either.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``,
``bundlefs.packing.options``, ``bundlefs.packing.sources.base``, ``bundlefs.packing.content``.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat as statmod
from array import array
from collections import deque

from bundlefs.core import format as fmt
from bundlefs.core import integrity
from bundlefs.core.content_types import ContentTypeRules
from bundlefs.errors import PackError
from bundlefs.packing.content import ContentWriter
from bundlefs.packing.copied import CopiedFiles
from bundlefs.packing.options import PackProgress, UserData
from bundlefs.packing.sources.base import (
    CopiedRun,
    EntrySource,
    SourceErrors,
    SourceItem,
    Stat,
    StoredContent,
)
from bundlefs.storage.index_writer import IndexWriter


class DirectoryTotals:
    """The ``totals`` database (format version 5) of a tree built breadth first, in O(dirs) memory.

    Directories are added in inode order (breadth first, as the builder lists them), each with
    its parent's position and what its direct children add (``integrity.child_totals``; a child
    directory adds only itself then). ``write`` adds each directory's totals into its parent's,
    from the last directory back (a child's inode is above its parent's, so each is complete
    when it is added), and appends them in key order. Parallel arrays: 40 bytes per directory.
    """

    def __init__(self) -> None:
        self.inos = array("I")
        self.parents = array("I")  # the parent's position in these arrays (the root: its own)
        self.sums = [array("Q") for _ in range(4)]  # files, dirs, bytes, entries

    def add(self, ino: int, parent: int, direct: fmt.TreeTotals) -> int:
        """A directory and its direct children's share; its position, for its children."""
        position = len(self.inos)
        self.inos.append(ino)
        self.parents.append(parent if position else 0)
        for column, value in zip(self.sums, _columns(direct), strict=True):
            column.append(value)
        return position

    def write(self, index: IndexWriter) -> None:
        for position in range(len(self.inos) - 1, 0, -1):
            parent = self.parents[position]
            for column in self.sums:
                column[parent] += column[position]
        for position, ino in enumerate(self.inos):
            index.put_totals(ino, fmt.TreeTotals(*(column[position] for column in self.sums)))


def _columns(t: fmt.TreeTotals) -> tuple[int, int, int, int]:
    return t.files, t.dirs, t.bytes, t.entries


class EntryBuilder:
    """Puts one entry per source item into the index, breadth first from the root."""

    def __init__(
        self,
        source: EntrySource,
        content: ContentWriter,
        index: IndexWriter,
        errors: SourceErrors,
        progress: PackProgress,
        *,
        user_data: UserData | None = None,
        content_types: ContentTypeRules | None = None,
        record_sources: bool = False,
    ) -> None:
        self.source = source
        self.content = content
        self.index = index
        self.errors = errors
        self.progress = progress
        self.user_data = user_data
        self.content_rules = content_types  # None: store no content types
        # Whether each regular file's source stat (an os.stat_result: a directory on disk) is
        # recorded in ``sources`` (format version 6, for ``pack --base --check strict``).
        self.record_sources = record_sources
        self.content_types: dict[str, int] = {}  # media type -> index, in order of first use
        self.owners: dict[tuple[int, int], int] = {}
        self.hardlinks: dict[tuple[int, int], list] = {}  # (st_dev, st_ino) -> [entry, names]
        self.counts = integrity.TreeCounts()  # the config's count fields, as verify adds them
        self.totals = DirectoryTotals()
        self.next_ino = fmt.ROOT_INO + 1

    def build(self) -> None:
        """Every entry of the tree, then the link counts of multiply-linked files."""
        root_item = self.source.root()
        root = self._dir_entry(fmt.ROOT_INO, b"", root_item.st, fmt.ROOT_INO, b"")
        self.index.put_entry(root)
        self.counts.add(root)
        # (directory, its path, its parent's position in self.totals)
        queue: deque[tuple[fmt.Entry, bytes, int]] = deque([(root, b"", 0)])
        while queue:
            self._pack_directory(*queue.popleft(), queue)
        for entry, names in self.hardlinks.values():
            if names > 1:
                self.index.replace_entry(dataclasses.replace(entry, nlink=names))
        self.totals.write(self.index)

    def config(self, base: fmt.Config, shard_count: int) -> fmt.Config:
        """``base`` (the layout and creation time) with the counts of what was built."""
        return dataclasses.replace(
            base,
            shard_count=shard_count,
            owner_count=len(self.owners),
            entry_count=self.next_ino - 1,
            file_count=self.counts.files,
            dir_count=self.counts.dirs,
            symlink_count=self.counts.symlinks,
            hardlink_count=self.counts.hardlinks,
            data_bytes=self.counts.data_bytes,
            content_type_count=len(self.content_types),
        )

    # -- directories -------------------------------------------------------------------------------

    def _pack_directory(self, directory: fmt.Entry, rel: bytes, parent: int, queue: deque) -> None:
        first_child = self.next_ino
        subdirs = files = data_bytes = 0
        children: list[tuple[fmt.Entry, bytes]] = []  # its directories
        previous = b""
        for item in self.source.children(rel):
            run = item.run
            if run is None and item.reuse is not None:
                run = [(item.rel, item.name, item.st, item.reuse)]
            first = item.name if run is None else run[0][1]  # a run: its files in order
            if first <= previous:
                first_rel = item.rel if run is None else run[0][0]
                raise PackError(f"the source listed {os.fsdecode(first_rel)!r} out of name order")
            previous = item.name
            if run is not None:  # a delta pack's unchanged files
                added, added_bytes = self._copied_run(run, directory.ino)
                files += added
                data_bytes += added_bytes
                continue
            child = self._pack_child(item, directory.ino)
            if child is None:
                continue
            # What integrity.child_totals says each child adds (verify holds the result to it),
            # as plain counts: a TreeTotals per entry cost a pack of small files ~2 µs each.
            if child.is_dir:
                subdirs += 1
                children.append((child, item.rel))
            elif child.is_file and not child.is_link:
                files += 1
                data_bytes += child.size
        count = self.next_ino - first_child
        direct = fmt.TreeTotals(files, subdirs, data_bytes, count)
        position = self.totals.add(directory.ino, parent, direct)
        queue.extend((child, child_rel, position) for child, child_rel in children)
        final = dataclasses.replace(
            directory,
            size=count,
            first_child=first_child if count else 0,
            nlink=2 + subdirs,
        )
        self.index.replace_entry(final)
        self.progress.dirs += 1

    def _pack_child(self, item: SourceItem, parent: int) -> fmt.Entry | None:
        ino = self.next_ino
        if ino > fmt.MAX_ENTRIES:
            raise PackError("the tree has more entries than a bundle can hold (2^32 - 1)")
        kind = statmod.S_IFMT(item.st.st_mode)
        entry: fmt.Entry | None
        if kind == statmod.S_IFDIR:
            entry = self._dir_entry(ino, item.name, item.st, parent, item.rel)
        elif kind == statmod.S_IFLNK:
            entry = self._symlink_entry(ino, item)
        elif kind == statmod.S_IFREG:
            entry = self._file_entry(ino, item)
        elif kind in fmt.SPECIAL_KINDS:
            rdev = item.st.st_rdev if kind in fmt.DEVICE_KINDS else 0
            entry = fmt.Entry(
                ino=ino, size=0, name=item.name, rdev=rdev, **self._common(item.st, item.rel)
            )
        else:
            self.errors.skip(item.rel, "not a file type a bundle holds")
            return None
        if entry is None:
            return None
        self.index.put_entry(entry)
        self.counts.add(entry)
        self.next_ino += 1
        return entry

    # -- entries -----------------------------------------------------------------------------------

    def _copied_run(self, run: CopiedRun, parent: int) -> tuple[int, int]:
        """A delta pack's unchanged files (a ``SourceItem.run``, or one ``SourceItem.reuse``),
        each put as its base's entry value when that is what its entry would encode to: the
        same owner and content type indexes, no user data; in one loop, their values put a run
        at a time (``CopiedFiles``). The others packed as any file, their content ``stored`` at
        the base's place. Returns the files and bytes added."""
        types, owners, rules = self.content_types, self.owners, self.content_rules
        plain, ino, counts = self.user_data is None, self.next_ino, self.counts
        files, data_bytes = counts.files, counts.data_bytes  # before the run
        copied = CopiedFiles(self.index, self.record_sources, counts, self.progress)
        values, stats = copied.values, copied.stats
        for rel, name, st, (value, owner, content_type, media_type, _shard) in run:
            chosen = media_type
            if chosen is None and rules is not None:  # as _file_entry: by name
                chosen = rules.by_name(rel)
            new_type = fmt.NO_CONTENT_TYPE if chosen is None else types.get(chosen)
            new_owner = owners.get((st.st_uid, st.st_gid))
            if new_type is None or new_owner is None:  # a first use, which puts it in the index:
                copied.put(ino)  # after the files before it, as a put each would have been
                if new_type is None:
                    new_type = self._content_type_index(chosen)  # type: ignore[arg-type]
                if new_owner is None:
                    new_owner = self._owner(st)
            if new_type == content_type and new_owner == owner and plain and ino <= fmt.MAX_ENTRIES:
                values.append(value)
                stats.append(st)
                ino += 1
                continue
            copied.put(ino)
            old = fmt.decode_entry(ino, value)
            stored = StoredContent(
                old.shard, old.offset, old.size, old.crc32c, st, b"", media_type, digest=old.digest
            )
            self.next_ino = ino
            self._pack_child(SourceItem(rel, name, st, stored=stored), parent)  # counted there
            ino = self.next_ino
        copied.put(ino)
        self.next_ino = ino
        return counts.files - files, counts.data_bytes - data_bytes

    def _owner(self, st: Stat) -> int:
        """The owners table's index of ``st``'s (uid, gid), added in order of first use."""
        key = (st.st_uid, st.st_gid)
        owner = self.owners.get(key)
        if owner is None:
            owner = len(self.owners)
            if owner >= fmt.MAX_OWNERS:
                raise PackError("the tree has more distinct (uid, gid) pairs than a bundle holds")
            self.owners[key] = owner
            self.index.put_owner(owner, *key)
        return owner

    def _common(self, st: Stat, rel: bytes) -> dict:
        owner = self._owner(st)
        user_data = b""
        if self.user_data is not None:
            user_data = self.user_data(rel, st) or b""
            if len(user_data) > fmt.MAX_USER_DATA:
                raise PackError(
                    f"user data for {os.fsdecode(rel)} is over {fmt.MAX_USER_DATA} bytes"
                )
        return dict(
            mode=statmod.S_IFMT(st.st_mode) | statmod.S_IMODE(st.st_mode),
            owner=owner,
            mtime_ns=st.st_mtime_ns,
            user_data=user_data,
        )

    def _dir_entry(self, ino: int, name: bytes, st: Stat, parent: int, rel: bytes) -> fmt.Entry:
        # Placeholder: _pack_directory rewrites it (same length) once its children are known.
        return fmt.Entry(
            ino=ino,
            size=0,
            name=name,
            parent=parent,
            first_child=0,
            nlink=2,
            **self._common(st, rel),
        )

    def _symlink_entry(self, ino: int, item: SourceItem) -> fmt.Entry | None:
        rel = item.rel
        try:
            target = self.source.readlink(item)
        except OSError as e:
            self.errors.report(rel, e)
            return None
        if not 1 <= len(target) <= fmt.MAX_SYMLINK_TARGET:
            self.errors.report(rel, OSError(errno.ENAMETOOLONG, "symlink target too long"))
            return None
        return fmt.Entry(
            ino=ino, size=len(target), name=item.name, symlink=target, **self._common(item.st, rel)
        )

    def _file_entry(self, ino: int, item: SourceItem) -> fmt.Entry | None:
        st = item.st
        link_key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and link_key in self.hardlinks:
            first = self.hardlinks[link_key]
            first[1] += 1
            target: fmt.Entry = first[0]
            return fmt.Entry(
                ino=ino,
                mode=target.mode,
                owner=target.owner,
                mtime_ns=target.mtime_ns,
                size=target.size,
                name=item.name,
                flags=fmt.FLAG_LINK,
                target=target.ino,
            )
        stored = item.stored or self.content.store(item, self.source)
        if stored is None:
            return None
        st = stored.st
        flags = fmt.FLAG_NLINK if st.st_nlink > 1 else 0
        content_type = fmt.NO_CONTENT_TYPE
        media_type = stored.content_type
        if media_type is None and self.content_rules is not None:
            media_type = self.content_rules.choose(item.rel, stored.head)
        if media_type is not None:
            content_type = self._content_type_index(media_type)
        entry = fmt.Entry(
            ino=ino,
            size=stored.size,
            name=item.name,
            flags=flags,
            shard=stored.shard,
            offset=stored.offset,
            crc32c=stored.crc32c,
            nlink=1,
            content_type=content_type,
            digest=stored.digest,
            **self._common(st, item.rel),
        )
        if st.st_nlink > 1:
            self.hardlinks[link_key] = [entry, 1]
        self._record_source(ino, st)
        self.progress.files += 1
        return entry

    def _record_source(self, ino: int, st: Stat) -> None:
        """File ``ino``'s source ctime and inode number, as the stat its entry records gave them
        (no extra call: the walk's lstat, or the fstat before the file was read). Only a
        directory's stat has a ctime; the made-up status of an archive member, an object or a
        listed file has none, and records nothing."""
        ctime_ns = getattr(st, "st_ctime_ns", None)
        if self.record_sources and ctime_ns is not None:
            self.index.put_source(ino, ctime_ns, st.st_ino)

    def _content_type_index(self, media_type: str) -> int:
        index = self.content_types.get(media_type)
        if index is None:
            index = len(self.content_types)
            if index >= fmt.MAX_CONTENT_TYPES:
                raise PackError("the tree has more distinct content types than a bundle holds")
            self.index.put_content_type(index, media_type)
            self.content_types[media_type] = index
        return index
