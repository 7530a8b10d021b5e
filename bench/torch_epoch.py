"""A cold PyTorch epoch: ``python -m bench.torch_epoch [--files N] [--rounds R] [--no-docs]``.

One epoch of a ``torch.utils.data.DataLoader`` (2 forked workers, batches of 64, the files' bytes
as samples: no decoding, so the figures are the read path's) over the same files three ways:

- *raw directory*: a plain dataset that ``open().read()``s the source files, ``RandomSampler``;
- *bundle, RandomSampler*: ``BundleDataset`` over the packed bundle, the same sampler;
- *bundle, LocalitySampler*: ``BundleDataset`` with ``LocalitySampler`` (records in random order,
  files shuffled within windows of 1,024).

Every epoch is cold: ``echo 3 > /proc/sys/vm/drop_caches`` before it, and fresh workers (each
opens its own bundle, with an empty record cache). The three run interleaved, rotated each round;
figures are medians over rounds, and ratios are against the raw directory of the same run (the
machine is shared and noisy). Per epoch the workers report, from their last batch, what they
cost: disk bytes read (``/proc/self/io`` ``read_bytes``), CPU time, and the records their bundle
decoded into its record cache.

Two datasets, ~100 KiB a file in 50 class directories: *jpeg* (real JPEGs made with Pillow,
incompressible to lz4: their records are stored raw) and *text* (JSON lines, ~4x compressible:
their records are lz4). Writes ``bench-results/torch-epoch-*.json`` and the section "PyTorch: a
cold epoch" of docs/benchmarks.md (replaced in place, the rest of the file untouched).

Needs root (drop_caches), torch, numpy and Pillow.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler, get_worker_info

import bundlefs
from bench import datasets
from bench.measure import drop_caches
from bench.report import log, median, write_section
from bundlefs.integrations.torch import DEFAULT_WINDOW, BundleDataset, LocalitySampler

REPO = Path(__file__).resolve().parent.parent
SECTION = "## PyTorch: a cold epoch"
CLASSES = 50
WORKERS = 2
BATCH = 64
MB = 1_000_000
VARIANTS = ("raw directory", "bundle, RandomSampler", "bundle, LocalitySampler")


# -- datasets --------------------------------------------------------------------------------------


def _jpeg(rng: np.random.Generator) -> bytes:
    """A 512x384 JPEG at quality 90 of a gradient with noise: ~105 KB, like a camera photo's
    entropy (lz4 cannot shrink it: 1.002x larger)."""
    h, w = 384, 512
    y, x = np.mgrid[0:h, 0:w]
    phase = rng.uniform(0, 255, 3)
    base = np.stack([(x * 255 / w + phase[0]) % 255, (y * 255 / h + phase[1]) % 255,
                     ((x + y) * 127 / (w + h) + phase[2]) % 255], axis=-1)  # fmt: skip
    pixels = np.clip(base + rng.normal(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def make_dataset(workdir: Path, kind: str, files: int, seed: int) -> datasets.Dataset:
    root = workdir / "data" / f"torch-{kind}-{files}"
    params = {"v": 1, "kind": f"torch-{kind}", "count": files, "seed": seed}
    if not datasets._stamp_matches(root, params):
        log(f"generating {files} {kind} files in {CLASSES} directories -> {root}")

        def fill(tmp: Path) -> None:
            for c in range(CLASSES):
                (tmp / f"c{c:02d}").mkdir()
            for i in range(files):
                d = tmp / f"c{i % CLASSES:02d}"
                if kind == "jpeg":
                    data = _jpeg(np.random.default_rng([seed, i]))
                    (d / f"img{i:05d}.jpg").write_bytes(data)
                else:
                    rng = random.Random(f"torch-text:{seed}:{i}")
                    size = int(rng.uniform(80, 130) * 1024)
                    (d / f"rec{i:05d}.json").write_bytes(datasets._text_bytes(rng, size))

        datasets._build(root, params, fill)
    return datasets._load(kind, root)


# -- what the workers run --------------------------------------------------------------------------


class RawFiles(Dataset[bytes]):
    """The baseline: files of a directory read with ``open()``."""

    def __init__(self, root: Path, paths: list[str]) -> None:
        self.root = str(root)
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> bytes:
        with open(os.path.join(self.root, self.paths[index]), "rb") as f:
            return f.read()


def _io_read_bytes() -> int:
    with open("/proc/self/io", "rb") as f:
        for line in f:
            if line.startswith(b"read_bytes:"):
                return int(line.split()[1])
    return 0


def collate_with_counters(batch: list[bytes]) -> dict[str, Any]:
    """Runs in the worker after each batch: the batch's size and the worker's counters so far."""
    info = get_worker_info()
    puts = 0
    if info is not None and isinstance(info.dataset, BundleDataset):
        stats = info.dataset.bundle.cache_stats()
        puts = stats.entries + stats.evictions  # records decoded into the cache
    t = os.times()
    return {
        "files": len(batch),
        "bytes": sum(map(len, batch)),
        "pid": os.getpid(),
        "read_bytes": _io_read_bytes(),
        "cpu": t.user + t.system,
        "records": puts,
    }


@dataclass
class Epoch:
    seconds: float
    files: int
    bytes: int
    disk_bytes: int
    cpu_seconds: float
    records: int


def run_epoch(dataset: Dataset[bytes], sampler: Sampler[int]) -> Epoch:
    drop_caches()
    t0 = time.perf_counter()
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        sampler=sampler,
        num_workers=WORKERS,
        multiprocessing_context="fork",
        collate_fn=collate_with_counters,
    )
    files = nbytes = 0
    last: dict[int, dict[str, Any]] = {}
    for batch in loader:
        files += batch["files"]
        nbytes += batch["bytes"]
        last[batch["pid"]] = batch
    seconds = time.perf_counter() - t0
    return Epoch(
        seconds,
        files,
        nbytes,
        sum(b["read_bytes"] for b in last.values()),
        sum(b["cpu"] for b in last.values()),
        sum(b["records"] for b in last.values()),
    )


# -- the run ---------------------------------------------------------------------------------------


def bench_dataset(
    ds: datasets.Dataset, workdir: Path, rounds: int, seed: int, window: int
) -> dict[str, Any]:
    bundle_path = workdir / "torch" / f"{ds.root.name}.bundle"
    shutil.rmtree(bundle_path, ignore_errors=True)
    bundle_path.parent.mkdir(parents=True, exist_ok=True)
    log(f"packing {ds.root} -> {bundle_path}")
    bundlefs.pack(str(ds.root), str(bundle_path))
    raw = RawFiles(ds.root, list(ds.files))
    in_bundle = BundleDataset(bundle_path)
    assert in_bundle.paths == raw.paths, "the bundle lists other files than the directory"
    info = in_bundle.bundle.info()
    local = LocalitySampler(in_bundle, window=window, seed=seed)
    samples: dict[str, list[Epoch]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        k = r % len(VARIANTS)
        for variant in VARIANTS[k:] + VARIANTS[:k]:
            generator = torch.Generator().manual_seed(seed * 1000 + r)
            if variant == "raw directory":
                epoch = run_epoch(raw, RandomSampler(raw, generator=generator))
            elif variant == "bundle, RandomSampler":
                epoch = run_epoch(in_bundle, RandomSampler(in_bundle, generator=generator))
            else:
                local.set_epoch(r)
                epoch = run_epoch(in_bundle, local)
            if epoch.files != len(ds.files) or epoch.bytes != ds.total_bytes:
                raise RuntimeError(f"{variant}: read {epoch.files} files, {epoch.bytes} bytes")
            samples[variant].append(epoch)
            log(f"  {ds.name} round {r + 1}/{rounds} {variant:26} {epoch.seconds:6.2f} s")
    in_bundle.close()
    return {
        "files": len(ds.files),
        "bytes": ds.total_bytes,
        "records": local.records,
        "stored_bytes": info.shard_bytes,
        "samples": {v: [e.__dict__ for e in es] for v, es in samples.items()},
    }


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        SECTION,
        "",
        f"Generated by `.venv/bin/python -m bench.torch_epoch {' '.join(meta['argv'])}`".rstrip()
        + f" on {meta['started']} ({meta['duration_s'] / 60:.1f} min); machine: {meta['machine']};"
        f" load average at start {meta['load_start']}, at end {meta['load_end']}; bundlefs at "
        f"`{meta['git_head']}`. Median of {meta['rounds']} rounds; the three ways run interleaved "
        "and rotated each round, and ratios are against the raw directory of the same run.",
        "",
        f"One epoch of a `DataLoader` ({WORKERS} forked workers, batches of {BATCH}) whose samples"
        " are the files' bytes (no decoding), over the same files read from the source directory "
        "with `open()` and a `RandomSampler`, from the bundle (`BundleDataset`) with a "
        "`RandomSampler`, and from the bundle with `LocalitySampler` "
        f"(window {meta['window']:,}). Cold: page cache dropped and fresh workers (each opens "
        "the bundle, empty record cache) before every epoch; the time includes the workers' start.",
        "",
    ]
    for name, d in results["datasets"].items():
        lines += [
            f"**{name}**: {d['files']:,} files, {d['bytes'] / MB:,.0f} MB, {d['records']:,} "
            f"records in the bundle ({d['files'] / d['records']:.1f} files a record), stored "
            f"{d['stored_bytes'] / MB:,.0f} MB.",
            "",
            "| read by | files/s | MB/s | ÷ raw directory | records decoded per file | disk bytes "
            "read ÷ file bytes | worker CPU per file |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        raw_s = median(e["seconds"] for e in d["samples"]["raw directory"])
        for variant in VARIANTS:
            es = d["samples"][variant]
            seconds = median(e["seconds"] for e in es)
            records = median(e["records"] for e in es) / d["files"]
            disk = median(e["disk_bytes"] for e in es) / d["bytes"]
            cpu_ms = median(e["cpu_seconds"] for e in es) / d["files"] * 1000
            rec = "—" if variant == "raw directory" else f"{records:.2f}"
            lines.append(
                f"| {variant} | {d['files'] / seconds:,.0f} | {d['bytes'] / MB / seconds:,.0f} | "
                f"{raw_s / seconds:.2f}× | {rec} | {disk:.2f} | {cpu_ms:.2f} ms |"
            )
        lines.append("")
    return "\n".join(lines + [NOTES])


NOTES = """\
What the figures say (measured on the run these tables came from; the reasoning holds for reruns
on this machine):

