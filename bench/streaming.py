"""Streaming a bundle: ``python -m bench.streaming [--samples N] [--rounds R] [--no-docs]``.

Issue 25's targets for sequential reading, on a WebDataset-like dataset (N samples of a
``.jpg`` stand-in of 4-16 KiB random bytes, a ``.cls`` and a ~300-byte ``.json`` on every other
one, in 100 directories; default packing: one shard), the page cache warm:

- ``iter_files``: ``Bundle.iter_files()`` in one process (the baseline);
- ``iter_samples``: ``Bundle.iter_samples()`` (stem convention) in one process (target ≥ 0.9×);
- ``dataset 2 workers × 1 rank`` and ``dataset 4 workers × 2 ranks``: an epoch of
  ``BundleIterableDataset(samples=True)`` through ``DataLoader``\\ s (forked workers, batches of
  64 samples as lists), each rank its own process started at once (target for 4 × 2: ≥ 1.5×);
- ``dataset 4 workers × 2 ranks, bytes used in the workers``: the same with a ``transform`` that
  uses each sample up in its worker (as decoding would), so only a count travels to the rank.

Each way runs in fresh processes (``--child``) that import and open first, say ``ready`` and
start on one line on stdin; the time is from the first start to the last end, so a dataset's
epoch includes forking its workers and each opening the bundle and scanning the index. The ways
run interleaved, rotated each round; figures are medians over rounds, ratios against
``iter_files`` of the same run (two CPUs shared with other jobs: the load is in the header).
Also computed, not timed: how evenly 8 parts split the files, by ``part=`` (file ranges) and by
``shards=`` (whole shards). Writes ``bench-results/streaming-*.json`` and the section
"Streaming: samples and splits" of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from bench import datasets
from bench.report import log, median, publish

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Streaming: samples and splits"
DIRS = 100
BATCH = 64
WAYS: dict[str, tuple[str, int, int]] = {  # way -> (child mode, workers, ranks)
    "iter_files": ("files", 0, 1),
    "iter_samples": ("samples", 0, 1),
    "dataset 2 workers × 1 rank": ("dataset", 2, 1),
    "dataset 4 workers × 2 ranks": ("dataset", 4, 2),
    "dataset 4 workers × 2 ranks, bytes used in the workers": ("dataset-sizes", 4, 2),
}


def make_dataset(workdir: Path, samples: int, seed: int) -> datasets.Dataset:
    root = workdir / "data" / f"webdataset-{samples}"
    params = {"v": 1, "kind": "webdataset", "count": samples, "seed": seed}
    if not datasets._stamp_matches(root, params):
        log(f"generating {samples} samples in {DIRS} directories -> {root}")

        def fill(tmp: Path) -> None:
            rng = random.Random(f"webdataset:{seed}")
            for d in range(DIRS):
                (tmp / f"d{d:03d}").mkdir()
            for i in range(samples):
                stem = tmp / f"d{i % DIRS:03d}" / f"{i:07d}"
                stem.with_suffix(".jpg").write_bytes(rng.randbytes(rng.randint(4096, 16384)))
                stem.with_suffix(".cls").write_bytes(b"%d" % rng.randrange(1000))
                if i % 2 == 0:
                    text = datasets._text_bytes(rng, rng.randint(200, 400))
                    stem.with_suffix(".json").write_bytes(text)

        datasets._build(root, params, fill)
    return datasets._load("webdataset", root)


# -- the child: one process of one way -------------------------------------------------------------


def _as_list(batch: list[Any]) -> list[Any]:
    return batch  # samples have different members: no default collation


def _cpu() -> float:
    """CPU seconds of this process and its children that have exited (a DataLoader's workers)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _sizes(sample: tuple[str, dict[str, bytes]]) -> tuple[str, int, int]:
    """The transform of the ``dataset-sizes`` ways: the bytes are used up in the worker (as a
    decoding transform would) and only their count travels to the main process."""
    key, members = sample
    return key, len(members), sum(map(len, members.values()))


def _dataset_epoch(bundle: str, workers: int, rank: int, ranks: int, sizes: bool) -> list[int]:
    """[items, files, bytes] of one epoch of the dataset (made here: its index scan counts)."""
    from torch.utils.data import DataLoader

    from bundlefs.integrations.torch import BundleIterableDataset

    ds = BundleIterableDataset(
        bundle, samples=True, rank=rank, world_size=ranks, transform=_sizes if sizes else None
    )
    loader = DataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=_as_list)
    counts = [0, 0, 0]
    for batch in loader:
        for item in batch:
            counts[0] += 1
            if sizes:
                counts[1] += item[1]
                counts[2] += item[2]
            else:
                counts[1] += len(item[1])
                counts[2] += sum(map(len, item[1].values()))
    return counts  # the loader's workers have exited and been waited for: their CPU counts


