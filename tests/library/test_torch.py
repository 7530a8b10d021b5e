"""PyTorch: the datasets and the locality sampler, through a real ``DataLoader`` (fork and spawn).

Bundles are packed with small records so a few hundred small files span many records. Everything
is seeded; nothing is timed.
"""

from __future__ import annotations

import io
import math
import os
import random
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, RandomSampler  # noqa: E402

from bundlefs import Bundle, PackOptions, pack  # noqa: E402
from bundlefs.errors import EntryNotFound, IsADirectory, NotARegularFile  # noqa: E402
from bundlefs.integrations.torch import (  # noqa: E402
    IMG_EXTENSIONS,
    BundleDataset,
    BundleImageFolder,
    LocalitySampler,
)
from tests.conftest import HardLink, build_tree, expected_files, pseudo_random_bytes  # noqa: E402

RECORD_SIZE = 4096

# 240 files of 300..1,500 bytes in 4 directories (~4 files a record), an empty file, a hard link.
FILES_SPEC: dict = {
    f"part{d}": {
        f"f{i:03d}.bin": pseudo_random_bytes(300 + (i * 37) % 1200, seed=d * 1000 + i)
        for i in range(60)
    }
    for d in range(4)
}
FILES_SPEC["part0"]["empty.bin"] = b""
FILES_SPEC["part3"]["again.bin"] = HardLink("part1/f007.bin")
FILES = expected_files(FILES_SPEC)


@pytest.fixture(scope="module")
def files_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torch-files")
    build_tree(root / "src", FILES_SPEC)
    pack(str(root / "src"), str(root / "files.bundle"), PackOptions(record_size=RECORD_SIZE))
    return root / "files.bundle"


# -- module-level helpers: a spawned worker unpickles them by name ---------------------------------


def _with_pid(data: bytes) -> tuple[int, bytes]:
    return os.getpid(), data


def _collate_list(batch: list) -> list:
    return batch


def _to_tensor(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.array(image))


def _negate(target: int) -> int:
    return -target


# -- BundleDataset ---------------------------------------------------------------------------------


def test_importing_bundlefs_does_not_import_torch():
    code = "import sys, bundlefs, bundlefs.integrations; assert 'torch' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_dataset_lists_regular_files_by_pattern_or_by_list(files_bundle):
    everything = BundleDataset(files_bundle)
    assert everything.paths == sorted(FILES)
    assert len(everything) == len(FILES)

    one = BundleDataset(files_bundle, "part2/*.bin")
    assert one.paths == sorted(p for p in FILES if p.startswith("part2/"))
    two = BundleDataset(files_bundle, ["part2/f00*.bin", "**/f001.bin", "part2/f001.bin"])
    assert two.paths == sorted(
        {f"part2/f00{i}.bin" for i in range(10)} | {f"part{d}/f001.bin" for d in range(4)}
    )
    assert BundleDataset(files_bundle, "part*").paths == []  # directories are not samples

    listed = ["part3/f010.bin", "part0/f002.bin", "part3/again.bin"]
    assert BundleDataset(files_bundle, paths=listed).paths == listed
    with pytest.raises(EntryNotFound):
        BundleDataset(files_bundle, paths=["part0/nope.bin"])
    with pytest.raises(IsADirectory):
        BundleDataset(files_bundle, paths=["part0"])
    with pytest.raises(ValueError):
        BundleDataset(files_bundle, "**", paths=listed)


def test_a_fifo_is_no_sample_and_naming_one_is_not_a_regular_file(tmp_path):
    src = build_tree(tmp_path / "src", {"a.bin": b"a"})
    os.mkfifo(src / "fifo")
    pack(str(src), str(tmp_path / "b.bundle"))
    assert BundleDataset(tmp_path / "b.bundle").paths == ["a.bin"]
    with pytest.raises(NotARegularFile):
        BundleDataset(tmp_path / "b.bundle", paths=["fifo"])


def test_items_are_the_bytes_or_what_the_transform_makes_of_them(files_bundle):
    plain = BundleDataset(files_bundle)
    for i, path in enumerate(plain.paths):
        assert plain[i] == FILES[path], path
    sized = BundleDataset(files_bundle, "part1/*", transform=len)
    assert [sized[i] for i in range(len(sized))] == [len(FILES[p]) for p in sized.paths]


