"""``diff``: what changed between two bundles, from their indexes alone (no shard is read).

Both trees are walked together, depth first, names in byte order: a directory's children are one
sorted inode range in each index (docs/format.md §3.3), so each pair of directories is a merge
join of two cursor scans, O(entries) in all, holding one frame per level of depth (two cursors
and a chunk of values each), never the set of paths. A file whose value is the same bytes in both
indexes outside its location (``fmt.location_span``) is settled without being decoded; anything
else is decoded and compared field by field.

What a change is (``Change.status``), as ``git diff --name-status`` says it: ``A`` added, ``D``
removed, ``M`` content changed (a file's bytes, a symlink's target), ``m`` metadata only (mode,
owner, mtime, user data, content type, device number), ``T`` type changed, ``R`` renamed (a
removed and an added file, size > 0, whose content is the same and the only such pair, as git's
exact-rename detection pairs them). A directory added or removed is one line, then one for each
path below it. Hard links are not compared as such: each name compares the file it names.

Content identity is ``same_content``; a rename's candidates are grouped by size and CRC32C, and
by digest as well when both bundles are of version 5 (two removed files of one size and CRC but
other digests each find their own). Renames need the whole walk before any pairing, so with
``renames`` the changes are held (memory grows with the number of changes, never with the
entries) and come out in tree order at the end; without, they stream as they are found.

May import: ``bundlefs.core``, ``bundlefs.storage``, ``bundlefs.read`` (options, assemble).
"""

from __future__ import annotations

import os
import stat as statmod
from collections.abc import Generator, Iterable, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.read.assemble import store_timeout
from bundlefs.read.options import ReadOptions
from bundlefs.storage.index import IndexReader
from bundlefs.storage.location import parse_location
from bundlefs.storage.objectstore import index_fetch

KIND_NAMES = {
    statmod.S_IFREG: "file",
    statmod.S_IFDIR: "dir",
    statmod.S_IFLNK: "symlink",
    statmod.S_IFIFO: "fifo",
    statmod.S_IFSOCK: "socket",
    statmod.S_IFCHR: "char",
    statmod.S_IFBLK: "block",
}
CONTENT_FIELDS = ("content", "target")  # what makes a change M rather than m
_FILE_BYTE, _DIR_BYTE = fmt.KIND_FILE >> 8, fmt.KIND_DIR >> 8  # a value's first byte, kind bits


@dataclass(frozen=True, slots=True)
class Change:
    """One changed path. ``kind``: the new entry's (the old one's for ``D``); ``changed``: what
    differs (``content``, ``target``, ``mode``, ``owner``, ``mtime``, ``user_data``,
    ``content_type``, ``rdev``; ``type`` for ``T``); ``old_path``: an ``R``'s old path."""

    status: str
    path: bytes
    kind: str
    changed: tuple[str, ...] = ()
    old_path: bytes | None = None

    def to_dict(self) -> dict[str, object]:
        """``diff --json``'s object; a path that is not UTF-8 as ``os.fsdecode`` gives it."""
        facts: dict[str, object] = {
            "status": self.status,
            "path": os.fsdecode(self.path),
            "kind": self.kind,
            "changed": list(self.changed),
        }
        if self.old_path is not None:
            facts["old_path"] = os.fsdecode(self.old_path)
        return facts


def digest_of(entry: fmt.Entry) -> bytes:
    """A file's strong digest (format version 5), or b"" where the entry has none (an older
    version's, or a file a merge took from one)."""
    return entry.digest


def same_content(a: fmt.Entry, b: fmt.Entry, shared: Mapping[int, int] | None = None) -> bool:
    """Whether file entries ``a`` (old) and ``b`` (new) hold the same bytes, from the indexes.

    Certain when the size differs, when both are empty, and when both lie at the same offset of
    one shard file (``shared`` maps an old shard to the new shard that is the same file: same
    header bundle id and index). Otherwise: the digests when both entries have one, else size and
    CRC32C, which cannot see a change that keeps both (2⁻³² per same-size pair).
    """
    if a.size != b.size:
        return False
    if a.size == 0 or (shared and shared.get(a.shard) == b.shard and a.offset == b.offset):
        return True
    da, db = digest_of(a), digest_of(b)
    if da and db:
        return da == db
    return a.crc32c == b.crc32c


