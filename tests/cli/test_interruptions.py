"""Interruptions are clean and said (issue 22): SIGTERM, SIGHUP and SIGINT stop ``pack``, ``merge``,
``extract``, ``export`` and uploads to an object store the way Ctrl-C always did, remove what the
command had begun, say in one line what they removed, and exit 128 + the signal.

Each test runs the real command line in a subprocess that pauses at a chosen point (``paused``:
a library function wrapped to announce, by a file, that its Nth call has begun, then wait), and
sends it a real signal there: the same moment every run, without timing guesses. The same pause
lets a file change while ``pack`` reads it: that pack's exit status is not 0 (issue 22, "Scripts").
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from bundlefs import PackOptions, pack
from tests.conftest import build_tree, pseudo_random_bytes
from tests.support.pausing import interrupted, paused
from tests.support.s3server import S3Server, s3_server
from tests.support.trees import assert_one_line_error, run_cli

__all__ = ["s3_server"]  # a fixture, imported to be found


def names(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    spec = {f"f{i}": pseudo_random_bytes(40_000, i) for i in range(6)}
    return build_tree(tmp_path / "src", {**spec, "d": {"g": b"g" * 100}})


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_during_pack_removes_the_partial_bundle_and_says_so(tmp_path, tree, signum):
    # Paused before sealing: the shards and the index are written, the bundle is not complete.
    status, err = interrupted(
        tmp_path, "bundlefs.storage.publish:seal", 1, signum, "pack", tree, tmp_path / "b.bundle"
    )
    assert status == 128 + signum
    assert len(err) == 1, err
    assert err[0].startswith(f"bundlefs: error: interrupted by {signal.Signals(signum).name}; ")
    assert f"removed the partial bundle {tmp_path}/.b.bundle.partial-" in err[0]
    assert names(tmp_path) == ["src"]


def test_what_a_killed_pack_leaves_names_bundlefs_gc(tmp_path, tree):
    # SIGKILL cannot be caught: the partial stays, and whoever finds it is told what removes it.
    status, err = interrupted(
        tmp_path, "bundlefs.storage.publish:seal", 1, signal.SIGKILL,
        "pack", tree, tmp_path / "b.bundle",
    )  # fmt: skip
    assert status == -signal.SIGKILL
    [partial] = [n for n in names(tmp_path) if n.startswith(".b.bundle.partial-")]
    result = run_cli("info", tmp_path / partial)
    line = assert_one_line_error(result)
    assert line.endswith(f"what a killed one left, which 'bundlefs gc {tmp_path}' removes")
    assert run_cli("gc", tmp_path).returncode == 0
    assert names(tmp_path) == ["src"]


def test_a_signal_during_merge_removes_the_partial_bundle_and_says_so(tmp_path, tree):
    parts = [tmp_path / "a.bundle", tmp_path / "b.bundle"]
    for part in parts:
        pack(str(tree), str(part), PackOptions(created_ns=1))
    status, err = interrupted(
        tmp_path, "bundlefs.storage.publish:seal", 1, signal.SIGTERM,
        "merge", *parts, tmp_path / "all.bundle", "--at", "a", "--at", "b",
    )  # fmt: skip
    assert status == 143
    assert len(err) == 1, err
    assert err[0].startswith("bundlefs: error: interrupted by SIGTERM; removed the partial bundle ")
    assert f"{tmp_path}/.all.bundle.partial-" in err[0]
    assert names(tmp_path) == ["a.bundle", "b.bundle", "src"]


@pytest.fixture
def bundle(tmp_path: Path, tree: Path) -> Path:
    path = tmp_path / "t.bundle"
    pack(str(tree), str(path), PackOptions(created_ns=1))
    return path


# Paused at the third file: two are on disk already.
_THIRD_FILE = ("bundlefs.read.extract:_Writer._write_file", 3)


def test_a_signal_during_extract_to_a_new_directory_leaves_no_partial_tree(tmp_path, bundle):
    out = tmp_path / "out"
    status, err = interrupted(tmp_path, *_THIRD_FILE, signal.SIGTERM, "extract", bundle, out)
    assert status == 143
    assert len(err) == 1, err
    assert err[0].startswith("bundlefs: error: interrupted by SIGTERM; removed the partial tree ")
    assert f"{tmp_path}/.out.partial-" in err[0]
    assert names(tmp_path) == ["src", "t.bundle"]


def test_a_signal_during_extract_into_an_empty_directory_empties_it_again(tmp_path, bundle):
    out = tmp_path / "out"
    out.mkdir()
    status, err = interrupted(tmp_path, *_THIRD_FILE, signal.SIGHUP, "extract", bundle, out)
    assert status == 129
    assert err == [
        f"bundlefs: error: interrupted by SIGHUP; removed what it had extracted into {out}"
    ]
    assert names(out) == []


def test_a_signal_during_a_forced_extract_says_where_the_partial_tree_is(tmp_path, bundle):
    out = build_tree(tmp_path / "out", {"mine.txt": b"kept"})
    status, err = interrupted(
        tmp_path, *_THIRD_FILE, signal.SIGINT, "extract", bundle, out, "--force"
    )
    assert status == 130
    assert err == [f"bundlefs: error: interrupted by SIGINT; {out} holds a partly extracted tree"]
    assert (out / "mine.txt").read_bytes() == b"kept"


def test_a_signal_during_export_removes_the_partial_tar(tmp_path, bundle):
    status, err = interrupted(
        tmp_path, "bundlefs.read.export:export_tar", 1, signal.SIGTERM,
        "export", bundle, tmp_path / "t.tar",
    )  # fmt: skip
    assert status == 143
    assert len(err) == 1, err
    assert err[0].startswith(
        "bundlefs: error: interrupted by SIGTERM; removed the partial tar "
        f"{tmp_path}/.t.tar.partial-"
    )
    assert names(tmp_path) == ["src", "t.bundle"]


# -- uploads to an object store --------------------------------------------------------------------


@pytest.fixture
def store(s3_server: S3Server) -> S3Server:
    pytest.importorskip("s3fs")
    s3_server.create_bucket("interrupted")
    return s3_server


@pytest.mark.parametrize("command", ["pack", "merge"])
def test_a_signal_during_an_upload_removes_what_was_uploaded(
    tmp_path, tree, bundle, store, command
):
    # The index, its page table (format version 6) and the one shard are uploaded (in
    # parallel); paused as the marker's upload begins, the fourth call.
    url = f"s3://interrupted/{command}.bundle"
    staging = tmp_path / "staging"
    staging.mkdir()
    source = [tree] if command == "pack" else [bundle]
    status, err = interrupted(
        tmp_path, "bundlefs.storage.objectstore.upload:RemotePublisher._upload", 4, signal.SIGTERM,
        command, *source, url, "--staging", staging,
        "--storage-option", f"endpoint_url={store.endpoint}",
        env={"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"},
    )  # fmt: skip
    assert status == 143
    assert len(err) == 1, err
    assert err[0].startswith(
        f"bundlefs: error: interrupted by SIGTERM; removed the 3 objects it had uploaded to "
        f"{url}; removed the partial bundle {staging}/.{command}.bundle.partial-"
    )
    listed = store.client().list_objects_v2(Bucket="interrupted", Prefix=f"{command}.bundle")
    assert listed.get("KeyCount") == 0
    assert names(staging) == []


# -- a pack whose source changed under it ----------------------------------------------------------


def test_pack_exits_3_when_a_file_changed_while_it_was_packed(tmp_path):
    src = build_tree(tmp_path / "src", {"a": pseudo_random_bytes(2_000_000, 1)})
    dest = tmp_path / "b.bundle"
    # A file over 1 MiB is read as it is stored, chunk by chunk (-j 1: in the main thread);
    # paused at its first chunk.
    where = "bundlefs.packing.content:ContentWriter._append"
    with paused(tmp_path, where, 1, "pack", "-j", "1", "-q", src, dest) as (process, ready):
        with open(src / "a", "ab") as f:
            f.write(b"more")
        ready.unlink()
        _, err = process.communicate(timeout=60)
    assert process.returncode == 3
    assert err.decode().splitlines() == [
        "bundlefs: warning: a changed while it was packed; stored the bytes read"
    ]
    assert dest.is_dir()  # published all the same, as tar writes its archive


def test_pack_exits_4_when_skip_errors_left_files_out(tmp_path):
    big = pseudo_random_bytes(2_000_000, 1)
    src = build_tree(tmp_path / "src", {"a": big, "b": big})
    dest = tmp_path / "b.bundle"
    # Unreadable even by root: paused before the packer opens "b" (over 1 MiB: opened as it is
    # stored), which is removed meanwhile.
    where = "bundlefs.packing.sources.directory:DirectorySource.open"
    args = ("pack", "-j", "1", "-q", "--skip-errors", src, dest)
    with paused(tmp_path, where, 2, *args) as (process, ready):
        (src / "b").unlink()
        ready.unlink()
        _, err = process.communicate(timeout=60)
    assert process.returncode == 4, err
    assert dest.is_dir()