def test_a_dataset_over_an_open_bundle_leaves_it_open(files_bundle):
    with Bundle(files_bundle, cache_size=1 << 20) as bundle:
        dataset = BundleDataset(bundle, "part0/*")
        assert dataset.bundle is bundle
        dataset.close()
        assert not bundle.closed
        assert dataset[1] == FILES[dataset.paths[1]]


def test_a_forked_child_opens_the_bundle_again(files_bundle):
    dataset = BundleDataset(files_bundle)
    parent = dataset.bundle
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        ok = False
        try:
            ok = dataset.bundle is not parent and dataset.bundle is dataset.bundle
            ok = ok and dataset[3] == FILES[dataset.paths[3]]
        finally:
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"1"
    assert dataset.bundle is parent and dataset[3] == FILES[dataset.paths[3]]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_dataloader_with_two_workers_reads_every_file_once_per_epoch(files_bundle, context):
    dataset = BundleDataset(files_bundle, transform=_with_pid)
    assert dataset[0][1] == FILES[dataset.paths[0]]  # the parent has read before workers start
    sampler = LocalitySampler(dataset, window=32, seed=7)
    loader = DataLoader(
        dataset,
        batch_size=9,
        sampler=sampler,
        num_workers=2,
        multiprocessing_context=context,
        persistent_workers=True,  # two epochs, one start-up (spawn starts are slow)
        collate_fn=_collate_list,
    )
    orders = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        order = list(sampler)
        items = [item for batch in loader for item in batch]
        assert sorted(order) == list(range(len(dataset)))  # each index exactly once
        assert len(items) == len(order)
        for index, (_pid, data) in zip(order, items, strict=True):
            assert data == FILES[dataset.paths[index]], dataset.paths[index]
        pids = {pid for pid, _ in items}
        assert len(pids) == 2 and os.getpid() not in pids  # each worker opened its own bundle
        orders.append(order)
    assert orders[0] != orders[1]


# -- BundleImageFolder -----------------------------------------------------------------------------

CLASSES = ["bird", "cat", "dog"]
IMAGE_SIZE = (20, 16)  # width, height


