"""Slow paths a user trips on (issue 22): skipping unreadable files costs what reading them costs
(a bounded number of lines, not one per file through the terminal), and a distributed pack's
partitions follow the data, not the worker count.

Unreadable files need a process without the DAC capabilities when the tests run as root
(``setpriv``), as tests/cli/test_first_contact.py does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from bundlefs.cli.output import EXIT_PACKED_SKIPPED
from bundlefs.packing.distributed import plan as partition
from bundlefs.packing.distributed.plan import fitted_count, plan_archives, plan_directory
from bundlefs.packing.sources.base import SourceErrors
from bundlefs.packing.sources.streams import STDIN
from tests.conftest import build_tree


def _pack_without_read_permission(*args: str | os.PathLike) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "bundlefs", "pack", *map(os.fspath, args)]
    if os.getuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("needs setpriv to read as a user without DAC override")
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_skipping_hundreds_of_unreadable_files_says_a_bounded_number_of_lines(tmp_path):
    spec = {f"d{d}": {f"f{i:03d}": b"x" * 100 for i in range(100)} for d in range(4)}
    spec["readable.txt"] = b"ok\n"
    root = build_tree(tmp_path / "src", spec)
    for d in range(4):
        for name in os.listdir(root / f"d{d}"):
            (root / f"d{d}" / name).chmod(0)
    result = _pack_without_read_permission(root, tmp_path / "b", "--skip-errors", "--json")
    assert result.returncode == EXIT_PACKED_SKIPPED, result.stderr  # published, entries left out
    warnings = result.stderr.splitlines()
    assert len(warnings) == SourceErrors.NAMED + 1, warnings[-3:]
    assert all(w.startswith("bundlefs: warning: skipping ") for w in warnings)
    assert "pack --json lists every one" in warnings[-1]
    facts = json.loads(result.stdout)
    assert len(facts["skipped"]) == 400 and facts["files"] == 1


def test_the_summary_line_says_not_every_skipped_path_was_named(tmp_path):
    root = build_tree(tmp_path / "src", {f"f{i:03d}": b"x" for i in range(SourceErrors.NAMED + 5)})
    for name in os.listdir(root):
        (root / name).chmod(0)
    result = _pack_without_read_permission(root, tmp_path / "b", "--skip-errors")
    assert result.returncode == EXIT_PACKED_SKIPPED, result.stderr  # published, entries left out
    assert f"({SourceErrors.NAMED + 5} skipped, the first named: see" in result.stdout


# -- partitions follow the data ----------------------------------------------------------------


def test_a_small_tree_is_one_partition_whatever_the_worker_count(tmp_path):
    root = build_tree(
        tmp_path / "src", {f"d{d}": {f"f{i}": b"x" * 500 for i in range(17)} for d in range(9)}
    )
    # 153 files on 8 workers: 32 partitions asked for, the data is worth one.
    assert len(plan_directory(str(root), 32, fit=True).partitions) == 1
    assert len(plan_directory(str(root), 32).partitions) > 1  # an explicit count is kept


def test_partitions_grow_with_the_entries_and_the_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(partition, "PARTITION_ENTRIES", 50)
    root = build_tree(
        tmp_path / "src", {f"d{d}": {f"f{i}": b"x" for i in range(17)} for d in range(9)}
    )
    plan = plan_directory(str(root), 32, fit=True)
    assert len(plan.partitions) == -(-plan.entries // 50)  # 163 entries: 4
    assert fitted_count(32, 0, 3 * partition.PARTITION_BYTES + 1) == 4
    assert fitted_count(2, 10**9, 10**15) == 2  # never more than asked for
    assert fitted_count(8, 0, 0) == 1


def test_small_tar_shards_are_one_partition(tmp_path):
    import tarfile

    shards = []
    for s in range(6):
        path = tmp_path / f"shard-{s}.tar"
        with tarfile.open(path, "w") as tar:
            member = tmp_path / f"m{s}"
            member.write_bytes(b"x" * 100)
            tar.add(member, arcname=f"m{s}")
        shards.append(str(path))
    assert STDIN not in shards
    assert len(plan_archives(shards, 24, fit=True).partitions) == 1
    assert len(plan_archives(shards, 3).partitions) == 3
