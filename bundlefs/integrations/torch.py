"""PyTorch: map-style datasets over a bundle, and a sampler that shuffles while reading locally.

``BundleDataset`` serves files by glob pattern(s) or an explicit list (their bytes, or what a
``transform`` makes of them); ``BundleImageFolder`` is ``torchvision.datasets.ImageFolder`` with
the same attributes (``classes``, ``class_to_idx``, ``samples``, ``targets``…) over a directory of
a bundle; ``LocalitySampler`` visits the records that hold the files in random order and shuffles
the files within a window, so a cold epoch reads each record about once instead of once per file.

Each dataset opens its ``Bundle`` again, lazily, in every process that reads from it (a forked or
spawned data-loader worker), and pickles as the bundle's location (``Bundle.__reduce__``), so a
``DataLoader`` works under ``fork``, ``spawn`` and ``forkserver``. The only module that imports
torch (the ``torch`` extra); importing ``bundlefs`` never does. docs/pytorch.md is the user guide.

May import: ``bundlefs`` (the public face), ``bundlefs.errors``, ``bundlefs.read``; torch; PIL
lazily (in ``pil_loader``).
"""

from __future__ import annotations

import copy
import hashlib
import io
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO, Protocol

import torch
from torch.utils.data import Dataset, Sampler

from bundlefs import Bundle
from bundlefs.errors import EntryNotFound, IsADirectory

# What torchvision.datasets.folder.IMG_EXTENSIONS lists (compared lower-cased, as it does).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# Files per shuffling window. A window's files are read interleaved, so the records they touch
# are live at once: 1,024 files of ~100 KiB touch at most ~400 records (100 MiB), well inside a
# Bundle's default 256 MiB record cache (docs/pytorch.md, "Choosing the window").
DEFAULT_WINDOW = 1024

BundleSource = Bundle | str | os.PathLike[str]
Location = tuple[int, int]

_reopen_lock = threading.Lock()


def _fresh_lock_in_child() -> None:
    global _reopen_lock
    _reopen_lock = threading.Lock()  # a lock another thread held at fork() stays held in the child


os.register_at_fork(after_in_child=_fresh_lock_in_child)


# -- one Bundle per process ------------------------------------------------------------------------


class _BundleFiles:
    """A list of files of a bundle, and the bundle opened once in each process that reads them.

    The bundle is opened in the constructing process (listing needs it) and again, lazily, in any
    other process: a forked worker does not keep using its parent's LMDB environment, descriptors
    and record cache, and a spawned worker receives the bundle through ``Bundle.__reduce__`` (its
    location, options and ``bundle_id``: a bundle replaced since raises ``FormatError`` there).
    """

    paths: list[str]

    def __init__(self, bundle: BundleSource) -> None:
        if isinstance(bundle, Bundle):
            self._bundle, self._owned = bundle, False
        else:
            self._bundle, self._owned = Bundle(bundle), True
        self._pid = os.getpid()
        self._locations: list[Location] | None = None

    @property
    def bundle(self) -> Bundle:
        """The bundle, opened in this process."""
        if self._pid != os.getpid():
            with _reopen_lock:
                if self._pid != os.getpid():
                    # copy.copy goes through Bundle.__reduce__: open it again by location, with
                    # the same options, checking it is still the same bundle.
                    self._bundle = copy.copy(self._bundle)
                    self._owned = True
                    self._pid = os.getpid()
                    self._locations = None
        return self._bundle

    def read(self, index: int) -> bytes:
        """The bytes of file ``index`` (one whole-file read, checked by the file's CRC32C)."""
        return self.bundle.read(self.paths[index])

    def __len__(self) -> int:
        return len(self.paths)

    def locations(self) -> list[Location]:
        """Where each file's bytes live: ``(shard, offset of its first record)``, by index.

        What ``LocalitySampler`` groups by. A hard link resolves to the file it names; empty files
        live nowhere and get a location of their own each (``(-1, index)``).
        """
        if self._locations is None:
            bundle = self.bundle
            out: list[Location] = []
            for index, path in enumerate(self.paths):
                entry = bundle.resolve(path)
                if entry.size == 0:
                    out.append((-1, index))
                else:
                    # The record, not offset // record_size: large files start on a record
                    # boundary of their own, so records are not aligned to record_size.
                    out.append(
                        (entry.shard, bundle.content.record_at(entry.shard, entry.offset).offset)
                    )
            self._locations = out
        return self._locations

    def close(self) -> None:
        """Close the bundle if the dataset opened it (a ``Bundle`` you passed stays open)."""
        if self._owned and self._pid == os.getpid():
            self._bundle.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_locations"] = None  # the sampler's business, in the main process: not shipped
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # Unpickling opened the bundle in this process (Bundle.__reduce__).
        self._pid = os.getpid()
        self._owned = True


def _regular_files(bundle: Bundle, paths: Sequence[str]) -> list[str]:
    """``paths``, checked: each must name a regular file (symlinks followed)."""
    for path in paths:
        entry = bundle.resolve(path)  # EntryNotFound / NotADirectory
        if not entry.is_file:
            raise IsADirectory(f"{path!r} is a directory, not a file", path)
    return list(paths)


