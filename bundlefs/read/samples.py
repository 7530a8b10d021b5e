"""Samples: the files of one training example grouped, streamed in stored order (``iter_samples``).

A sample is a run of consecutive files, in the order ``iter_files`` streams them, that share a
key. ``key`` says how a path splits into (key, name):

- ``"stem"`` (WebDataset's convention): the path up to the first dot of its last component is
  the key, the rest the name: ``a/0001.jpg`` and ``a/0001.cls`` are the sample ``a/0001`` with
  the members ``jpg`` and ``cls`` (a name without a dot: member ``""``);
- ``"dir"``: a directory's files are one sample, keyed by the directory's path (``""`` at the
  root), each member named by its file name;
- a callable ``path -> (key, name)``.

Grouping streams with memory for one sample: a sample is complete when the key changes. It relies
on a sample's files lying next to each other in stored order, which a directory pack guarantees
(each directory's files are stored together, sorted by name, so names sharing a stem or a
directory are adjacent) and an archive pack keeps from the archive (WebDataset's tar shards are
written so). Files of one key that are not adjacent (a hard link's second name, which comes right
after its first; an archive that interleaves samples) come as separate samples of the same key.

``StreamMethods`` gives ``Bundle`` (read/bundle.py) its streaming methods, ``iter_files``
(read/stream.py) and ``iter_samples``.

May import: ``bundlefs.read.tree``, ``bundlefs.read.content``, ``bundlefs.read.paths``,
``bundlefs.read.stream``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, overload

from bundlefs.read import stream
from bundlefs.read.content import ContentReader
from bundlefs.read.paths import BundleStat
from bundlefs.read.stream import OnError, Part, Shards, StoredFiles
from bundlefs.read.tree import TreeModel

KeyFunction = Callable[[str], tuple[str, str]]
Key = Literal["stem", "dir"] | KeyFunction
Sample = tuple[str, dict[str, bytes]]
SampleWithStats = tuple[str, dict[str, bytes], dict[str, BundleStat]]


def stem_key(path: str) -> tuple[str, str]:
    """WebDataset's split at the first dot of the last component: (``a/0001``, ``jpg``) for
    ``a/0001.jpg``, (``a/x``, ``tar.gz``) for ``a/x.tar.gz``, (``a/x``, ``""``) for ``a/x``."""
    dot = path.find(".", path.rfind("/") + 1)
    if dot < 0:
        return path, ""
    return path[:dot], path[dot + 1 :]


def dir_key(path: str) -> tuple[str, str]:
    """The directory convention: (``a/b``, ``x.jpg``) for ``a/b/x.jpg``, (``""``, ``x``) for
    ``x``."""
    slash = path.rfind("/")
    if slash < 0:
        return "", path
    return path[:slash], path[slash + 1 :]


def key_function(key: Key) -> KeyFunction:
    """The (key, name) split ``key`` names; ``ValueError`` for anything else."""
    if key == "stem":
        return stem_key
    if key == "dir":
        return dir_key
    if callable(key):
        return key
    raise ValueError(f"key must be 'stem', 'dir' or a callable, not {key!r}")


def iter_samples(
    tree: TreeModel,
    content: ContentReader,
    key: Key = "stem",
    shards: Shards = None,
    with_stat: bool = False,
    on_error: OnError = "raise",
    part: Part = None,
    stored: StoredFiles | None = None,
) -> Iterator[Any]:
    """(key, {name: bytes}) of every sample in stored order, or (key, {name: bytes}, {name:
    stat}) ``with_stat``. ``shards``, ``on_error``: as ``iter_files`` (a damaged member is left
    out of its sample); ``part=(index, count)``: as ``iter_files``, each boundary moved forward
    to the next sample's first file, so every sample lies in exactly one part. ``stored``: the
    index scan made already (``stream.stored_names``)."""
    split = key_function(key)
    wanted = stream.shard_filter(content, shards)  # said at the call, as iter_files does
    stream.check_on_error(on_error)
    stream.check_part(part)

    def same(a: str, b: str) -> bool:
        return split(a)[0] == split(b)[0]

    names = stream.stored_names(tree, wanted, part, same, stored)
    files = stream.read_names(tree, content, names, with_stat, on_error)
    return _grouped_with_stats(files, split) if with_stat else _grouped(files, split)


def _duplicate(key: str, name: str, path: str) -> ValueError:
    return ValueError(f"{path!r} is a second member {name!r} of the sample {key!r}")


def _grouped(files: Iterable[tuple[str, bytes]], split: KeyFunction) -> Iterator[Sample]:
    current: str | None = None
    members: dict[str, bytes] = {}
    for path, data in files:
        key, name = split(path)
        if key != current:
            if current is not None:
                yield current, members
            current, members = key, {}
        elif name in members:
            raise _duplicate(key, name, path)
        members[name] = data
    if current is not None:
        yield current, members


def _grouped_with_stats(
    files: Iterable[tuple[str, BundleStat, bytes]], split: KeyFunction
) -> Iterator[SampleWithStats]:
    current: str | None = None
    members: dict[str, bytes] = {}
    stats: dict[str, BundleStat] = {}
    for path, stat, data in files:
        key, name = split(path)
        if key != current:
            if current is not None:
                yield current, members, stats
            current, members, stats = key, {}, {}
        elif name in members:
            raise _duplicate(key, name, path)
        members[name] = data
        stats[name] = stat
    if current is not None:
        yield current, members, stats


class StreamMethods:
    """``Bundle``'s streaming methods, ``iter_files`` and ``iter_samples``, for a class that has
    ``_tree`` and ``_content``."""

    __slots__ = ()
    _tree: TreeModel
    _content: ContentReader

    @overload
    def iter_files(
        self,
        *,
        shards: Shards = None,
        with_stat: Literal[False] = False,
        on_error: OnError = "raise",
        part: Part = None,
    ) -> Iterator[tuple[str, bytes]]: ...
    @overload
    def iter_files(
        self,
        *,
        shards: Shards = None,
        with_stat: Literal[True],
        on_error: OnError = "raise",
        part: Part = None,
    ) -> Iterator[tuple[str, BundleStat, bytes]]: ...
    @overload
    def iter_files(
        self,
        *,
        shards: Shards = None,
        with_stat: bool = False,
        on_error: OnError = "raise",
        part: Part = None,
    ) -> Iterator[Any]: ...
    def iter_files(
        self,
        *,
        shards: Shards = None,
        with_stat: bool = False,
        on_error: OnError = "raise",
        part: Part = None,
    ) -> Iterator[Any]:
        """Each regular file's (path, bytes) or (path, stat, bytes), in stored order (stream.py)."""
        return stream.iter_files(self._tree, self._content, shards, with_stat, on_error, part)

    @overload
    def iter_samples(
        self,
        key: Key = "stem",
        *,
        shards: Shards = None,
        with_stat: Literal[False] = False,
        on_error: OnError = "raise",
        part: Part = None,
    ) -> Iterator[Sample]: ...
    @overload
    def iter_samples(
        self,
        key: Key = "stem",
        *,
        shards: Shards = None,
        with_stat: Literal[True],
        on_error: OnError = "raise",
        part: Part = None,
    ) -> Iterator[SampleWithStats]: ...
    @overload
    def iter_samples(
        self,
        key: Key = "stem",
        *,
        shards: Shards = None,
        with_stat: bool = False,
        on_error: OnError = "raise",
        part: Part = None,
    ) -> Iterator[Any]: ...
    def iter_samples(
        self,
        key: Key = "stem",
        *,
        shards: Shards = None,
        with_stat: bool = False,
        on_error: OnError = "raise",
        part: Part = None,
    ) -> Iterator[Any]:
        """Each sample's (key, {name: bytes}), or (key, {name: bytes}, {name: stat})
        ``with_stat`` (``stat.content_type`` each member's type), in stored order."""
        return iter_samples(self._tree, self._content, key, shards, with_stat, on_error, part)