def _image(seed: int, fmt: str) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, size=(IMAGE_SIZE[1], IMAGE_SIZE[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    image = Image.fromarray(pixels)
    (image.convert("L") if fmt == "L" else image).save(out, format="PNG" if fmt != "JPEG" else fmt)
    return out.getvalue()


@pytest.fixture(scope="module")
def image_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """train/<class>/ with PNG, JPEG (upper-case extension too), a grey PNG, a nested directory
    and files that are no images; a stray file beside the classes."""
    classes: dict = {}
    for c, name in enumerate(CLASSES):
        classes[name] = {
            "a.png": _image(c * 10 + 1, "PNG"),
            "b.jpg": _image(c * 10 + 2, "JPEG"),
            "C.JPEG": _image(c * 10 + 3, "JPEG"),
            "grey.png": _image(c * 10 + 4, "L"),
            "notes.txt": b"not an image\n",
            "nested": {"d.png": _image(c * 10 + 5, "PNG")},
            "z.png": _image(c * 10 + 6, "PNG"),
        }
    spec = {"train": {**classes, "README": b"classes are directories\n"}, "other.png": b"x"}
    root = tmp_path_factory.mktemp("torch-images")
    build_tree(root / "src", spec)
    pack(str(root / "src"), str(root / "images.bundle"), PackOptions(record_size=RECORD_SIZE))
    return root / "src", root / "images.bundle"


def _torchvision_samples(directory: Path) -> list[tuple[str, int]]:
    """torchvision.datasets.folder.make_dataset, written out (torchvision is not installed)."""
    classes = sorted(e.name for e in os.scandir(directory) if e.is_dir())
    out = []
    for index, name in enumerate(classes):
        for top, _, names in sorted(os.walk(directory / name, followlinks=True)):
            for fname in sorted(names):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    out.append((os.path.relpath(os.path.join(top, fname), directory.parent), index))
    return out


def test_the_image_folder_has_torchvisions_classes_samples_and_targets(image_tree):
    src, bundle = image_tree
    folder = BundleImageFolder(bundle, "train")
    assert folder.root == "train"
    assert folder.classes == CLASSES
    assert folder.class_to_idx == {"bird": 0, "cat": 1, "dog": 2}
    assert folder.samples == _torchvision_samples(src / "train")
    assert folder.imgs == folder.samples
    assert folder.targets == [t for _, t in folder.samples]
    assert folder.extensions == IMG_EXTENSIONS
    assert "train/cat/nested/d.png" in folder.paths
    assert not any(p.endswith(".txt") for p in folder.paths)
    assert len(folder) == 6 * len(CLASSES)


def test_the_image_folder_decodes_to_rgb_pixels_equal_to_the_sources(image_tree):
    src, bundle = image_tree
    folder = BundleImageFolder(bundle, "train")
    for i, (path, target) in enumerate(folder.samples):
        image, label = folder[i]
        with Image.open(src / path) as want:
            expected = np.array(want.convert("RGB"))
        assert image.mode == "RGB" and label == target
        np.testing.assert_array_equal(np.array(image), expected, err_msg=path)


def test_the_image_folder_applies_transforms_and_custom_filters(image_tree):
    _src, bundle = image_tree
    folder = BundleImageFolder(
        bundle, "train", transform=_to_tensor, target_transform=_negate, loader=pil_gray
    )
    image, target = folder[len(folder) - 1]
    assert image.shape == (IMAGE_SIZE[1], IMAGE_SIZE[0]) and target == -2
    only_png = BundleImageFolder(bundle, "train", is_valid_file=lambda p: p.endswith(".png"))
    assert only_png.extensions is None
    assert {p.rsplit(".", 1)[1] for p in only_png.paths} == {"png"}
    with pytest.raises(EntryNotFound):
        BundleImageFolder(bundle, "train", extensions=(".gif",))
    assert BundleImageFolder(bundle, "train", extensions=(".gif",), allow_empty=True).samples == []
    with pytest.raises(EntryNotFound):
        BundleImageFolder(bundle, "train/cat/nested")  # no class directories
    with pytest.raises(ValueError):
        BundleImageFolder(bundle, "train", extensions=None)


def pil_gray(file) -> Image.Image:
    with Image.open(file) as image:
        return image.convert("L")


def test_the_image_folder_through_a_forked_dataloader(image_tree):
    src, bundle = image_tree
    folder = BundleImageFolder(bundle, "train", transform=_to_tensor)
    loader = DataLoader(
        folder,
        batch_size=4,
        sampler=LocalitySampler(folder, window=8),
        num_workers=2,
        multiprocessing_context="fork",
    )
    images = torch.cat([x for x, _ in loader])
    labels = torch.cat([y for _, y in loader])
    order = list(loader.sampler)
    assert sorted(order) == list(range(len(folder)))
    assert labels.tolist() == [folder.targets[i] for i in order]
    for row, index in enumerate(order):
        with Image.open(src / folder.samples[index][0]) as want:
            np.testing.assert_array_equal(images[row].numpy(), np.array(want.convert("RGB")))


# -- LocalitySampler -------------------------------------------------------------------------------


def _synthetic(files: int, per_record: int, shards: int = 3) -> list[tuple[int, int]]:
    """Locations of ``files`` files packed ``per_record`` a record, over ``shards`` shards."""
    records = math.ceil(files / per_record)
    per_shard = math.ceil(records / shards)
    out = []
    for i in range(files):
        record = i // per_record
        out.append((record // per_shard, (record % per_shard) * RECORD_SIZE))
    return out


def _record_loads(order: list[int], locations: list[tuple[int, int]], capacity: int) -> int:
    """Records a reader with an LRU cache of ``capacity`` records loads reading ``order``."""
    cache: OrderedDict[tuple[int, int], None] = OrderedDict()
    loads = 0
    for index in order:
        key = locations[index]
        if key in cache:
            cache.move_to_end(key)
            continue
        loads += 1
        cache[key] = None
        if len(cache) > capacity:
            cache.popitem(last=False)
    return loads


@pytest.mark.parametrize("files,window", [(0, 8), (1, 8), (97, 8), (200, 1), (200, 500)])
def test_the_sampler_yields_a_permutation(files, window):
    sampler = LocalitySampler(_synthetic(files, 5), window=window)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        assert sorted(sampler) == list(range(files))
        assert len(sampler) == files


def test_the_sampler_is_deterministic_per_seed_and_epoch():
    locations = _synthetic(500, 4)
    a, b = LocalitySampler(locations, seed=3), LocalitySampler(locations, seed=3)
    assert list(a) == list(b)
    a.set_epoch(1)
    assert list(a) != list(b)
    b.set_epoch(1)
    assert list(a) == list(b)
    assert list(LocalitySampler(locations, seed=4)) != list(LocalitySampler(locations, seed=3))
    # (seed, epoch) pairs do not collide the way seed + epoch would.
    c = LocalitySampler(locations, seed=0)
    c.set_epoch(1)
    d = LocalitySampler(locations, seed=1)
    assert list(c) != list(d)


def test_a_cold_epoch_reads_each_record_about_once():
    files, per_record, window = 3000, 10, 40
    locations = _synthetic(files, per_record)
    records = len(set(locations))
    sampler = LocalitySampler(locations, window=window, seed=11)
    capacity = window // per_record + 2  # a window's records, and the ones split at its edges
    bound = records + math.ceil(files / window)  # each record once, plus one split per boundary
    shuffled = list(range(files))
    random.Random(11).shuffle(shuffled)
    random_loads = _record_loads(shuffled, locations, capacity)
    assert random_loads > 0.9 * files  # a random order loads a record for almost every file
    for epoch in range(3):
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert _record_loads(order, locations, capacity) <= bound
        assert bound * 5 < random_loads
        for start in range(0, files, window):
            touched = {locations[i] for i in order[start : start + window]}
            assert len(touched) <= window // per_record + 2
        # ... while records come from all over the bundle: the first window is not its start.
        first = {locations[i] for i in order[:window]}
        assert first != {locations[i] for i in range(window)}
        # ... and files are shuffled inside a window: not in pack order.
        assert order[:window] != sorted(order[:window])


def test_shuffle_false_gives_pack_order():
    locations = [(1, 0), (0, 4096), (0, 0), (-1, 3), (0, 4096), (1, 0)]
    assert list(LocalitySampler(locations, shuffle=False)) == [3, 2, 1, 4, 0, 5]


def test_replicas_split_the_epoch_into_contiguous_slices():
    locations = _synthetic(103, 4)
    whole = LocalitySampler(locations, window=16, seed=5)
    order = whole.epoch_order()
    parts = [
        list(LocalitySampler(locations, window=16, seed=5, num_replicas=4, rank=r))
        for r in range(4)
    ]
    assert all(len(p) == 26 for p in parts)
    assert sum(parts, []) == order + order[:1]  # padded by repeating the start, as Distributed
    dropped = [
        list(LocalitySampler(locations, window=16, seed=5, num_replicas=4, rank=r, drop_last=True))
        for r in range(4)
    ]
    assert sum(dropped, []) == order[:100]
    with pytest.raises(ValueError):
        LocalitySampler(locations, num_replicas=2, rank=2)


def test_locations_are_the_records_holding_each_file(files_bundle):
    dataset = BundleDataset(files_bundle)
    locations = dataset.locations()
    with Bundle(files_bundle) as bundle:
        for index, path in enumerate(dataset.paths):
            entry = bundle.resolve(path)
            if not entry.size:
                assert locations[index] == (-1, index)
                continue
            record = bundle.content.record_at(entry.shard, entry.offset)
            assert locations[index] == (entry.shard, record.offset)
            assert record.offset <= entry.offset < record.end
    where = dict(zip(dataset.paths, locations, strict=True))
    assert where["part3/again.bin"] == where["part1/f007.bin"]  # a hard link reads its target
    records = len(set(locations))
    assert records < len(dataset) / 3  # several files a record: locality has something to keep


def test_the_sampler_on_a_real_bundle_reads_fewer_records_than_a_random_sampler(files_bundle):
    dataset = BundleDataset(files_bundle)
    locations = dataset.locations()
    window = 24
    sampler = LocalitySampler(dataset, window=window, seed=2)
    plain = RandomSampler(dataset, generator=torch.Generator().manual_seed(2))
    capacity = 16
    local_loads = _record_loads(list(sampler), locations, capacity)
    random_loads = _record_loads(list(plain), locations, capacity)
    assert local_loads <= len(set(locations)) + math.ceil(len(dataset) / window)
    assert local_loads * 3 < random_loads
