"""bench.memory's table: figures per size, growth per entry, projections to the issue's bounds."""

from __future__ import annotations

from bench.memory import TARGETS, render


def _results(rss: dict[int, float]) -> dict:
    figures = {"seconds": 1.0}
    sizes = {
        str(n): {c: {**figures, "peak_rss": mb * 1e6, "peak_anon": mb * 1e6 / 2} for c in TARGETS}
        for n, mb in rss.items()
    }
    meta = {"started": "now", "minutes": 1, "git_head": "abc", "load_start": "1", "load_end": "1"}
    return {"sizes": sizes, "meta": meta}


def test_the_projection_is_linear_in_the_entries_from_the_largest_size():
    text = render(_results({100_000: 50, 1_000_000: 59}))  # 10 bytes per entry
    pack = next(line for line in text.splitlines() if line.startswith("| `pack` | peak RSS"))
    # 59 MB + 9,000,000 entries × 10 B = 149 MB at 10,000,000, against the bound of 256.
    assert pack == "| `pack` | peak RSS (MB) | 50 | 59 | 10.0 | 10,000,000 | 149 | 256 |"
    merge = next(line for line in text.splitlines() if line.startswith("| `merge` | peak RSS"))
    assert "| 5.0 | 10,000,000 | 99 |" in merge  # its output holds twice the tree's entries