def shared_shards(old: IndexReader, new: IndexReader) -> dict[int, int]:
    """Old shard → new shard, for the shard files both bundles name (a merge's or a base's,
    linked): the same header (bundle id, index, version) and the same sizes in both tables."""

    def identities(index: IndexReader) -> dict[tuple[object, ...], int]:
        found: dict[tuple[object, ...], int] = {}
        for shard in range(index.config.shard_count):
            info = index.shard_info(shard)
            own = info.header_id == fmt.OWN_BUNDLE_ID
            header_id = index.marker.bundle_id if own else info.header_id
            header_index = shard if info.header_index is None else info.header_index
            key = (header_id, header_index, info.header_version, info.file_size)
            found[key + (info.uncompressed_size, info.record_count)] = shard
        return found

    theirs = identities(new)
    return {shard: theirs[key] for key, shard in identities(old).items() if key in theirs}


class _Side:
    """One bundle's index as the walk reads it."""

    def __init__(self, index: IndexReader) -> None:
        self.index = index
        self.version = index.marker.format_version

    def resolve(self, ino: int, value: bytes) -> tuple[bytes, fmt.Entry]:
        """(name, entry) of a child: a hard link's entry is its target's."""
        entry = self.index.decode(ino, value)
        if entry.is_link:
            return entry.name, self.index.entry(entry.target)
        return entry.name, entry

    def children(self, directory: fmt.Entry) -> Iterator[tuple[int, bytes]]:
        return self.index.iter_raw(directory.first_child, directory.size)


# What a frame of the walk yields: a change (with the file entry a rename may pair) or a frame
# below it, which the walk runs to its end before the rest of this one.
_Found = tuple[Change, fmt.Entry | None]
_Frame = Iterator[Any]  # _Found or _Frame


def _one_extends(a: list, b: list) -> bool:
    return a[: len(b)] == b[: len(a)]


def _join(prefix: bytes, name: bytes) -> bytes:
    return prefix + b"/" + name if prefix else name


