"""``bundlefs pack --dedup`` as a user meets it: the dedup line, ``--json``, ``info --dead``'s
dedup row, and ``--dedup`` with ``--dask`` as a one-sentence usage error."""

from __future__ import annotations

import json
from pathlib import Path

from tests.library.test_dedup import dup_tree
from tests.support.trees import assert_one_line_error, run_cli


def test_pack_dedup_says_how_many_files_share_content(tmp_path: Path) -> None:
    src = dup_tree(tmp_path / "src")
    result = run_cli("pack", "--dedup", src, tmp_path / "d.bundle")
    assert result.returncode == 0, result.stderr
    assert b"dedup: 6 files (" in result.stdout


def test_pack_dedup_json_counts_the_files_and_bytes_not_stored(tmp_path: Path) -> None:
    src = dup_tree(tmp_path / "src")
    result = run_cli("pack", "--dedup", "--json", src, tmp_path / "d.bundle")
    facts = json.loads(result.stdout)
    size = sum((src / "a" / f"f{i}").stat().st_size for i in range(6))
    assert facts["dedup"] == {"files": 6, "bytes": size}


def test_info_dead_shows_the_dedup_row(tmp_path: Path) -> None:
    src = dup_tree(tmp_path / "src")
    assert run_cli("pack", "-q", "--dedup", src, tmp_path / "d.bundle").returncode == 0
    result = run_cli("info", "--dead", tmp_path / "d.bundle")
    assert b"dedup" in result.stdout and b"6 files" in result.stdout


def test_dedup_with_dask_is_a_usage_error(tmp_path: Path) -> None:
    src = dup_tree(tmp_path / "src")
    result = run_cli("pack", "--dedup", "--dask", "local:1", src, tmp_path / "d.bundle")
    assert "--dedup" in assert_one_line_error(result, status=2)
