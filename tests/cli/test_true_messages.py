"""Messages that are true (issue 22): each sentence names the real cause and the path, figures read
as they are, and the help says what every argument is and what it defaults to.

Each test runs the command line as a user would (``python -m bundlefs``). The full-disk tests make
a tiny tmpfs in a private mount namespace (``unshare -m``), which dies with the process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bundlefs import PackOptions, pack
from bundlefs.cli.app import build_parser
from tests.conftest import build_tree, pseudo_random_bytes
from tests.support.trees import assert_one_line_error, run_cli


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = build_tree(tmp_path / "src", {"a.txt": b"hello\n", "d": {"b.txt": b"b" * 100}})
    os.symlink("a.txt", root / "link")
    return root


# -- one sentence, the real cause, the path --------------------------------------------------------


def test_pack_to_a_plain_file_says_it_is_a_file_not_a_bundle_even_with_force(src, tmp_path):
    dest = tmp_path / "existing-file"
    dest.write_bytes(b"keep me")
    for extra in ((), ("--force",)):
        line = assert_one_line_error(run_cli("pack", src, dest, *extra))
        assert f"{dest} is a file, not a bundle" in line
        assert "--force" not in line  # it would not help
    assert dest.read_bytes() == b"keep me"


def test_export_to_a_directory_says_out_is_the_tar_file_even_with_force(src, tmp_path):
    run_cli("pack", src, tmp_path / "b")
    (tmp_path / "adir").mkdir()
    for extra in ((), ("--force",)):
        line = assert_one_line_error(run_cli("export", tmp_path / "b", tmp_path / "adir", *extra))
        assert f"{tmp_path / 'adir'} is a directory: OUT is the tar file to write" in line
        assert "partial" not in line


def test_zstd_level_out_of_range_says_the_level_is_out_of_range(src, tmp_path):
    result = run_cli("pack", src, tmp_path / "b", "--compression", "zstd:25")
    line = assert_one_line_error(result, status=2)  # a malformed value: a usage error
    assert "zstd level 25 is out of range (from -7 to 22)" in line
    result = run_cli("pack", src, tmp_path / "b", "--compression", "lz4:3")
    line = assert_one_line_error(result, status=2)
    assert "lz4 takes no level" in line


def test_a_plain_file_as_src_is_neither_a_directory_nor_an_archive(tmp_path):
    plain = tmp_path / "notes.txt"
    plain.write_bytes(b"just some text, no tar header in sight\n" * 20)
    line = assert_one_line_error(run_cli("pack", plain, tmp_path / "b"))
    assert f"{plain} is neither a directory nor an archive bundlefs reads" in line
    assert "invalid header" not in line
    assert not (tmp_path / "b").exists()


def test_a_compressed_file_that_holds_no_tar_says_so(tmp_path):
    import gzip

    packed = tmp_path / "notes.gz"
    packed.write_bytes(gzip.compress(b"not a tar\n" * 100))
    line = assert_one_line_error(run_cli("pack", packed, tmp_path / "b"))
    assert f"{packed} is gzip data, but not of a tar archive" in line


def _on_a_full_disk(tmp_path: Path, commands: str) -> subprocess.CompletedProcess:
    if not shutil.which("unshare"):
        pytest.skip("needs unshare")
    small = tmp_path / "small"
    small.mkdir()
    script = f"mount -t tmpfs -o size=256k none {small} || exit 99\ncd {tmp_path}\n{commands}"
    result = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        timeout=120,
        env={**os.environ, "BUNDLEFS": f"{sys.executable} -m bundlefs"},
    )
    if result.returncode == 99:
        pytest.skip("needs a tmpfs in a private mount namespace (root)")
    return result


def test_a_full_disk_names_the_file_it_could_not_write(tmp_path):
    big = build_tree(
        tmp_path / "big", {"noise.bin": pseudo_random_bytes(1 << 20, 1, compressible=False)}
    )
    pack(str(big), str(tmp_path / "big.bundle"), PackOptions(compression="none"))
    result = _on_a_full_disk(
        tmp_path,
        '$BUNDLEFS pack big small/b.bundle --compression none; echo "pack $?" >&2\n'
        '$BUNDLEFS extract big.bundle small/out; echo "extract $?" >&2\n'
        '$BUNDLEFS export big.bundle small/t.tar; echo "export $?" >&2\n',
    )
    err = result.stderr.decode()
    lines = err.splitlines()
    assert "pack 1" in lines and "extract 1" in lines and "export 1" in lines, err
    pack_error, extract_error, export_error = (line for line in lines if "error:" in line)
    assert "No space left on device" in pack_error
    assert "small/.b.bundle.partial-" in pack_error and "shard-" in pack_error  # which file
    assert "small/out/noise.bin: No space left on device" in extract_error
    assert "small/t.tar: No space left on device" in export_error


# -- --json is always printed ---------------------------------------------------------------------


def test_pack_json_with_quiet_still_prints_the_object(src, tmp_path):
    result = run_cli("pack", src, tmp_path / "b", "--json", "-q")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["files"] == 2


def test_merge_json_with_quiet_still_prints_the_object(src, tmp_path):
    pack(str(src), str(tmp_path / "one"))
    result = run_cli("merge", tmp_path / "one", tmp_path / "m", "--json", "-q")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["files"] == 2


# -- summaries: every kind counted, plurals agree, figures read right ------------------------------


def test_pack_summary_counts_symlinks_and_uses_the_singular_for_one(src, tmp_path):
    result = run_cli("pack", src, tmp_path / "b")
    line = result.stdout.decode()
    assert "packed 2 files, 2 dirs, 1 symlink, 0 hard links, " in line, line
    assert "1 symlinks" not in line


def test_merge_summary_says_one_shard_not_one_shards(src, tmp_path):
    pack(str(src), str(tmp_path / "one"))
    line = run_cli("merge", tmp_path / "one", tmp_path / "m").stdout.decode()
    assert "merged 1 bundle: 2 files, 2 dirs, " in line and " in 1 shard (" in line, line


def test_extract_and_export_summaries_use_the_singular_for_one(src, tmp_path):
    run_cli("pack", src, tmp_path / "b")
    extracted = run_cli("extract", tmp_path / "b", tmp_path / "out").stdout.decode()
    assert extracted.startswith("extracted 2 files, 2 dirs, 1 symlink, 0 hard links ("), extracted
    exported = run_cli("export", tmp_path / "b", tmp_path / "t.tar").stdout.decode()
    assert exported.startswith("exported 2 files, 2 dirs, 1 symlink, 0 hard links ("), exported


def test_a_tiny_bundles_ratio_does_not_read_as_nothing_stored(tmp_path):
    src = build_tree(tmp_path / "src", {"a": b"hi\n"})  # 3 bytes in a 4 KiB-block shard
    summary = run_cli("pack", src, tmp_path / "b").stdout.decode()
    info = run_cli("info", tmp_path / "b").stdout.decode()
    ratio_row = next(line for line in info.splitlines() if line.startswith("ratio"))
    assert ratio_row.split()[-1] not in ("0.00", "0.0", "0")
    assert float(ratio_row.split()[-1]) > 0
    assert "(ratio 0.00)" not in summary


def test_verify_reports_the_byte_figures_info_prints(src, tmp_path):
    run_cli("pack", src, tmp_path / "b")
    facts = json.loads(run_cli("info", "--json", tmp_path / "b").stdout)
    line = run_cli("verify", tmp_path / "b").stdout.decode().splitlines()[0]
    assert line.startswith("checked 2 files, 2 dirs, 1 symlink, 0 hard links, 1 record in 1 shard")
    assert f"{facts['bytes']:,} bytes of file data" in line
    assert f"stored in {facts['stored_bytes']:,} bytes of shards" in line
    assert f"a {facts['index_bytes']:,}-byte index" in line


def test_ls_long_aligns_names_whatever_the_content_types_length(tmp_path):
    root = build_tree(tmp_path / "src", {"a.txt": b"a", "m.parquet": b"PAR1", "z": b"z"})
    pack(
        str(root),
        str(tmp_path / "b"),
        PackOptions(content_types=(("z", "application/vnd.a-rather-long-vendor-type+json"),)),
    )
    lines = run_cli("ls", "-l", tmp_path / "b").stdout.decode().splitlines()
    starts = {
        line.index(name) for line, name in zip(lines, ("a.txt", "m.parquet", "z"), strict=True)
    }
    assert len(starts) == 1, lines


# -- ls: one name, one line ------------------------------------------------------------------------


@pytest.fixture
def odd_names(tmp_path: Path) -> Path:
    root = build_tree(tmp_path / "src", {"plain": b"p", "two\nlines": b"n", "tab\there": b"t"})
    pack(str(root), str(tmp_path / "b"))
    return tmp_path / "b"


def test_ls_quotes_a_name_with_a_newline_on_one_line_like_gnu_ls(odd_names):
    lines = run_cli("ls", odd_names).stdout.splitlines()
    assert lines == [b"plain", b"'tab'$'\\t''here'", b"'two'$'\\n''lines'"]
    long_lines = run_cli("ls", "-l", odd_names).stdout.splitlines()
    assert len(long_lines) == 3


def test_ls_zero_ends_each_name_with_nul_unquoted(odd_names):
    result = run_cli("ls", "-0", odd_names)
    assert result.stdout == b"plain\0tab\there\0two\nlines\0"


def test_ls_literal_prints_names_as_they_are(odd_names):
    assert run_cli("ls", "-N", odd_names).stdout == b"plain\ntab\there\ntwo\nlines\n"


# -- help texts ----------------------------------------------------------------------------------


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_positional_argument_has_help_and_an_upper_case_name():
    for name, parser in _subparsers().items():
        for action in parser._actions:
            if action.option_strings:
                continue
            assert action.help, f"{name} {action.dest}: no help"
            shown = action.metavar or action.dest
            assert shown == shown.upper(), f"{name}: usage says {shown!r}, the help names it so"


def test_every_option_that_takes_a_value_says_its_default():
    for name, parser in _subparsers().items():
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0:
                continue
            repeatable = isinstance(action, argparse._AppendAction)
            text = action.help or ""
            assert "default" in text or (repeatable and "repeatable" in text), (
                f"{name} {action.option_strings[0]}: the help does not say its default"
            )


def test_usage_names_match_the_help():
    for name in ("pack", "extract", "mount", "ls", "cat", "verify"):
        text = run_cli(name, "--help").stdout.decode()
        usage = text.split("\n\n")[0]
        assert not re.search(r"\s(dest|bundle|mountpoint)\b", usage), (name, usage)


# -- one exit status for a usage error ------------------------------------------------------------


@pytest.mark.parametrize(
    "option", ["cache_size=lots", "bogus", "uid=abc", "owner=nobody", "open_mode=sometimes"]
)
def test_a_bad_mount_option_is_a_usage_error_like_a_bad_flag(tmp_path, option):
    (tmp_path / "mnt").mkdir()
    result = run_cli("mount", tmp_path / "b", tmp_path / "mnt", "-o", option)
    assert_one_line_error(result, status=2)
    flag = run_cli("mount", tmp_path / "b", tmp_path / "mnt", "--threads", "lots")
    assert flag.returncode == 2


@pytest.mark.parametrize(
    "args", [("--meta", "no-equals-sign"), ("--content-type", "*.x"), ("--created", "noon")]
)
def test_a_malformed_pack_value_is_a_usage_error(src, tmp_path, args):
    assert_one_line_error(run_cli("pack", src, tmp_path / "b", *args), status=2)


@pytest.mark.parametrize(
    "args",
    [
        ("info", "{bundle}", "--storage-option", "no-equals-sign"),
        ("mount", "{bundle}", "{mnt}", "-o", "storage_option=no-equals-sign"),
    ],
)
def test_a_malformed_storage_option_is_a_usage_error(src, tmp_path, args):
    pack(str(src), str(tmp_path / "b"))
    (tmp_path / "mnt").mkdir()
    filled = [a.format(bundle=tmp_path / "b", mnt=tmp_path / "mnt") for a in args]
    line = assert_one_line_error(run_cli(*filled), status=2)
    assert "expected KEY=VALUE" in line
