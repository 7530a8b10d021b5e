"""Inline versus worker-thread record loads in the mount daemon (docs/concurrency.md).

    python -m bench.threads SRC_DIR BUNDLE [--sample 4000] [--rounds 3]

Mounts BUNDLE with ``--threads 4`` and ``--threads 0`` alternately; each time drops the page cache,
reads a fixed shuffled sample of SRC_DIR's files (cold) with 1 and 2 reader threads, then again
(warm), and prints files/s. Run as root on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading
import time


def _sample(src: str, size: int) -> list[str]:
    paths = [
        os.path.relpath(os.path.join(top, name), src)
        for top, _dirs, files in os.walk(src)
        for name in files
    ]
    paths.sort()
    random.Random(3).shuffle(paths)
    return paths[:size]


def _read_all(root: str, paths: list[str], readers: int) -> float:
    def work(chunk: list[str]) -> None:
        for path in chunk:
            with open(os.path.join(root, path), "rb") as f:
                f.read()

    threads = [threading.Thread(target=work, args=(paths[i::readers],)) for i in range(readers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(paths) / (time.perf_counter() - start)


def _one_configuration(bundle: str, mnt: str, threads: int, paths: list[str]) -> dict[str, int]:
    result = {}
    for readers in (1, 2):
        subprocess.run(
            [sys.executable, "-m", "bundlefs", "mount", "--threads", str(threads), bundle, mnt],
            check=True,
        )
        try:
            subprocess.run("sync; echo 3 > /proc/sys/vm/drop_caches", shell=True, check=True)
            result[f"cold{readers}"] = round(_read_all(mnt, paths, readers))
            result[f"warm{readers}"] = round(_read_all(mnt, paths, readers))
        finally:
            subprocess.run(["fusermount3", "-u", mnt], check=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("bundle")
    parser.add_argument("--sample", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    paths = _sample(args.source, args.sample)
    with tempfile.TemporaryDirectory() as mnt:
        for _ in range(args.rounds):
            for threads in (4, 0):
                figures = _one_configuration(args.bundle, mnt, threads, paths)
                print(f"--threads {threads}: {figures}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
