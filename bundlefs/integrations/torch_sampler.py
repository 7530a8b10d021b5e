"""PyTorch: ``LocalitySampler``, which shuffles a dataset's indices while keeping reads local.

It visits the records that hold the files in random order and shuffles the files within a
window, so a cold epoch reads each record about once instead of once per file. It needs only
each file's location (``(shard, record offset)``), which the datasets of
``bundlefs.integrations.torch`` give (``locations()``); that module re-exports it, so
``from bundlefs.integrations.torch import LocalitySampler`` is the user's import
(docs/pytorch.md).

May import: torch.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from typing import Protocol

import torch
from torch.utils.data import Sampler

# Files per shuffling window. A window's files are read interleaved, so the records they touch
# are live at once: 1,024 files of ~100 KiB touch at most ~400 records (100 MiB), well inside a
# Bundle's default 256 MiB record cache (docs/pytorch.md, "Choosing the window").
DEFAULT_WINDOW = 1024

Location = tuple[int, int]  # (shard, offset of the file's first record)


class HasLocations(Protocol):
    def locations(self) -> Sequence[Location]: ...


def _seed_for(seed: int, epoch: int) -> int:
    # Hashed, so that (seed, epoch) pairs never collide as seed + epoch would ((0, 1) and (1, 0)).
    digest = hashlib.blake2b(f"bundlefs-locality:{seed}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


class LocalitySampler(Sampler[int]):
    """Shuffles a dataset's indices while keeping reads local: for ``DataLoader(sampler=...)``.

    Each epoch visits the records that hold the files in a random order, then shuffles the files
    within consecutive windows of ``window`` files. A window's records are all read while it is
    being served, so with a record cache that holds a window's records (the default does, for files
    up to ~250 KiB) a cold epoch reads each record about once (plus one split record per window
    boundary), where a plain random order reads one per file. The records come from the whole
    bundle in random order, so a window mixes files from ~``window / files-per-record`` places of
    the bundle (classes packed in separate directories are mixed).

    ``source``: a dataset with ``locations()`` (``BundleDataset``, ``BundleImageFolder``) or the
    locations themselves (``(shard, record)`` per index). The order is a function of ``(seed,
    epoch)`` (and the torch version); call ``set_epoch`` before each epoch, as with
    ``DistributedSampler``. ``shuffle=False`` gives pack order. With ``num_replicas``/``rank``
    (default: torch.distributed's when it is initialised, else one replica) each replica gets a
    contiguous slice of the epoch's order, so a record's files stay on one replica; as
    ``DistributedSampler``, the order is padded by repeating its start so that every replica gets
    ``len(self)`` indices, or with ``drop_last`` its tail is dropped.
    """

    def __init__(
        self,
        source: HasLocations | Sequence[Location],
        *,
        window: int = DEFAULT_WINDOW,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        if num_replicas is None or rank is None:
            dist = torch.distributed
            initialised = dist.is_available() and dist.is_initialized()
            if num_replicas is None:
                num_replicas = dist.get_world_size() if initialised else 1
            if rank is None:
                rank = dist.get_rank() if initialised else 0
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        locations = source if isinstance(source, Sequence) else source.locations()
        self.window = window
        self.seed = seed
        self.shuffle = shuffle
        self.num_replicas = num_replicas
        self.rank = rank
        self.drop_last = drop_last
        self.epoch = 0
        self._size = n = len(locations)
        # As DistributedSampler: pad to a multiple of the replicas, or drop the tail.
        self.num_samples = n // num_replicas if drop_last else math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas
        # Indices in pack order (by shard, then record; stable, so by index within a record) and
        # the group (record) of each position in that order.
        shards = torch.tensor([s for s, _ in locations], dtype=torch.int64)
        offsets = torch.tensor([o for _, o in locations], dtype=torch.int64)
        order = torch.argsort(offsets, stable=True)
        order = order[torch.argsort(shards[order], stable=True)]
        self._pack_order = order
        if n:
            s, o = shards[order], offsets[order]
            change = (s[1:] != s[:-1]) | (o[1:] != o[:-1])
            self._group = torch.cat([torch.zeros(1, dtype=torch.int64), change.cumsum(0)])
            self.records = int(self._group[-1]) + 1
        else:
            self._group = torch.zeros(0, dtype=torch.int64)
            self.records = 0

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` (call before iterating, every epoch)."""
        self.epoch = epoch

    def epoch_order(self) -> list[int]:
        """Every index once, in this epoch's order (all replicas, before padding)."""
        n = self._size
        if not self.shuffle or n == 0:
            return self._pack_order.tolist()
        g = torch.Generator().manual_seed(_seed_for(self.seed, self.epoch))
        # Records in a random order: a stable sort by each record's random rank keeps a record's
        # files together.
        rank_of_group = torch.randperm(self.records, generator=g)
        order = self._pack_order[torch.argsort(rank_of_group[self._group], stable=True)]
        # Files shuffled within each window: sort by (window number, random key).
        key = (torch.arange(n) // self.window) << 31
        key += torch.randint(0, 1 << 31, (n,), generator=g)
        return order[torch.argsort(key, stable=True)].tolist()

    def __iter__(self) -> Iterator[int]:
        order = self.epoch_order()
        if self.drop_last:
            order = order[: self.total_size]
        elif self.total_size > len(order):
            padding = self.total_size - len(order)
            order += (order * math.ceil(padding / len(order)))[:padding]
        start = self.rank * self.num_samples
        return iter(order[start : start + self.num_samples])

    def __len__(self) -> int:
        return self.num_samples
