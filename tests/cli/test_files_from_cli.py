"""``bundlefs pack --files-from LIST``: a list in a file or on stdin, newline- or NUL-separated
(``-0``); the bundle holds the listed paths, stored in the listed order."""

from __future__ import annotations

import subprocess
import sys

from bundlefs import Bundle
from tests.conftest import build_tree
from tests.support.trees import assert_one_line_error, run_cli

SPEC = {"a": {"one": b"1", "new\nline": b"2"}, "b": {"three": b"3"}, "four": b"4"}


def _stored(bundle) -> list[str]:
    with Bundle(bundle) as b:
        return [path for path, _data in b.iter_files()]


def test_files_from_a_file_packs_the_listed_paths_in_order(tmp_path) -> None:
    src = build_tree(tmp_path / "src", SPEC)
    (tmp_path / "list").write_bytes(b"four\nb/three\r\na/one\n\n")
    result = run_cli("pack", "-q", "--files-from", tmp_path / "list", src, tmp_path / "o.bundle")
    assert result.returncode == 0, result.stderr
    assert _stored(tmp_path / "o.bundle") == ["four", "b/three", "a/one"]


def test_files_from_stdin_with_null_separators(tmp_path) -> None:
    src = build_tree(tmp_path / "src", SPEC)
    cmd = [sys.executable, "-m", "bundlefs", "pack", "-q", "-0", "--files-from", "-"]
    result = subprocess.run(
        [*cmd, str(src), str(tmp_path / "o.bundle")],
        input=b"a/new\nline\0four\0",
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert _stored(tmp_path / "o.bundle") == ["a/new\nline", "four"]


def test_a_missing_listed_path_is_one_line_error_and_skip_errors_skips_it(tmp_path) -> None:
    src = build_tree(tmp_path / "src", SPEC)
    (tmp_path / "list").write_bytes(b"four\nnope\n")
    result = run_cli("pack", "--files-from", tmp_path / "list", src, tmp_path / "o.bundle")
    assert "cannot read nope" in assert_one_line_error(result)
    skipped = run_cli(
        "pack", "-q", "--skip-errors", "--files-from", tmp_path / "list", src, tmp_path / "o.bundle"
    )
    assert skipped.returncode == 4, skipped.stderr  # published, entries left out
    assert _stored(tmp_path / "o.bundle") == ["four"]


def test_a_missing_list_is_one_line_error(tmp_path) -> None:
    src = build_tree(tmp_path / "src", SPEC)
    result = run_cli("pack", "--files-from", tmp_path / "nolist", src, tmp_path / "o.bundle")
    assert "cannot read the list" in assert_one_line_error(result)