- **The locality sampler buys nothing here, and costs up to ~10 % on the JPEG run** (within this
  machine's round-to-round noise: single epochs ranged 1.5-2.1 s). Disk reads are the same for
  both samplers: the page cache (24 GiB) holds the whole bundle, so a random order's second read of
  a record is a memory copy, and "cold" disk reads here come from the host's cache anyway. Its
  gain, one read per record instead of one per file, needs a dataset larger than the page cache
  or remote shards (the object-store issue), which this bench does not have.
- **JPEGs: the bundle reads like the raw directory (1.0x).** lz4 cannot shrink JPEG, so their
  records are stored raw and a whole-file read preads just the file's bytes: no record is
  decompressed ("records decoded per file" 0.00) whatever the order, and the sampler only orders
  disk reads.
- **Compressible files: 0.75x of raw, either sampler.** The bundle reads 0.44 of the bytes from
  disk, but the workers' CPU per file is 2.5x raw's (0.4 vs 0.16 ms): decompressing a 256 KiB
  record for ~2.4 files, CRC checks, and the index lookup. The locality sampler decodes 0.84
  records per file against 0.96 for random order: not the ideal 0.41 (2,058 records ÷ 5,000
  files), because the DataLoader deals batches to its two workers in turn, each with its own
  record cache, so most records are decoded by both; and the random order already hits each
  worker's 256 MiB cache about half the time on a 539 MB dataset.
- Each epoch includes forking two workers and each opening the bundle (~0.1 s); two CPUs shared
  with other jobs: the load average is in the header.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.torch_epoch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/bundlefs-bench"))
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=int, default=DEFAULT_WINDOW)
    ap.add_argument("--datasets", default="jpeg,text", help="comma-separated: jpeg, text")
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--no-docs", action="store_true", help="only write the JSON")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench.torch_epoch needs root: it drops the page cache before every epoch")
    from bench.run import _cmd_output, machine_info

    started = dt.datetime.now(dt.UTC)
    t_start = time.perf_counter()
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    git_head = _cmd_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    if _cmd_output(["git", "-C", str(REPO), "status", "--porcelain", "bundlefs"]) not in ("", "?"):
        git_head += " + uncommitted work-tree changes"
    results: dict[str, Any] = {"datasets": {}}
    for kind in [k for k in args.datasets.split(",") if k]:
        ds = make_dataset(args.workdir, kind, args.files, args.seed)
        results["datasets"][kind] = bench_dataset(
            ds, args.workdir, args.rounds, args.seed, args.window
        )
    results["meta"] = {
        "argv": sys.argv[1:] if argv is None else argv,
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "duration_s": time.perf_counter() - t_start,
        "machine": machine_info(),
        "load_start": load_start,
        "load_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "rounds": args.rounds,
        "window": args.window,
        "git_head": git_head,
        "torch": torch.__version__,
    }
    text = markdown(results)
    print(text, flush=True)
    out = REPO / "bench-results"
    out.mkdir(exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    (out / f"torch-epoch-{stamp}.json").write_text(json.dumps(results, indent=1))
    if not args.no_docs:
        write_section(text, REPO / "docs" / "benchmarks.md")
        log("wrote the section to docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