def child(mode: str, bundle: str, workers: int, rank: int, ranks: int) -> int:
    import bundlefs

    if mode.startswith("dataset"):
        import torch.utils.data  # noqa: F401 (imported before the clock starts)

        # 4 workers on 2 CPUs is the point here, not a mistake.
        warnings.filterwarnings("ignore", message="This DataLoader will create")

        import bundlefs.integrations.torch  # noqa: F401
    else:
        b = bundlefs.Bundle(bundle)
    print("ready", flush=True)
    if not sys.stdin.readline():
        return 1
    t0, cpu0 = time.monotonic(), _cpu()
    counts = [0, 0, 0]
    if mode == "files":
        for _path, data in b.iter_files():
            counts[0] += 1
            counts[2] += len(data)
        counts[1] = counts[0]
    elif mode == "samples":
        for _key, members in b.iter_samples():
            counts[0] += 1
            counts[1] += len(members)
            counts[2] += sum(map(len, members.values()))
    else:
        counts = _dataset_epoch(bundle, workers, rank, ranks, mode == "dataset-sizes")
    t1 = time.monotonic()
    cpu = _cpu() - cpu0
    items, files, nbytes = counts
    print(json.dumps({"t0": t0, "t1": t1, "cpu": cpu, "items": items, "files": files,
                      "bytes": nbytes}))  # fmt: skip
    return 0