class _Walk:
    """Both trees together; ``changes`` yields every difference in tree order."""

    def __init__(self, old: IndexReader, new: IndexReader) -> None:
        self.old, self.new = _Side(old), _Side(new)
        self.shared = shared_shards(old, new)
        # Both of version 5: a rename is paired by digest (a file without one, merged from an
        # older bundle, by size and CRC32C among those without), else by size and CRC32C.
        self.digests = self.old.version >= 5 and self.new.version >= 5
        # Equal bytes mean equal fields in one layout family, where an owner or content type
        # index names the same in both tables (one may extend the other: a new pack appends).
        self.fast = (
            (self.old.version >= 3) == (self.new.version >= 3)
            and _one_extends(old.owners, new.owners)
            and _one_extends(old.content_types, new.content_types)
        )

    def changes(self) -> Iterator[_Found]:
        a, b = self.old.index.entry(fmt.ROOT_INO), self.new.index.entry(fmt.ROOT_INO)
        stack: list[_Frame] = [self._both(b".", a, b, b"")]
        while stack:
            item = next(stack[-1], None)
            if item is None:
                stack.pop()
            elif isinstance(item, tuple):
                yield item
            else:
                stack.append(item)

    def _pair(self, prefix: bytes, a_dir: fmt.Entry, b_dir: fmt.Entry) -> _Frame:
        """The merge join of two directories' children."""
        old, new = self.old, self.new
        ov, nv, fast, span_of = old.version, new.version, self.fast, fmt.location_span(old.version)
        a_it, b_it = old.children(a_dir), new.children(b_dir)
        a, b = next(a_it, None), next(b_it, None)
        while a is not None and b is not None:
            va, vb = a[1], b[1]
            if fast:
                if va == vb:  # the same bytes: the same entry, unless it names other inodes
                    same = va[0] & 0xF0 != _DIR_BYTE and not va[2] & fmt.FLAG_LINK
                else:  # files the same but for where their bytes lie
                    span = span_of(va)
                    same = (
                        span is not None
                        and va[span[1] :] == vb[span[1] :]
                        and va[: span[0]] == vb[: span[0]]
                    )
                if same:
                    a, b = next(a_it, None), next(b_it, None)
                    continue
            na, nb = fmt.entry_name(va, ov), fmt.entry_name(vb, nv)
            if na == nb:
                (_, ea), (_, eb) = old.resolve(*a), new.resolve(*b)
                yield from self._both(_join(prefix, na), ea, eb, na)
                a, b = next(a_it, None), next(b_it, None)
            elif na < nb:
                yield from self._one(prefix, old, a, "D")
                a = next(a_it, None)
            else:
                yield from self._one(prefix, new, b, "A")
                b = next(b_it, None)
        for rest, it, side, status in ((a, a_it, old, "D"), (b, b_it, new, "A")):
            while rest is not None:
                yield from self._one(prefix, side, rest, status)
                rest = next(it, None)

    def _both(self, path: bytes, a: fmt.Entry, b: fmt.Entry, name: bytes) -> _Frame:
        """A path in both trees: its change, then what lies below it."""
        if a.kind != b.kind:
            yield Change("T", path, KIND_NAMES.get(b.kind, "other"), ("type",)), None
            if a.is_dir:
                yield self._only(path if name else b"", self.old, a, "D")
            if b.is_dir:
                yield self._only(path if name else b"", self.new, b, "A")
            return
        fields = self.fields(a, b, content=True)
        if fields:
            status = "M" if fields[0] in CONTENT_FIELDS else "m"
            yield Change(status, path, KIND_NAMES.get(b.kind, "other"), fields), None
        if a.is_dir:
            yield self._pair(path if name else b"", a, b)

    def _one(self, prefix: bytes, side: _Side, child: tuple[int, bytes], status: str) -> _Frame:
        """A path in one tree only, and everything below it."""
        name, entry = side.resolve(*child)
        path = _join(prefix, name)
        candidate = entry if entry.is_file and entry.size > 0 else None
        yield Change(status, path, KIND_NAMES.get(entry.kind, "other")), candidate
        if entry.is_dir:
            yield self._only(path, side, entry, status)

    def _only(self, prefix: bytes, side: _Side, directory: fmt.Entry, status: str) -> _Frame:
        for child in side.children(directory):
            yield from self._one(prefix, side, child, status)

    def fields(self, a: fmt.Entry, b: fmt.Entry, *, content: bool) -> tuple[str, ...]:
        """What differs between two entries of one kind (their content too, if ``content``)."""
        found = []
        if content and a.is_file and not same_content(a, b, self.shared):
            found.append("content")
        elif content and a.is_symlink and a.symlink != b.symlink:
            found.append("target")
        old, new = self.old.index, self.new.index
        if a.mode != b.mode:
            found.append("mode")
        if old.owners[a.owner] != new.owners[b.owner]:
            found.append("owner")
        if a.mtime_ns != b.mtime_ns:
            found.append("mtime")
        if a.user_data != b.user_data:
            found.append("user_data")
        if a.is_file and old.content_type(a) != new.content_type(b):
            found.append("content_type")
        if a.rdev != b.rdev:
            found.append("rdev")
        return tuple(found)

    def with_renames(self, found: Iterable[_Found]) -> Iterator[Change]:
        """The changes in tree order, a removed and an added file of the same content, each the
        only one of its identity (size, CRC32C and, between version-5 bundles, digest), made one
        ``R`` (at the added path's place)."""
        changes: list[Change | None] = []
        held: dict[int, fmt.Entry] = {}  # the candidates' entries, by position
        removed: dict[tuple[int, int, bytes], list[int]] = {}
        added: dict[tuple[int, int, bytes], list[int]] = {}
        for change, entry in found:
            if entry is not None:
                where = removed if change.status == "D" else added
                identity = (entry.size, entry.crc32c, digest_of(entry) if self.digests else b"")
                where.setdefault(identity, []).append(len(changes))
                held[len(changes)] = entry
            changes.append(change)
        for identity, gone in removed.items():
            came = added.get(identity, ())
            if len(gone) != 1 or len(came) != 1:
                continue
            i, j = gone[0], came[0]
            before, after = changes[i], changes[j]
            assert before is not None and after is not None
            if same_content(held[i], held[j], self.shared):
                fields = self.fields(held[i], held[j], content=False)
                changes[j] = Change("R", after.path, "file", fields, before.path)
                changes[i] = None
        return (change for change in changes if change is not None)


def open_index(path: str | os.PathLike, options: ReadOptions) -> IndexReader:
    """A bundle's index alone, local or at a URL (fetched into the disk cache, nothing else:
    from version 6 a sparse copy, its pages fetched as the walk reaches them)."""
    location = parse_location(os.fsdecode(os.fspath(path)), options.remote.storage_options)
    if location.is_local:
        return IndexReader(location.path, check_checksum=options.check_index)
    return index_fetch.open_index(
        location,
        options.remote.disk_cache,
        check=options.check_index,
        timeout=store_timeout(options),
    )


def diff(
    old: str | os.PathLike,
    new: str | os.PathLike,
    *,
    renames: bool = True,
    options: ReadOptions | None = None,
) -> Generator[Change, None, None]:
    """The differences from bundle ``old`` to bundle ``new``, in tree order (depth first, names
    in byte order), from their indexes alone: no shard is opened. Each may be a directory or a
    URL (only its marker and index are fetched). ``renames``: pair removed and added files into
    ``R`` (the changes are then held until the walk ends); without, they stream."""
    options = options or ReadOptions()
    with closing(open_index(old, options)) as a, closing(open_index(new, options)) as b:
        walk = _Walk(a, b)
        if renames:
            yield from walk.with_renames(walk.changes())
        else:
            yield from (change for change, _ in walk.changes())
