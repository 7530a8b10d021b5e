"""Deterministic (seeded) benchmark datasets.

Three datasets are generated under the work directory:

- ``small``: 100,000 files (times ``--scale``) spread over 100 directories; sizes are
  log-normal around 20 KiB and clipped to 1 KiB..400 KiB; 80 % are random bytes (stand-ins for
  JPEGs, incompressible) and 20 % are JSON text (compressible).
- ``large``: a few 64 MiB files, half random bytes and half text, for sequential throughput.
- ``source``: a copy of this interpreter's standard library (without ``site-packages`` and
  ``__pycache__``), a realistic tree of source files of mixed sizes.

Each dataset is written into a temporary directory and renamed into place, with a stamp file
beside it recording the parameters, so an interrupted generation is never mistaken for a
complete one and an unchanged dataset is reused by later runs instead of being rewritten.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

KIB = 1024
MIB = 1024 * 1024

# Bump when the generators change, so old datasets on disk are regenerated.
GENERATOR_VERSION = 1
Log = Callable[[str], None]
STAMP = ".stamp.json"

SMALL_FILES = 100_000
SMALL_DIRS = 100
SMALL_MEDIAN = 20 * KIB
# sigma of the underlying normal: ~0.9 gives a mean of ~30 KiB and a long tail up to the clip.
SMALL_SIGMA = 0.9
SMALL_MIN = 1 * KIB
SMALL_MAX = 400 * KIB
SMALL_INCOMPRESSIBLE = 0.8

LARGE_FILES = 4
LARGE_SIZE = 64 * MIB

_WORD_TEXT = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
    "sigma tau upsilon phi chi psi omega cat dog bird fish tree leaf river stone cloud rain "
    "image label train valid test batch epoch loss score width height channel crop resize "
    "north south east west red green blue black white small large medium quick slow"
)
_WORDS = _WORD_TEXT.split()


@dataclass
class Dataset:
    """A generated dataset: its root and the regular files in it (sorted relative paths)."""

    name: str
    root: Path
    files: list[str]
    sizes: dict[str, int] = field(repr=False)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    def sample(self, count: int, seed: int) -> list[str]:
        """A fixed shuffled sample of ``count`` files (all files, shuffled, if fewer)."""
        rng = random.Random(f"sample:{seed}:{self.name}")
        count = min(count, len(self.files))
        return rng.sample(self.files, count)


def _text_bytes(rng: random.Random, size: int) -> bytes:
    """JSON-lines-like records: compressible (~3-5x with lz4) but not trivially repetitive."""
    parts: list[str] = []
    total = 0
    n = 0
    while total < size:
        rec = {
            "id": n,
            "name": f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}_{rng.randrange(10_000)}",
            "tags": rng.sample(_WORDS, 3),
            "score": round(rng.random(), 4),
            "bbox": [rng.randrange(640), rng.randrange(480), rng.randrange(64), rng.randrange(48)],
        }
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        parts.append(line)
        total += len(line)
        n += 1
    return "".join(parts).encode()[:size]


def _small_sizes(count: int, seed: int) -> list[int]:
    rng = random.Random(f"small-sizes:{seed}")
    mu = math.log(SMALL_MEDIAN)
    return [
        int(min(SMALL_MAX, max(SMALL_MIN, rng.lognormvariate(mu, SMALL_SIGMA))))
        for _ in range(count)
    ]


def _stamp_path(root: Path) -> Path:
    # Beside the dataset, not inside it: the stamp must not become one of the files packed.
    return root.with_name(root.name + STAMP)


def _stamp_matches(root: Path, params: dict[str, object]) -> bool:
    try:
        return root.is_dir() and json.loads(_stamp_path(root).read_text()) == params
    except (OSError, ValueError):
        return False


def _load(name: str, root: Path) -> Dataset:
    files: list[str] = []
    sizes: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in filenames:
            full = os.path.join(dirpath, fn)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            rel = os.path.relpath(full, root)
            files.append(rel)
            sizes[rel] = os.path.getsize(full)
    files.sort()
    return Dataset(name, root, files, sizes)


def _build(root: Path, params: dict[str, object], fill: Callable[[Path], None]) -> None:
    """Generate into ``root.tmp`` with ``fill`` and rename into place with a stamp."""
    tmp = root.with_name(root.name + ".tmp")
    _stamp_path(root).unlink(missing_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    tmp.mkdir(parents=True)
    fill(tmp)
    tmp.rename(root)
    _stamp_path(root).write_text(json.dumps(params))


def small(workdir: Path, scale: float, seed: int, log: Log = print) -> Dataset:
    count = max(SMALL_DIRS, round(SMALL_FILES * scale))
    root = workdir / "data" / f"small-{count}"
    params = {"v": GENERATOR_VERSION, "kind": "small", "count": count, "seed": seed}
    if not _stamp_matches(root, params):
        log(f"generating small dataset: {count} files in {SMALL_DIRS} directories -> {root}")

        def fill(tmp: Path) -> None:
            sizes = _small_sizes(count, seed)
            for d in range(SMALL_DIRS):
                (tmp / f"d{d:03d}").mkdir()
            for i, size in enumerate(sizes):
                # One generator per file: the content of file i does not depend on the others.
                rng = random.Random(f"small:{seed}:{i}")
                d = rng.randrange(SMALL_DIRS)
                if rng.random() < SMALL_INCOMPRESSIBLE:
                    path, data = tmp / f"d{d:03d}" / f"img{i:06d}.jpg", rng.randbytes(size)
                else:
                    path, data = tmp / f"d{d:03d}" / f"meta{i:06d}.json", _text_bytes(rng, size)
                path.write_bytes(data)

        _build(root, params, fill)
    return _load("small", root)


def large(workdir: Path, scale: float, seed: int, log: Log = print) -> Dataset:
    # Scale the count, never the size: 64 MiB is what makes these "large".
    count = max(2, min(LARGE_FILES, round(LARGE_FILES * scale)))
    root = workdir / "data" / f"large-{count}"
    params = {"v": GENERATOR_VERSION, "kind": "large", "count": count, "seed": seed}
    if not _stamp_matches(root, params):
        log(f"generating large dataset: {count} x 64 MiB -> {root}")

        def fill(tmp: Path) -> None:
            for i in range(count):
                rng = random.Random(f"large:{seed}:{i}")
                compressible = i % 2 == 1
                name = f"large{i}.{'txt' if compressible else 'bin'}"
                with open(tmp / name, "wb") as f:
                    for _ in range(LARGE_SIZE // MIB):
                        f.write(_text_bytes(rng, MIB) if compressible else rng.randbytes(MIB))

        _build(root, params, fill)
    return _load("large", root)


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source(workdir: Path, log: Log = print) -> Dataset:
    src = stdlib_dir()
    root = workdir / "data" / "source"
    params = {"v": GENERATOR_VERSION, "kind": "source", "from": str(src)}
    if not _stamp_matches(root, params):
        log(f"copying source tree {src} -> {root}")

        def fill(tmp: Path) -> None:
            # site-packages is third-party code (and huge in a dev environment); __pycache__ is
            # generated. dangling/odd entries are skipped rather than failing the whole bench.
            shutil.copytree(
                src,
                tmp,
                symlinks=True,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("site-packages", "__pycache__"),
            )

        _build(root, params, fill)
    return _load("source", root)