def run_way(way: str, bundle: Path) -> dict[str, float]:
    """One timed run of ``way``: its processes started together, wall time first start to last
    end."""
    mode, workers, ranks = WAYS[way]
    procs = []
    for rank in range(ranks):
        cmd = [sys.executable, "-m", "bench.streaming", "--child", mode, "--bundle", str(bundle),
               "--workers", str(workers), "--rank", str(rank), "--ranks", str(ranks)]  # fmt: skip
        p = subprocess.Popen(
            cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        procs.append(p)
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready", way
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        assert p.returncode == 0, f"{way}: exit {p.returncode}"
        outs.append(json.loads(out.strip().splitlines()[-1]))
    seconds = max(o["t1"] for o in outs) - min(o["t0"] for o in outs)
    files = sum(o["files"] for o in outs)
    cpu = sum(o["cpu"] for o in outs)
    return {"seconds": seconds, "files": files, "items": sum(o["items"] for o in outs),
            "bytes": sum(o["bytes"] for o in outs), "files_per_s": files / seconds,
            "cpu_s": cpu, "cpu_us_per_file": cpu / files * 1e6}  # fmt: skip


# -- the parent ------------------------------------------------------------------------------------


def balance(bundle: Path, parts: int) -> dict[str, Any]:
    """Files per part when ``parts`` workers split the bundle by file ranges and by shards."""
    import bundlefs

    with bundlefs.Bundle(bundle) as b:
        by_part = [sum(1 for _ in b.iter_samples(part=(i, parts))) for i in range(parts)]
        shards = b.config.shard_count
        by_shard = [
            sum(1 for _ in b.iter_samples(shards=range(i, shards, parts)) if i < shards)
            for i in range(parts)
        ]
    return {"parts": parts, "shards": shards, "by_part": by_part, "by_shard": by_shard}


def _read(bundle: Path, samples: bool) -> tuple[float, float]:
    """(wall s, CPU s) of one pass of ``iter_files`` or ``iter_samples`` in this process."""
    import bundlefs

    with bundlefs.Bundle(bundle) as b:
        t, cpu = time.perf_counter(), time.process_time()
        if samples:
            for _key, members in b.iter_samples():
                for data in members.values():
                    len(data)
        else:
            for _path, data in b.iter_files():
                len(data)
        return time.perf_counter() - t, time.process_time() - cpu


def paired(bundle: Path, r: int) -> dict[str, float]:
    """``iter_samples`` over ``iter_files``, one right after the other in one process (their order
    alternating by round): a ratio less exposed to the machine's load than separate processes."""
    first, second = (False, True) if r % 2 == 0 else (True, False)
    runs = {first: _read(bundle, first), second: _read(bundle, second)}
    return {"wall": runs[False][0] / runs[True][0], "cpu": runs[False][1] / runs[True][1]}


def bench(ds: datasets.Dataset, workdir: Path, rounds: int) -> dict[str, Any]:
    import bundlefs

    bundle = workdir / "streaming" / f"{ds.root.name}.bundle"
    if not (bundle / "COMPLETE").exists():
        bundle.parent.mkdir(parents=True, exist_ok=True)
        log(f"packing {ds.root} -> {bundle}")
        bundlefs.pack(str(ds.root), str(bundle), bundlefs.PackOptions(force=True))
    ways = list(WAYS)
    runs: dict[str, list[dict[str, float]]] = {w: [] for w in ways}
    pairs: list[dict[str, float]] = []
    for r in range(rounds):
        for way in ways[r % len(ways) :] + ways[: r % len(ways)]:
            runs[way].append(run_way(way, bundle))
            log(f"round {r + 1}/{rounds} {way}: {runs[way][-1]['files_per_s']:,.0f} files/s")
        pairs.append(paired(bundle, r))
        log(f"round {r + 1}/{rounds} paired iter_samples ÷ iter_files: {pairs[-1]}")
    files = {w: {run["files"] for run in rs} for w, rs in runs.items()}
    assert all(f == {len(ds.files)} for f in files.values()), f"files seen: {files}"
    with bundlefs.Bundle(bundle) as b:
        info = {"files": len(ds.files), "bytes": ds.total_bytes, "shards": b.config.shard_count,
                "samples": sum(1 for _ in b.iter_samples())}  # fmt: skip
    return {"runs": runs, "pairs": pairs, "info": info, "balance": balance(bundle, 8)}


def _rows(res: dict[str, Any]) -> tuple[list[str], dict[str, float]]:
    """The table's rows, and each way's median CPU µs per file."""
    med = {w: median(r["files_per_s"] for r in rs) for w, rs in res["runs"].items()}
    sec = {w: median(r["seconds"] for r in rs) for w, rs in res["runs"].items()}
    cpu = {w: median(r["cpu_us_per_file"] for r in rs) for w, rs in res["runs"].items()}
    base, base_cpu = med["iter_files"], cpu["iter_files"]
    targets = {"iter_samples": 0.9, "dataset 4 workers × 2 ranks": 1.5,
               "dataset 4 workers × 2 ranks, bytes used in the workers": 1.5}  # fmt: skip
    rows = []
    for w in med:
        verdict = ""
        if w in targets:
            verdict = f"≥ {targets[w]}×: {'met' if med[w] / base >= targets[w] else 'NOT met'}"
        rows.append(f"| {w} | {sec[w]:.2f} | {med[w]:,.0f} | {med[w] / base:.2f}× | "
                    f"{cpu[w]:.1f} | {base_cpu / cpu[w]:.2f}× | {verdict} |")  # fmt: skip
    return rows, cpu


def markdown(results: dict[str, Any]) -> str:
    meta, res = results["meta"], results["result"]
    info, bal = res["info"], res["balance"]
    rows, cpu = _rows(res)
    dataset_cpu = cpu["dataset 4 workers × 2 ranks"]
    used_cpu = cpu["dataset 4 workers × 2 ranks, bytes used in the workers"]
    ceiling = 2 * cpu["iter_files"] / dataset_cpu
    used_ceiling = 2 * cpu["iter_files"] / used_cpu
    pair_wall = median(p["wall"] for p in res["pairs"])
    pair_cpu = median(p["cpu"] for p in res["pairs"])

    def spread(counts: list[int]) -> str:
        mean = sum(counts) / len(counts)
        return f"{', '.join(map(str, counts))} (largest {max(counts) / mean:.2f}× the mean)"

    return f"""{SECTION}

Generated by `.venv/bin/python -m bench.streaming {" ".join(meta["argv"])}` on {meta["started"]} \
({meta["duration_s"] / 60:.1f} min); machine: {meta["machine"]}; load average at start \
{meta["load_start"]}, at end {meta["load_end"]}; bundlefs at `{meta["git_head"]}`. Median of \
{meta["rounds"]} rounds; the ways run interleaved and rotated each round; ratios are against \
`iter_files` of the same run.

{info["samples"]:,} WebDataset-style samples ({info["files"]:,} files, \
{info["bytes"] / 1e6:,.0f} MB: a 4-16 KiB random `.jpg`, a `.cls`, a `.json` on every other one, \
in {DIRS} directories), packed with the defaults ({info["shards"]} shard), the page cache warm.
"CPU" is the user and system time of every process of the way (a dataset's workers included)
per file; "CPU vs" is `iter_files`'s CPU per file over the way's (1.00×: as efficient).

| way | epoch s | files/s | vs `iter_files` | CPU µs/file | CPU vs `iter_files` | target |
|---|---:|---:|---:|---:|---:|---|
{chr(10).join(rows)}

- `iter_samples` groups as it streams (a key computed per path, one dict a sample): it costs
  little beside reading, decompressing and checking each file. Run right after each other in one
  process (alternating which goes first), its throughput is {pair_wall:.2f}× `iter_files`'s by
  the clock and {pair_cpu:.2f}× by CPU time (medians of {len(res["pairs"])} pairs): the separate
  processes of the table see the machine's load change between them.
- A dataset epoch costs more CPU than one process reading: each rank scans the index once (its
  workers inherit the scan), each worker is forked and opens the bundle, and every batch is
  pickled through a pipe to its rank's process (the bytes copied twice more; a transform that
  uses the bytes up in the worker, as decoding does, saves that part). Two CPUs kept busy at
  these CPU costs per file give at most 2 × {cpu["iter_files"]:.1f} ÷ {dataset_cpu:.1f} =
  {ceiling:.2f}× `iter_files` (bytes to the main process) and 2 × {cpu["iter_files"]:.1f} ÷
  {used_cpu:.1f} = {used_ceiling:.2f}× (bytes used in the workers), and only on an idle machine:
  on this one, shared (see the load average), the wall-clock ratios above also measure how much
  of the two CPUs 10 processes win from the other jobs, against one.
- Splitting 8 ways by file ranges (`part=`, what the dataset does) gives parts of
  {spread(bal["by_part"])} samples; by whole shards (`shards=`) {spread(bal["by_shard"])}:
  with fewer shards than workers, shards leave workers idle.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.streaming", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/bundlefs-bench"))
    ap.add_argument("--samples", type=int, default=40_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--no-docs", action="store_true", help="only write the JSON")
    ap.add_argument("--child", choices=("files", "samples", "dataset", "dataset-sizes"),
                    help=argparse.SUPPRESS)  # fmt: skip
    ap.add_argument("--bundle", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--ranks", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child, args.bundle, args.workers, args.rank, args.ranks)
    from bench.run import _cmd_output, machine_info

    started = dt.datetime.now(dt.UTC)
    t_start = time.perf_counter()
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    git_head = _cmd_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    if _cmd_output(["git", "-C", str(REPO), "status", "--porcelain", "bundlefs"]) not in ("", "?"):
        git_head += " + uncommitted work-tree changes"
    ds = make_dataset(args.workdir, args.samples, args.seed)
    results: dict[str, Any] = {"result": bench(ds, args.workdir, args.rounds)}
    results["meta"] = {
        "argv": sys.argv[1:] if argv is None else argv,
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "duration_s": time.perf_counter() - t_start,
        "machine": machine_info(),
        "load_start": load_start,
        "load_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "rounds": args.rounds,
        "git_head": git_head,
    }
    publish("streaming", results, markdown(results), docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
