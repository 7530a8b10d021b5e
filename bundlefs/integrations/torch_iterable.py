"""PyTorch: ``BundleIterableDataset``, a bundle streamed in stored order, split by worker and rank.

Each ``DataLoader`` worker of each rank streams one contiguous part of the stored order
(``part=`` of ``iter_files``/``iter_samples``): the parts are equal in files to one (a boundary
moves forward to the next sample's start, so a sample lies in one part whole), so every file or
sample comes exactly once per epoch across all ranks and workers, and each record is read and
decompressed by one worker, once. An optional shuffle buffer mixes the items within a window,
seeded by ``(seed, epoch, part)``: ``set_epoch`` gives a reproducible order per epoch.

The dataset opens the bundle once where it is made, to scan the index for the stored order (24
bytes a file, which forked workers inherit instead of scanning again: one scan per rank, not one
per worker), and closes it; it holds the location, options and ``bundle_id``, never an open
``Bundle``. Each process that iterates (a worker, after the fork or the spawn) opens its own,
once, and keeps it for later epochs of a persistent worker. Only this module, ``torch`` and
``torch_sampler`` import torch; ``bundlefs.integrations.torch`` re-exports the dataset (the
user's one import). docs/pytorch.md is the user guide.

May import: ``bundlefs`` (the public face), ``bundlefs.read``; torch.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from bundlefs import Bundle
from bundlefs.read.options import ReadOptions
from bundlefs.read.samples import Key, iter_samples, key_function
from bundlefs.read.stream import (
    OnError,
    Shards,
    StoredFiles,
    check_on_error,
    read_names,
    shard_filter,
    stored_names,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from bundlefs.read.options import ReadKeywords


def world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world size): as given, else torch.distributed's when it is initialised, else the
    environment's ``RANK``/``WORLD_SIZE`` (torchrun sets them), else (0, 1)."""
    dist = torch.distributed
    initialised = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if initialised else int(os.environ.get("WORLD_SIZE", 1))
    if rank is None:
        rank = dist.get_rank() if initialised else int(os.environ.get("RANK", 0))
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    return rank, world_size


def shuffled(items: Iterable[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """``items`` mixed through a buffer of ``size``: each yield is a random one of the buffer's
    items, replaced by the next (WebDataset's ``shuffle(size)``); the rest shuffled at the end."""
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        i = rng.randrange(size)
        yield buffer[i]
        buffer[i] = item
    rng.shuffle(buffer)
    yield from buffer


class BundleIterableDataset(IterableDataset[Any]):
    """A bundle's files (``samples=False``: ``(path, bytes)``) or samples (``samples=True``:
    ``(key, {name: bytes})``, grouped by ``key`` as ``Bundle.iter_samples``) in stored order,
    each DataLoader worker of each rank streaming its own contiguous part (docs/pytorch.md).

    ``bundle``: a path, a URL (``s3://…``) or an open ``Bundle`` (its location, options and
    ``bundle_id`` are taken; it is not pickled, and stays open). ``shards``, ``with_stat``,
    ``on_error``: as ``iter_files``.
    ``shuffle_buffer``: items mixed within a window of that many (0: stored order); the order is
    a function of ``seed``, the epoch (``set_epoch``) and the split. ``rank``/``world_size``: as
    given, else torch.distributed's when initialised (when the dataset is made), else the
    environment's ``RANK``/``WORLD_SIZE``, else one rank. ``transform`` is applied to each item
    in the worker, after the shuffle. Read options (``cache_size``, ``storage_options``…) are
    ``Bundle``'s keywords.
    """

    def __init__(
        self,
        bundle: Bundle | str | os.PathLike[str],
        *,
        samples: bool = False,
        key: Key = "stem",
        shards: Shards = None,
        with_stat: bool = False,
        on_error: OnError = "raise",
        shuffle_buffer: int = 0,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        options: ReadOptions | None = None,
        **keywords: Unpack[ReadKeywords],
    ) -> None:
        super().__init__()
        if shuffle_buffer < 0:
            raise ValueError("shuffle_buffer must be 0 or more")
        key_function(key)  # ValueError now, not in a worker
        check_on_error(on_error)
        if isinstance(bundle, Bundle) and (options is not None or keywords):
            raise ValueError("read options go with a location: an open Bundle keeps its own")
        b = bundle if isinstance(bundle, Bundle) else Bundle(bundle, options=options, **keywords)
        try:
            # How each process opens it: as unpickling does (by location, with the options, and
            # FormatError if another bundle replaced it since the plan below was made).
            self._reopen: tuple[Callable[..., Bundle], tuple[Any, ...]] = b.__reduce__()
            self.location: str = self._reopen[1][0]
            self.options: ReadOptions = self._reopen[1][2]
            # The index scan, once, here (24 bytes a file): forked workers inherit it and each
            # reads only its part of it; a spawned worker scans again.
            self._plan: StoredFiles | None = StoredFiles(b.tree, shard_filter(b.content, shards))
            self._plan.order()
        finally:
            if b is not bundle:
                b.close()
        self.samples, self.key, self.shards = samples, key, shards
        self.with_stat, self.on_error = with_stat, on_error
        self.shuffle_buffer, self.seed, self.epoch = shuffle_buffer, seed, 0
        self.rank, self.world_size = world(rank, world_size)
        self.transform = transform
        self._opened: tuple[int, Bundle] | None = None  # (pid, the bundle it opened)

    def set_epoch(self, epoch: int) -> None:
        """Use the shuffle of ``epoch`` (call before iterating, every epoch; a persistent worker
        keeps the epoch it was started with)."""
        self.epoch = epoch

    @property
    def bundle(self) -> Bundle:
        """The bundle, opened in this process (once; a forked copy opens its own)."""
        if self._opened is None or self._opened[0] != os.getpid():
            self._opened = (os.getpid(), self._reopen[0](*self._reopen[1]))
        return self._opened[1]

    def part(self) -> tuple[int, int]:
        """(index, count) of the part this process streams: rank-major, then the worker."""
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return self.rank * workers + worker, self.world_size * workers

    def __iter__(self) -> Iterator[Any]:
        part = self.part()
        b = self.bundle
        if self._plan is None:  # unpickled (a spawned worker): scan here, once
            self._plan = StoredFiles(b.tree, shard_filter(b.content, self.shards))
        items: Iterable[Any]
        if self.samples:
            items = iter_samples(
                b.tree, b.content, self.key, None, self.with_stat, self.on_error, part, self._plan
            )
        else:
            names = stored_names(b.tree, None, part, None, self._plan)
            items = read_names(b.tree, b.content, names, self.with_stat, self.on_error)
        if self.shuffle_buffer:
            # A str seed is hashed with SHA-512: the same order in every process and run.
            rng = random.Random(f"bundlefs/{self.seed}/{self.epoch}/{part[0]}/{part[1]}")
            items = shuffled(items, self.shuffle_buffer, rng)
        if self.transform is not None:
            items = map(self.transform, items)
        return iter(items)

    def close(self) -> None:
        """Close the bundle this process opened, if any (iterating again opens it again)."""
        if self._opened is not None and self._opened[0] == os.getpid():
            self._opened[1].close()
        self._opened = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_opened"] = None  # never shipped: each process opens its own
        state["_plan"] = None  # 24 bytes a file: a spawned worker scans for itself
        return state
