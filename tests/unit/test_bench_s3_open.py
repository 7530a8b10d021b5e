"""bench.s3_open's table: medians and worst per size and variant, growth, the run sizes."""

from __future__ import annotations

from bench.s3_open import RUN_SIZES, VARIANTS, _paths, render
from bench.scale import Tree


def _round(seconds: float, megabytes: float) -> dict:
    return {
        "seconds": seconds,
        "warm_seconds": seconds / 10,
        "gets": 10,
        "bytes": megabytes * 1e6,
        "index_bytes": megabytes * 1e6 * 0.9,
    }


def _results() -> dict:
    sizes = {}
    for n, index_mb in ((100_000, 7.5), (1_000_000, 75.0)):
        sizes[str(n)] = {
            "index_bytes": index_mb * 1e6,
            "table_bytes": index_mb * 1e3,
            "pack_seconds": 1.0,
            "run_ms": {str(r): 8.0 for r in RUN_SIZES},
            "paged": [_round(0.5, 1.0), _round(0.7, 1.2), _round(0.6, 1.1)],
            "whole": [_round(1.0, index_mb), _round(3.0, index_mb), _round(2.0, index_mb)],
        }
    meta = {"started": "now", "minutes": 1, "git_head": "abc", "load_start": "1", "load_end": "1"}
    return {"sizes": sizes, "meta": {**meta, "rounds": 3}}


def test_the_table_gives_medians_worst_and_growth():
    lines = render(_results()).splitlines()
    first = next(line for line in lines if line.startswith("| paged: first byte (ms)"))
    assert first == "| paged: first byte (ms) | 600 (700) | 600 (700) | 1.00× |"
    whole = next(line for line in lines if line.startswith("| whole: fetched before it (MB)"))
    assert whole == "| whole: fetched before it (MB) | 7.50 (7.50) | 75.00 (75.00) | 10.00× |"
    assert any(line.startswith("| 1,000,000 | 8.0 |") for line in lines)
    assert {v for v in VARIANTS} == {"paged", "whole"}


def test_the_first_round_reads_a_file_of_the_largest_directory():
    tree = Tree(100_000)
    picked = _paths(tree, 5)
    assert len(picked) == len(set(picked)) == 5
    assert tree.path(picked[0]).startswith("big/")
