"""The ``bundlefs`` command line as a user meets it: real subprocesses, real output, exit codes."""

from __future__ import annotations

import json
import os
import re

import pytest

import bundlefs
from bundlefs import Bundle
from tests.support.trees import ODD_NAME, assert_one_line_error, build_rich_tree, run_cli


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory):
    """(source tree, bundle) packed by the CLI itself. Read-only."""
    base = tmp_path_factory.mktemp("cli")
    src = build_rich_tree(base / "src")
    bundle = base / "rich.bundle"
    result = run_cli("pack", "--record-size", "16K", src, bundle)
    assert result.returncode == 0, result.stderr
    return src, bundle


def test_version_prints_the_package_version():
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.decode().strip() == f"bundlefs {bundlefs.__version__}"


def test_no_subcommand_is_a_usage_error_with_status_2():
    result = run_cli()
    assert result.returncode == 2
    assert b"Traceback" not in result.stderr


def test_a_mistyped_command_is_named_with_the_one_meant(tmp_path):
    # Not taken for the mount helper's ``bundlefs BUNDLE MNT`` with a bundle named "unmount".
    result = run_cli("unmount", tmp_path)
    assert result.returncode == 2
    assert result.stderr == b"bundlefs: error: unknown command 'unmount'; did you mean 'umount'?\n"


def test_the_mount_helper_form_still_takes_a_bundle_named_like_a_command(tmp_path):
    (tmp_path / "mnt").mkdir()
    result = run_cli("mnt", tmp_path / "elsewhere", cwd=tmp_path)
    assert result.returncode != 0
    assert b"did you mean" not in result.stderr and b"Traceback" not in result.stderr


