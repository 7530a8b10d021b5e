"""``bundlefs diff OLD NEW`` as a user runs it: name-status lines, ``-z``, ``--json`` (JSON Lines),
``--stat``, ``-q``, the exit status (0 same, 1 different, 2 error) and one-sentence errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bundlefs import pack
from tests.conftest import FIXED_MTIME_NS, build_tree
from tests.support.trees import assert_one_line_error, run_cli

BEFORE = {"keep": b"kept\n", "gone": b"removed\n", "edit": b"before\n", "old-name": b"moved" * 9}
AFTER = {"keep": b"kept\n", "edit": b"after!\n", "new-name": b"moved" * 9, "dir": {"f": b"f\n"}}


def packed(root: Path, name: str, spec: dict) -> Path:
    src = build_tree(root / f"{name}.src", spec, mtime_ns=FIXED_MTIME_NS)
    dest = root / f"{name}.bundle"
    pack(str(src), str(dest))
    return dest


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return packed(tmp_path, "old", BEFORE), packed(tmp_path, "new", AFTER)


def test_differences_are_name_status_lines_and_exit_1(pair) -> None:
    result = run_cli("diff", *pair)
    assert result.returncode == 1, result.stderr
    assert result.stdout.decode().splitlines() == [
        "A\tdir",
        "A\tdir/f",
        "M\tedit",
        "D\tgone",
        "R\told-name\tnew-name",
    ]
    assert result.stderr == b""


def test_identical_bundles_print_nothing_and_exit_0(pair) -> None:
    result = run_cli("diff", pair[0], pair[0])
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")


def test_json_is_one_object_per_line(pair) -> None:
    result = run_cli("diff", "--json", *pair)
    assert result.returncode == 1
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows[2] == {"status": "M", "path": "edit", "kind": "file", "changed": ["content"]}
    assert rows[-1] == {
        "status": "R",
        "path": "new-name",
        "kind": "file",
        "changed": [],
        "old_path": "old-name",
    }


def test_z_ends_every_field_with_nul(pair) -> None:
    result = run_cli("diff", "-z", *pair)
    assert result.stdout.endswith(b"R\0old-name\0new-name\0")
    assert result.stdout.startswith(b"A\0dir\0A\0dir/f\0")


def test_stat_is_one_summary_line(pair) -> None:
    result = run_cli("diff", "--stat", *pair)
    assert result.returncode == 1
    assert result.stdout == b"5 changes: 2 added, 1 removed, 1 changed, 1 renamed\n"


def test_stat_of_identical_bundles_says_no_changes(pair) -> None:
    result = run_cli("diff", "--stat", pair[1], pair[1])
    assert (result.returncode, result.stdout) == (0, b"no changes\n")


def test_quiet_prints_nothing_and_the_status_says(pair) -> None:
    result = run_cli("diff", "-q", *pair)
    assert (result.returncode, result.stdout, result.stderr) == (1, b"", b"")


def test_no_renames_shows_a_move_as_d_and_a(pair) -> None:
    result = run_cli("diff", "--no-renames", *pair)
    assert b"D\told-name\n" in result.stdout and b"A\tnew-name\n" in result.stdout


def test_a_missing_bundle_is_one_sentence_and_exit_2(pair, tmp_path: Path) -> None:
    result = run_cli("diff", tmp_path / "nowhere", pair[1])
    line = assert_one_line_error(result, status=2)
    assert "nowhere" in line


def test_bundles_without_shards_still_diff(pair) -> None:
    for bundle in pair:
        for shard in bundle.glob("shard-*"):
            shard.unlink()
    result = run_cli("diff", "--stat", *pair)
    assert (result.returncode, result.stdout) == (
        1,
        b"5 changes: 2 added, 1 removed, 1 changed, 1 renamed\n",
    )


def test_a_name_with_a_newline_is_quoted_as_ls_does(tmp_path: Path) -> None:
    old = packed(tmp_path, "old", {"plain": b"p\n"})
    new = packed(tmp_path, "new", {"plain": b"p\n", "two\nlines": b"x\n"})
    result = run_cli("diff", old, new)
    assert result.stdout == b"A\t'two'$'\\n''lines'\n"


def test_a_name_that_is_not_utf8_comes_out_as_its_bytes(tmp_path: Path) -> None:
    old = packed(tmp_path, "old", {"plain": b"p\n"})
    new = packed(tmp_path, "new", {"plain": b"p\n", b"\xff\xfe": b"x\n"})
    assert run_cli("diff", old, new).stdout == b"A\t\xff\xfe\n"
    row = json.loads(run_cli("diff", "--json", old, new).stdout)
    assert os.fsencode(row["path"]) == b"\xff\xfe"
