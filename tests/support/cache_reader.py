"""A reader process for the cluster cache tests (tests/store/test_cluster_cache.py): opens a
bundle at a URL with a given disk cache, reads every file ``--rounds`` times and compares each
with its expected SHA-256, then prints one JSON line (the bundle's storage counters, and the
paths read wrong) and exits 0 if every read was right, 1 if not.

    python -m tests.support.cache_reader URL CACHE_DIR EXPECTED_JSON [--size N] [--rounds R]
        [--seed S] [--wait]

``EXPECTED_JSON`` maps each path to its SHA-256 (hex). ``--seed`` shuffles the order of each
round; ``--wait`` prints ``open`` once the bundle is open and reads only after a line on stdin.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys

from bundlefs import Bundle
from bundlefs.errors import BundleError


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("cache")
    parser.add_argument("expected")
    parser.add_argument("--size", type=int, default=1 << 30)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--wait", action="store_true")
    args = parser.parse_args()
    with open(args.expected) as f:
        expected: dict[str, str] = json.load(f)
    wrong: list[str] = []
    errors: list[str] = []
    # No decoded-record cache: every round reads through the store's tiers again.
    with Bundle(args.url, disk_cache=args.cache, disk_cache_size=args.size, cache_size=0) as b:
        if args.wait:
            print("open", flush=True)
            sys.stdin.readline()
        order = sorted(expected)
        for round_ in range(args.rounds):
            if args.seed is not None:
                random.Random(args.seed * 1000 + round_).shuffle(order)
            for path in order:
                try:
                    data = b.read(path)
                except BundleError as e:  # a record refused: reported, and a failure
                    errors.append(f"{path}: {e}")
                    continue
                if hashlib.sha256(data).hexdigest() != expected[path]:
                    wrong.append(path)
        stats = b.storage_stats()
    print(json.dumps({"stats": stats, "wrong": wrong, "errors": errors}), flush=True)
    return 0 if not wrong and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
