"""PyTorch: map-style datasets over a bundle, and a sampler that shuffles while reading locally.

``BundleDataset`` serves files by glob pattern(s) or an explicit list (their bytes, or what a
``transform`` makes of them); ``BundleImageFolder`` is ``torchvision.datasets.ImageFolder`` with
the same attributes (``classes``, ``class_to_idx``, ``samples``, ``targets``…) over a directory of
a bundle; ``LocalitySampler`` (``bundlefs.integrations.torch_sampler``, importable from here too)
visits the records that hold the files in random order and shuffles the files within a window,
so a cold epoch reads each record about once instead of once per file. The streaming
``BundleIterableDataset`` (``bundlefs.integrations.torch_iterable``) is importable from here too.

Each dataset opens its ``Bundle`` again, lazily, in every process that reads from it (a forked or
spawned data-loader worker), and pickles as the bundle's location (``Bundle.__reduce__``), so a
``DataLoader`` works under ``fork``, ``spawn`` and ``forkserver``. With ``torch_sampler`` and
``torch_iterable``, the only modules that import torch (the ``torch`` extra); importing
``bundlefs`` never does.
docs/pytorch.md is the user guide.

May import: ``bundlefs`` (the public face), ``bundlefs.errors``, ``bundlefs.read``,
``bundlefs.integrations.torch_sampler``, ``bundlefs.integrations.torch_iterable``; torch; PIL
lazily (in ``pil_loader``).
"""

from __future__ import annotations

import copy
import io
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from torch.utils.data import Dataset

from bundlefs import Bundle
from bundlefs.errors import EntryNotFound, IsADirectory, NotARegularFile

# The streaming dataset and the sampler are modules of their own; their names are this module's
# too (the user's one import).
from bundlefs.integrations.torch_iterable import BundleIterableDataset as BundleIterableDataset
from bundlefs.integrations.torch_sampler import DEFAULT_WINDOW as DEFAULT_WINDOW
from bundlefs.integrations.torch_sampler import HasLocations as HasLocations
from bundlefs.integrations.torch_sampler import LocalitySampler as LocalitySampler
from bundlefs.integrations.torch_sampler import Location

# What torchvision.datasets.folder.IMG_EXTENSIONS lists (compared lower-cased, as it does).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

BundleSource = Bundle | str | os.PathLike[str]

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
        if entry.is_special:  # a FIFO, socket or device (format version 4): no content
            raise NotARegularFile(f"{path!r} is not a regular file", path)
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