class BundleDataset(_BundleFiles, Dataset[Any]):
    """Files of a bundle as a map-style dataset: item ``i`` is ``transform(bytes of paths[i])``.

    ``pattern``: a shell pattern or a list of them (``*`` stays within a directory, ``**`` crosses
    any depth, as ``Bundle.glob``); the regular files matching any, sorted. ``paths``: an explicit
    list instead, kept in its order (each checked: ``EntryNotFound``, ``IsADirectory``). Neither:
    every regular file. ``transform`` takes the file's bytes; the path of item ``i`` is
    ``dataset.paths[i]`` (a subclass that needs both overrides ``__getitem__``, using ``read``).

    ``bundle`` is a path or an open ``Bundle`` (its options, such as ``cache_size``, carry over
    to the workers).
    """

    def __init__(
        self,
        bundle: BundleSource,
        pattern: str | Sequence[str] | None = None,
        *,
        paths: Sequence[str] | None = None,
        transform: Callable[[bytes], Any] | None = None,
    ) -> None:
        super().__init__(bundle)
        if paths is not None and pattern is not None:
            raise ValueError("give a pattern or a list of paths, not both")
        b = self.bundle
        if paths is not None:
            self.paths = _regular_files(b, [os.fsdecode(p) for p in paths])
        else:
            patterns = (
                ["**"] if pattern is None else [pattern] if isinstance(pattern, str) else pattern
            )
            found = {p for pat in patterns for p in b.glob(pat)}
            self.paths = sorted(p for p in found if b.isfile(p))
        self.transform = transform

    def __getitem__(self, index: int) -> Any:
        data = self.read(index)
        return data if self.transform is None else self.transform(data)


# -- ImageFolder -----------------------------------------------------------------------------------


def pil_loader(file: BinaryIO) -> Any:
    """torchvision's default loader, from an open file instead of a path: a PIL image in RGB."""
    try:
        from PIL import Image
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "BundleImageFolder's default loader needs Pillow: pip install pillow", name="PIL"
        ) from e
    with Image.open(file) as image:
        return image.convert("RGB")


def has_file_allowed_extension(filename: str, extensions: str | tuple[str, ...]) -> bool:
    """As torchvision: the name ends with one of ``extensions``, case-insensitively."""
    return filename.lower().endswith(
        extensions if isinstance(extensions, str) else tuple(extensions)
    )


class BundleImageFolder(_BundleFiles, Dataset[tuple[Any, int]]):
    """``torchvision.datasets.ImageFolder`` over the directory ``root`` of a bundle.

    Classes are ``root``'s subdirectories, sorted; a sample is every file below one (any depth,
    sorted) whose name has one of ``extensions`` (default ``IMG_EXTENSIONS``), or that
    ``is_valid_file(path)`` accepts. Same attributes as torchvision: ``root``, ``loader``,
    ``extensions``, ``classes``, ``class_to_idx``, ``samples``/``imgs`` (``(path, class_index)``,
    paths within the bundle), ``targets``, ``transform``, ``target_transform``; item ``i`` is
    ``(transform(loader(file)), target_transform(class_index))``.

    One difference: ``loader`` takes an open binary file (the file's bytes, read whole and checked,
    in a ``BytesIO`` whose ``name`` is the path) instead of a path, as ``PIL.Image.open`` and
    ``numpy.load`` do. The default ``pil_loader`` decodes to RGB.
    """

    def __init__(
        self,
        bundle: BundleSource,
        root: str = "",
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        loader: Callable[[BinaryIO], Any] = pil_loader,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
        *,
        extensions: tuple[str, ...] | None = IMG_EXTENSIONS,
    ) -> None:
        super().__init__(bundle)
        self.root = os.fsdecode(root).strip("/")
        self.transform = transform
        self.target_transform = target_transform
        self.loader = loader
        self.extensions = None if is_valid_file is not None else extensions
        self.classes, self.class_to_idx = self.find_classes(self.root)
        self.samples = self.make_dataset(
            self.root, self.class_to_idx, self.extensions, is_valid_file, allow_empty
        )
        self.imgs = self.samples
        self.targets = [target for _, target in self.samples]
        self.paths = [path for path, _ in self.samples]

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        """The class names (subdirectories of ``directory``, sorted) and their indexes."""
        classes = sorted(str(d.name) for d in self.bundle.scandir(directory) if d.is_dir())
        if not classes:
            raise EntryNotFound(
                f"no class directory in {directory or '/'!r} of {self.bundle.path}",
                directory or "/",
            )
        return classes, {name: i for i, name in enumerate(classes)}

    def make_dataset(
        self,
        directory: str,
        class_to_idx: dict[str, int],
        extensions: tuple[str, ...] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> list[tuple[str, int]]:
        """``(path, class_index)`` for every accepted file, class by class, as torchvision."""
        if (extensions is None) == (is_valid_file is None):
            raise ValueError("give exactly one of extensions and is_valid_file")
        accept: Callable[[str], bool]
        if is_valid_file is not None:
            accept = is_valid_file
        else:
            exts = tuple(extensions or ())
            accept = lambda path: has_file_allowed_extension(path, exts)  # noqa: E731
        bundle = self.bundle
        samples: list[tuple[str, int]] = []
        empty = []
        for name in sorted(class_to_idx):
            top = f"{directory}/{name}" if directory else name
            found = []
            # torchvision's order: directories sorted by path, then the names in each sorted.
            for where, _dirs, files in sorted(bundle.walk(top)):
                for file in sorted(files):
                    path = f"{where}/{file}"
                    if accept(path) and bundle.isfile(path):
                        found.append((path, class_to_idx[name]))
            if not found:
                empty.append(name)
            samples += found
        if empty and not allow_empty:
            raise EntryNotFound(
                f"no valid file for the classes {', '.join(empty)} in {directory or '/'!r} "
                f"of {bundle.path}",
                directory or "/",
            )
        return samples

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        path, target = self.samples[index]
        file = io.BytesIO(self.bundle.read(path))
        file.name = path
        sample = self.loader(file)
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target


# -- the sampler -----------------------------------------------------------------------------------


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
