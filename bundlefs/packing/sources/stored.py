"""Layers of trees already stored in bundles, as one ``EntrySource``: ``StoredSource``.

Each layer is a stored bundle's tree (its index), placed at a prefix of the new tree or at its
root; the source delivers their union, and every file arrives with its ``stored`` content
pointing into the layer's shards, renumbered by ``shard_base`` (``bundlefs.packing.reuse`` links
those shards and imports their table with the same numbers). The builder then numbers inodes
exactly as a pack of the union tree would, which is how a merge, and a distributed pack merged from
its partitions, end identical to a pack on one machine; a delta pack is a base layer with an
overlay.

Name clashes: directories present in several layers merge (their attributes are the last
layer's, or with ``on_clash="first"`` the first's); any other name present in several layers is an
error, unless ``on_clash`` says which layer wins ("last" or "first"), the way a later layer of an
overlay file system hides an earlier one. Memory: the directories of about two levels of the tree
(those given to the builder and not yet listed), like the builder's own queue, and the names a
clash overrode (``overridden``); the inputs' mapped index pages are taken out of the resident set
every ``UNMAP_EVERY`` entries listed.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``,
``bundlefs.packing.sources.base``.
"""

from __future__ import annotations

import heapq
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.errors import PackError
from bundlefs.packing.sources.base import Content, SourceErrors, SourceItem, StoredContent
from bundlefs.storage.index import IndexReader

CLASH_RULES = ("error", "last", "first")
UNMAP_EVERY = 1 << 16  # input entries listed between two ``IndexReader.unmap_pages``


@dataclass(slots=True)
class StoredStat:
    """What the builder reads of a stored entry (the ``Stat`` protocol), with what the entry
    carries that a stat result does not (its symlink target and user data)."""

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


class StoredSource:
    """The union of the stored trees ``readers`` (layers, in order; ``prefixes``: where each
    goes) as an ``EntrySource`` whose files are already stored, their shards numbered from
    ``shard_base`` (one per layer). ``overridden`` lists the names a layer lost to a clash.
    ``shared``: shards below it are a base bundle's that every layer holds at the same numbers
    (the tasks of a distributed pack on a base): they keep their numbers, and ``shared_used``
    collects those a file uses.

    The builder lists directories breadth first; each directory it was given is remembered (as
    the layers it merges) until the builder lists it.
    """

    def __init__(
        self,
        readers: list[IndexReader],
        shard_base: list[int],
        prefixes: list[tuple[bytes, ...]],
        on_clash: str,
        errors: SourceErrors,
        shared: int = 0,
    ) -> None:
        self.readers = readers
        self.shard_base = shard_base
        self.shared = shared
        self.shared_used: set[int] = set()
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
        self._listed = 0  # input entries listed since the inputs' pages were last unmapped

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
        return item.st.symlink  # type: ignore[attr-defined]  # a StoredStat

    def open(self, item: SourceItem) -> Content:  # pragma: no cover - every file arrives stored
        raise AssertionError("a stored file is never read")

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
            self._listed += 1
            if self._listed == UNMAP_EVERY:
                # Every input entry is read once: the inputs' index pages leave the resident set
                # as the listing goes (a large directory's too), as verify's do.
                for each in self.readers:
                    each.unmap_pages()
                self._listed = 0

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

    def _dir_stat(self, layers: list[_Layer]) -> StoredStat:
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

    def _stat(self, number: int, entry: fmt.Entry) -> StoredStat:
        uid, gid = self.readers[number].owners[entry.owner]
        return StoredStat(
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
            shard = entry.shard
            if shard >= self.shared:
                shard += self.shard_base[number]
            elif entry.size:
                self.shared_used.add(shard)
            stored = StoredContent(
                shard=shard,
                offset=entry.offset,
                size=entry.size,
                crc32c=entry.crc32c,
                st=st,
                head=b"",
                content_type=reader.content_type(entry),
                digest=entry.digest,  # kept, never recomputed: none from a version < 5 input
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