def test_pack_prints_a_one_line_summary(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x" * 1000)
    result = run_cli("pack", src, tmp_path / "b")
    assert result.returncode == 0
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 1
    assert re.search(
        r"packed 1 file, 1 dir, 0 symlinks, 0 hard links, 1,000 bytes into [\d,]+ stored bytes",
        lines[0],
    )
    assert "MB/s" in lines[0]


def test_pack_quiet_prints_nothing(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    result = run_cli("pack", "--quiet", src, tmp_path / "b")
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")


def test_pack_options_reach_the_bundle(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"f{i}").write_bytes(os.urandom(40_000))
    (src / "skip.tmp").write_bytes(b"excluded")
    result = run_cli(
        "pack", "--record-size", "8K", "--block-size", "512", "--compression", "none",
        "--shard-size", "64K", "--exclude", "*.tmp", src, tmp_path / "b",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with Bundle(tmp_path / "b") as b:
        assert (b.config.record_size, b.config.block_size) == (8192, 512)
        assert b.config.compression_name == "none"
        assert b.config.shard_count > 1
        assert not b.exists("skip.tmp")


def test_pack_stores_special_files_and_says_so_in_its_summary(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    os.mkfifo(src / "fifo")
    result = run_cli("pack", src, tmp_path / "b")
    assert result.returncode == 0 and result.stderr == b""  # the bundle holds SRC whole
    assert b", 1 special file, " in result.stdout
    listing = run_cli("ls", "-l", tmp_path / "b").stdout.decode()
    assert listing.startswith("p") and listing.rstrip().endswith(" fifo")
    info = run_cli("info", tmp_path / "b").stdout.decode().splitlines()
    assert ["special", "files", "1"] in [line.split() for line in info]
    verified = run_cli("verify", tmp_path / "b")
    assert verified.returncode == 0 and b", 1 special file, " in verified.stdout


def test_pack_to_an_existing_dest_without_force_is_one_line_error(packed, tmp_path):
    src, bundle = packed
    line = assert_one_line_error(run_cli("pack", src, bundle))
    assert "--force" in line


def test_pack_with_a_bad_size_is_a_usage_error(tmp_path):
    result = run_cli("pack", "--shard-size", "4 parsecs", tmp_path, tmp_path / "b")
    assert result.returncode == 2
    assert b"invalid size" in result.stderr


def test_pack_json_reports_the_summary_as_one_object(tmp_path):
    src = build_rich_tree(tmp_path / "src")
    result = run_cli("pack", "--json", src, tmp_path / "b")
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    with Bundle(tmp_path / "b") as bundle:
        config = bundle.config
    assert facts["dest"] == str(tmp_path / "b")
    assert (facts["files"], facts["dirs"], facts["bytes"]) == (
        config.file_count,
        config.dir_count,
        config.data_bytes,
    )
    assert facts["stored_bytes"] > 0 and facts["skipped"] == [] and facts["changed"] == []


def test_an_absurdly_large_size_is_a_usage_error_not_a_traceback(tmp_path):
    result = run_cli("pack", "--record-size", "9" * 400 + "G", tmp_path, tmp_path / "b")
    assert result.returncode == 2
    assert b"too large" in result.stderr and b"Traceback" not in result.stderr


def test_a_bad_size_in_a_mount_option_is_a_usage_error_like_everywhere(tmp_path):
    result = run_cli("mount", tmp_path, tmp_path, "-o", "cache_size=bogus")
    assert result.returncode == 2
    assert result.stderr.count(b"\n") == 1 and b"invalid size" in result.stderr


def test_info_json_reports_the_bundle_facts(packed):
    _src, bundle = packed
    result = run_cli("info", "--json", bundle)
    assert result.returncode == 0
    info = json.loads(result.stdout)
    assert info["files"] == 12
    assert info["dirs"] == 6
    assert info["symlinks"] == 4
    assert info["hardlinks"] == 1
    assert info["shards"] == 1
    assert info["record_size"] == 16384
    assert info["block_size"] == 4096
    assert info["compression"] == "lz4"
    assert info["bytes"] > 0 and info["stored_bytes"] > 0 and info["index_bytes"] > 0
    assert info["ratio"] == pytest.approx(info["bytes"] / info["stored_bytes"], rel=1e-3)
    assert re.fullmatch(r"[0-9a-f]{32}", info["bundle_id"])


def test_info_prints_labelled_lines(packed):
    _src, bundle = packed
    out = run_cli("info", bundle).stdout.decode()
    for label in ("files", "directories", "stored bytes", "ratio", "shards", "index size"):
        assert re.search(rf"^{label}\s", out, re.M), label


def test_ls_lists_a_directory_in_name_order_hiding_dot_names(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("b", "a", ".hidden"):
        (src / name).write_bytes(b"")
    run_cli("pack", src, tmp_path / "b")
    assert run_cli("ls", tmp_path / "b").stdout == b"a\nb\n"
    assert run_cli("ls", "-a", tmp_path / "b").stdout == b".hidden\na\nb\n"


def test_ls_long_shows_mode_links_owner_size_time_and_link_targets(packed):
    _src, bundle = packed
    out = run_cli("ls", "-l", bundle).stdout
    lines = {line.rsplit(b" ", 1)[-1]: line for line in out.splitlines() if b" -> " not in line}
    shared = lines[b"shared"].decode()
    assert re.match(
        r"-rw-r--r--\s+2\s+\S+\s+\S+\s+21 \d{4}-\d\d-\d\d \d\d:\d\d -\s+ shared$", shared
    )
    assert re.search(rb" text/plain\s+hello.txt$", lines[b"hello.txt"])
    assert lines[b"locked"].startswith(b"dr-xr-xr-x")
    assert b"dangling -> no/such/target" in out
    assert ODD_NAME in lines  # raw bytes, not mangled


def test_ls_recursive_lists_every_directory_with_a_header(packed):
    _src, bundle = packed
    out = run_cli("ls", "-R", bundle, "a").stdout.decode()
    assert out.splitlines()[0] == "a:"
    assert "\na/b/c:\ndeep.txt\n" in out


def _walk_source(src) -> dict[str, os.stat_result]:
    """Every path below ``src`` (surrogate-escaped str) → its lstat."""
    found = {}
    for top, dirs, files in os.walk(os.fsencode(src)):
        for name in dirs + files:
            full = os.path.join(top, name)
            found[os.fsdecode(os.path.relpath(full, os.fsencode(src)))] = os.lstat(full)
    return found


def test_ls_json_is_one_object_per_entry_with_where_each_file_is_stored(packed):
    src, bundle = packed
    result = run_cli("ls", "--json", "-R", "-a", bundle)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    by_path = {row["path"]: row for row in rows}
    source = _walk_source(src)
    assert by_path.keys() == source.keys()  # every entry once, the odd name lossless
    assert os.fsencode(by_path[os.fsdecode(ODD_NAME)]["path"]) == ODD_NAME
    with Bundle(bundle) as b:
        for path, st in source.items():
            row = by_path[path]
            assert (row["mode"], row["mtime_ns"], row["uid"]) == (
                st.st_mode,
                st.st_mtime_ns,
                st.st_uid,
            )
            entry = b.resolve(path, follow_symlinks=False)
            if row["type"] == "file":
                assert row["size"] == st.st_size
                assert (row["shard"], row["offset"], row["crc32c"]) == (
                    entry.shard,
                    entry.offset,
                    entry.crc32c,
                )
                if entry.size:
                    record = b.content.record_at(entry.shard, entry.offset)
                    assert row["stored_offset"] == record.stored_offset
            else:
                assert row["shard"] is row["crc32c"] is None
    assert by_path["hello.txt"]["content_type"] == "text/plain"
    assert by_path["dangling"]["type"] == "symlink"
    assert by_path["dangling"]["target"] == "no/such/target"
    assert by_path["a/b/c"]["type"] == "dir"
    assert by_path["a/b/shared-too"]["crc32c"] == by_path["shared"]["crc32c"]


def test_ls_json_without_r_lists_one_directory_by_full_paths(packed):
    _src, bundle = packed
    rows = [json.loads(line) for line in run_cli("ls", "--json", bundle, "a/b").stdout.splitlines()]
    assert [row["path"] for row in rows] == ["a/b/c", "a/b/shared-too"]


def test_ls_csv_has_a_header_row_and_the_json_fields(packed):
    import csv
    import io

    _src, bundle = packed
    result = run_cli("ls", "--csv", "-R", bundle)
    assert result.returncode == 0, result.stderr
    assert ODD_NAME in result.stdout  # the name's bytes as they are
    table = list(csv.DictReader(io.StringIO(os.fsdecode(result.stdout), newline="")))
    rows = [json.loads(line) for line in run_cli("ls", "--json", "-R", bundle).stdout.splitlines()]
    assert [row["path"] for row in table] == [row["path"] for row in rows]
    for got, want in zip(table, rows, strict=True):
        assert got == {k: "" if v is None else str(v) for k, v in want.items()}


def test_ls_json_and_csv_exclude_the_name_styles(packed):
    _src, bundle = packed
    assert run_cli("ls", "--json", "--csv", bundle).returncode == 2
    assert run_cli("ls", "--json", "-0", bundle).returncode == 2


def test_cat_writes_files_byte_exact_in_order(packed):
    src, bundle = packed
    result = run_cli("cat", bundle, "a/multi.bin", "hello.txt", ODD_NAME)
    assert result.returncode == 0
    with open(os.path.join(os.fsencode(src), ODD_NAME), "rb") as f:
        odd = f.read()
    expected = (src / "a" / "multi.bin").read_bytes() + (src / "hello.txt").read_bytes() + odd
    assert result.stdout == expected


def test_cat_follows_a_symlink_inside_the_bundle(packed):
    _src, bundle = packed
    assert run_cli("cat", bundle, "link").stdout == b"hello\n"


def test_cat_of_a_directory_is_one_line_error(packed):
    _src, bundle = packed
    assert "directory" in assert_one_line_error(run_cli("cat", bundle, "a"))


def test_a_missing_path_is_one_line_error(packed):
    _src, bundle = packed
    line = assert_one_line_error(run_cli("ls", bundle, "no/such/file"))
    assert "does not exist" in line


def test_not_a_bundle_is_one_line_error(tmp_path):
    line = assert_one_line_error(run_cli("info", tmp_path))
    assert "not a bundle" in line


def test_a_missing_bundle_is_one_line_error(tmp_path):
    assert_one_line_error(run_cli("ls", tmp_path / "nothing-here"))


def test_an_incomplete_bundle_is_one_line_error_that_says_so(tmp_path):
    (tmp_path / "half.bundle" / "index").mkdir(parents=True)
    line = assert_one_line_error(run_cli("info", tmp_path / "half.bundle"))
    assert "incomplete" in line


def test_extract_into_a_non_empty_dest_without_force_is_one_line_error(packed, tmp_path):
    _src, bundle = packed
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "something").write_bytes(b"")
    assert "--force" in assert_one_line_error(run_cli("extract", bundle, tmp_path / "dest"))


def test_extract_prints_a_summary(packed, tmp_path):
    _src, bundle = packed
    result = run_cli("extract", bundle, tmp_path / "out")
    assert result.returncode == 0
    assert result.stdout.decode().startswith("extracted 12 files, 6 dirs, 4 symlinks, 1 hard")


def test_the_console_script_entry_point_is_cli_main():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "bundlefs"]
    assert script.value == "bundlefs.cli:main"


def test_importing_the_cli_does_not_import_fuse():
    import subprocess
    import sys

    code = "import sys, bundlefs.cli; print('pyfuse3' in sys.modules or 'trio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout
    assert out.strip() == b"False"


def test_mount_option_owner_with_a_value_is_ours_and_without_one_is_mount8s_flag():
    from bundlefs.cli.mount import parse_mount_options

    assert parse_mount_options(["ro,owner=mounter,nofail"]) == {"owner": "mounter"}
    assert parse_mount_options(["ro,owner,group"]) == {}
