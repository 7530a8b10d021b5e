"""Worker process for the timed read loops (``python -m bench.reader``).

Readers are separate processes, not threads, so two readers really run in parallel (no GIL) and
a reader never shares an LMDB environment with the bench process across a fork.

Protocol: the parent writes the relative paths to read (one per line) into ``--list``; the
worker prepares (imports, opens the bundle for ``--mode api``), prints ``ready``, waits for one
line on stdin, reads its share of the list (``--start``/``--step``) whole-file, and prints one JSON
line with ``CLOCK_MONOTONIC`` start and end times, which are comparable across processes, so the
parent can take the wall time from the first start to the last end, and the CPU time the reader
spent between them (its own process: for ``api`` all of a read's work, for ``fs`` and ``pyopen``
only the system calls' share, the daemon's is not in it).

Modes: ``fs`` reads cat-style (``os.open``/``os.read``/``os.close``, nothing else reaches the
file system); ``pyopen`` reads as most Python programs do, ``open(path, "rb").read()``, which
also asks ``isatty`` (one ``FUSE_IOCTL`` per file on a FUSE mount) and ``fstat``s the file;
``api`` reads through ``bundlefs.Bundle.read`` without FUSE.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

CHUNK = 1024 * 1024
MAX_PASSES = 50


def read_fs(root: str, rels: list[str]) -> int:
    total = 0
    for rel in rels:
        fd = os.open(os.path.join(root, rel), os.O_RDONLY)
        try:
            while True:
                b = os.read(fd, CHUNK)
                if not b:
                    break
                total += len(b)
        finally:
            os.close(fd)
    return total


def read_pyopen(root: str, rels: list[str]) -> int:
    total = 0
    for rel in rels:
        with open(os.path.join(root, rel), "rb") as f:
            total += len(f.read())
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mode", choices=("fs", "pyopen", "api"), default="fs")
    ap.add_argument("--root", required=True, help="mount point / directory, or bundle for api")
    ap.add_argument("--list", required=True, help="file with one relative path per line")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument(
        "--min-seconds",
        type=float,
        default=0.0,
        help="repeat the whole list until this much time has passed (warm runs only)",
    )
    args = ap.parse_args(argv)

    with open(args.list) as f:
        rels = [line.rstrip("\n") for line in f if line.strip()]
    rels = rels[args.start :: args.step]

    bundle = None
    if args.mode == "api":
        import bundlefs  # only here: fs-mode workers must start fast and not need the package

        bundle = bundlefs.Bundle(args.root)

    print("ready", flush=True)
    if not sys.stdin.readline():
        return 1
    t0, c0 = time.monotonic(), time.process_time()
    total = files = passes = first_pass_bytes = 0
    # Warm reads of a small sample can take a few milliseconds, too short to time reliably on a
    # noisy machine: repeat whole passes until --min-seconds (bounded by MAX_PASSES).
    while True:
        if bundle is not None:
            for rel in rels:
                total += len(bundle.read(rel))
        elif args.mode == "pyopen":
            total += read_pyopen(args.root, rels)
        else:
            total += read_fs(args.root, rels)
        files += len(rels)
        passes += 1
        if passes == 1:
            first_pass_bytes = total
        t1 = time.monotonic()
        if t1 - t0 >= args.min_seconds or passes >= MAX_PASSES:
            break
    cpu = time.process_time() - c0
    if bundle is not None:
        bundle.close()
    out = {
        "t0": t0,
        "t1": t1,
        "cpu": cpu,
        "files": files,
        "bytes": total,
        "passes": passes,
        "first_pass_bytes": first_pass_bytes,
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
