"""Unmodified data-loading code reads bundles: through the mount and through ``Bundle.open``.

numpy.load, PIL.Image.open, json.load and a torchvision-style class-folder walk, on both accessors.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import bundlefs

pytestmark = pytest.mark.mount

ARRAY = np.arange(3 * 300 * 7, dtype=np.float32).reshape(3, 300, 7)
META = {"classes": ["cat", "dog"], "count": 6}


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, size=(48, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("loaders")
    src = root / "src"
    for label in META["classes"]:
        (src / "train" / label).mkdir(parents=True)
        for i in range(3):
            (src / "train" / label / f"{i}.png").write_bytes(_png(hash((label, i)) % 1000))
    np.save(src / "features.npy", ARRAY)
    (src / "meta.json").write_text(json.dumps(META))
    bundle = root / "data.bundle"
    bundlefs.pack(str(src), str(bundle), bundlefs.PackOptions(record_size=8192))
    return src, bundle


@pytest.fixture(scope="module")
def mounted_dataset(dataset, tmp_path_factory):
    from tests.support.mounting import mounted

    work = tmp_path_factory.mktemp("loaders-mnt")
    with mounted(dataset[1], work / "mnt", log_path=work / "daemon.log") as m:
        yield m.mountpoint


def _class_folder_samples(listdir, join) -> list[tuple[str, int]]:
    """What torchvision.datasets.ImageFolder does: sorted class dirs, sorted files in each."""
    classes = sorted(listdir("train"))
    return [
        (join("train", c, name), index)
        for index, c in enumerate(classes)
        for name in sorted(listdir(join("train", c)))
    ]


def test_numpy_load_reads_an_array_from_the_mount(mounted_dataset):
    np.testing.assert_array_equal(np.load(mounted_dataset / "features.npy"), ARRAY)


def test_numpy_load_reads_an_array_from_bundle_open(dataset):
    with bundlefs.Bundle(dataset[1]) as b, b.open("features.npy") as f:
        np.testing.assert_array_equal(np.load(f), ARRAY)


def test_pil_opens_images_from_the_mount(mounted_dataset, dataset):
    for path, _label in _class_folder_samples(
        lambda p: os.listdir(mounted_dataset / p), os.path.join
    ):
        with Image.open(mounted_dataset / path) as image, Image.open(dataset[0] / path) as want:
            assert np.array_equal(np.asarray(image), np.asarray(want))


def test_pil_opens_images_from_bundle_open(dataset):
    with bundlefs.Bundle(dataset[1]) as b:
        samples = _class_folder_samples(b.listdir, os.path.join)
        assert [label for _path, label in samples] == [0, 0, 0, 1, 1, 1]
        for path, _label in samples:
            with b.open(path) as f, Image.open(f) as image:
                assert image.size == (64, 48)
                with Image.open(dataset[0] / path) as original:
                    assert np.array_equal(np.asarray(image), np.asarray(original))


def test_json_load_reads_from_both(mounted_dataset, dataset):
    with open(mounted_dataset / "meta.json") as f:
        assert json.load(f) == META
    with bundlefs.Bundle(dataset[1]) as b, b.open("meta.json") as f:
        assert json.load(f) == META
