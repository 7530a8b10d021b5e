"""``bundlefs pack SRC NEW --base OLD`` as a user meets it: the reuse line, ``--json``, one-sentence
errors, and a pack killed at any point, which leaves OLD untouched and nothing that opens as NEW."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bundlefs import Bundle
from bundlefs.core import format as fmt
from bundlefs.errors import NotABundleError
from bundlefs.read.verify import verify
from tests.conftest import bundle_file_bytes
from tests.support.legacy_trees import V5_BUNDLE, build_v1_tree
from tests.support.pausing import paused
from tests.support.trees import MTIME_NS, assert_one_line_error, run_cli, set_mtimes

FILES = 1600


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tree packed as OLD, then changed: half its files rewritten, one added."""
    root = tmp_path_factory.mktemp("delta")
    src = root / "src"
    rng = random.Random(7)
    for i in range(FILES):
        path = src / f"d{i % 20:02d}" / f"f{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(12 * 1024))
    set_mtimes(src, MTIME_NS)
    result = run_cli("pack", "-q", "--shard-size", "4M", src, root / "old.bundle")
    assert result.returncode == 0, result.stderr
    for i in range(0, FILES, 2):
        (src / f"d{i % 20:02d}" / f"f{i:05d}.bin").write_bytes(rng.randbytes(12 * 1024))
    (src / "added.txt").write_bytes(b"new\n")
    return src, root / "old.bundle"


def test_pack_on_a_base_says_what_it_reused_and_what_it_stored(versions, tmp_path):
    src, old = versions
    result = run_cli("pack", src, tmp_path / "new.bundle", "--base", old)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[0].startswith("packed 1,601 files")
    assert lines[1].startswith(f"reused 800 files (9.4 MiB) from {old}, stored 801 (")
    assert lines[1].endswith("shards")


def test_pack_json_on_a_base_has_the_reuse_counts(versions, tmp_path):
    src, old = versions
    result = run_cli("pack", "--json", src, tmp_path / "new.bundle", "--base", old)
    reuse = json.loads(result.stdout)["reuse"]
    assert (reuse["reused_files"], reuse["stored_files"], reuse["same_files"]) == (800, 801, 0)
    assert reuse["ways"] == {"link": reuse["shards_linked"]}


def test_a_missing_base_is_a_one_line_error(versions, tmp_path):
    src, _old = versions
    result = run_cli("pack", src, tmp_path / "new.bundle", "--base", tmp_path / "nope")
    assert "is not a bundle (no such directory)" in assert_one_line_error(result)


def test_base_with_dask_packs_on_the_cluster_and_says_what_it_reused(versions, tmp_path):
    pytest.importorskip("distributed")
    src, old = versions
    new = tmp_path / "n.bundle"
    args = ("--base", old, "--dask", "local:2", "--partitions", "3")
    result = run_cli("pack", src, new, *args)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[0].startswith("packed 1,601 files")
    assert lines[1].startswith(f"reused 800 files (9.4 MiB) from {old}, stored 801 (")
    assert verify(new).ok


def test_compact_with_dask_is_a_usage_error(versions, tmp_path):
    src, old = versions
    args = ("--base", old, "--compact", "--dask", "local:1")
    result = run_cli("pack", src, tmp_path / "n.bundle", *args)
    assert "--compact compacts in one process" in assert_one_line_error(result, 2)


def _tar(src: Path, out: Path) -> Path:
    subprocess.run(["tar", "czf", str(out), "-C", str(src), "."], check=True)
    return out


def test_a_tar_on_stdin_packs_on_a_base_packed_from_a_tar(versions, tmp_path):
    shared, _old = versions
    src = tmp_path / "src"
    shutil.copytree(shared, src)  # the fixture's tree is shared: changed here in a copy
    tarball = _tar(src, tmp_path / "src.tar.gz")
    result = run_cli("pack", "-q", tarball, tmp_path / "old.bundle")
    assert result.returncode == 0, result.stderr
    (src / "added.txt").write_bytes(b"newer\n")
    _tar(src, tarball)
    with tarball.open("rb") as stdin:
        result = subprocess.run(
            [sys.executable, "-m", "bundlefs", "pack", "--json", "-", str(tmp_path / "new.bundle"),
             "--base", str(tmp_path / "old.bundle")],
            stdin=stdin, capture_output=True, timeout=120,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    reuse = json.loads(result.stdout)["reuse"]
    assert (reuse["reused_files"], reuse["stored_files"]) == (FILES, 1)
    with Bundle(tmp_path / "new.bundle") as b:
        assert b.read("added.txt") == b"newer\n"
    assert verify(tmp_path / "new.bundle").ok


def test_files_from_packs_on_a_base(versions, tmp_path):
    src, old = versions
    names = sorted(str(p.relative_to(src)) for p in src.rglob("*.bin"))[:100]
    (tmp_path / "list").write_text("\n".join(names) + "\n")
    result = run_cli(
        "pack", "--json", "--files-from", tmp_path / "list", src, tmp_path / "new.bundle",
        "--base", old,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    reuse = json.loads(result.stdout)["reuse"]
    # The first 100 names: d00's 80 files (even numbers: rewritten since OLD), d01's first 20.
    assert (reuse["reused_files"], reuse["stored_files"]) == (20, 80)
    assert verify(tmp_path / "new.bundle").ok


def test_an_unknown_check_is_a_usage_error(versions, tmp_path):
    src, old = versions
    result = run_cli("pack", src, tmp_path / "n.bundle", "--base", old, "--check", "inode")
    assert result.returncode == 2 and b"invalid choice: 'inode'" in result.stderr


def test_check_strict_reuses_the_files_whose_ctime_and_inode_old_recorded(versions, tmp_path):
    src, old = versions
    args = ("--json", "--base", old, "--check", "strict", "--racy-seconds", "0")
    result = run_cli("pack", src, tmp_path / "new.bundle", *args)
    assert result.returncode == 0, result.stderr
    reuse = json.loads(result.stdout)["reuse"]
    assert (reuse["reused_files"], reuse["stored_files"], reuse["unrecorded_files"]) == (
        800,
        801,
        0,
    )


def test_check_strict_on_a_version_5_base_compares_by_content_and_json_says_so(tmp_path):
    src = build_v1_tree(tmp_path / "src")
    options = ("--record-size", "4096", "--block-size", "512", "--shard-size", "4000")
    args = ("--base", V5_BUNDLE, "--check", "strict", *options)
    result = run_cli("pack", "--json", src, tmp_path / "new.bundle", *args)
    assert result.returncode == 0, result.stderr
    reuse = json.loads(result.stdout)["reuse"]
    # Twenty files of content (the empty one needs none, the hard link's second name is one):
    # no source record in a version-5 bundle, so each is compared by its digest, none trusted.
    assert (reuse["unrecorded_files"], reuse["digest_compared"]) == (20, 20)
    assert (reuse["reused_files"], reuse["same_files"], reuse["stored_files"]) == (0, 20, 0)
    text = run_cli("pack", src, tmp_path / "again.bundle", *args).stdout.decode()
    assert text.splitlines()[1].endswith(
        "; --check strict compared 20 files by content (OLD has no source record of them)"
    )


def test_no_sources_leaves_strict_nothing_to_trust(versions, tmp_path):
    src, _old = versions
    plain = tmp_path / "plain.bundle"
    assert run_cli("pack", "-q", "--no-sources", src, plain).returncode == 0
    args = ("--json", "--base", plain, "--check", "strict", "--racy-seconds", "0")
    reuse = json.loads(run_cli("pack", src, tmp_path / "new.bundle", *args).stdout)["reuse"]
    assert reuse["reused_files"] == 0 and reuse["unrecorded_files"] == reuse["same_files"] == 1601


def _partial(dest: Path) -> list[Path]:
    return [p for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}.partial-")]


# What the partial directory holds when the kill comes.
KILL_POINTS: dict[str, Callable[[Path], bool]] = {
    "partial directory created": lambda p: p.is_dir(),
    "own shard opened": lambda p: any(p.glob("shard-*")),
    "base shard linked": lambda p: (p / fmt.shard_filename(0)).exists(),
    "completion marker written": lambda p: (p / fmt.MARKER_NAME).exists(),
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_pack_on_a_base_killed_leaves_the_base_untouched_and_no_new_bundle(
    versions, tmp_path, point
):
    src, old = versions
    before = bundle_file_bytes(old)
    dest = tmp_path / "new.bundle"
    process = subprocess.Popen(
        [sys.executable, "-m", "bundlefs", "pack", "-q", str(src), str(dest), "--base", str(old)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    killed = False
    while process.poll() is None and time.monotonic() < deadline and not killed:
        partial = [p for p in _partial(dest) if KILL_POINTS[point](p)]
        if partial:
            process.send_signal(signal.SIGKILL)
            killed = True
        time.sleep(0.0005)
    process.wait()
    assert killed or point == "completion marker written", f"finished before {point!r}"
    assert bundle_file_bytes(old) == before
    assert verify(old).ok
    if killed and not dest.exists():
        with pytest.raises(NotABundleError):
            Bundle(dest)
    else:  # finished (or renamed into place) before the kill: then whole
        assert verify(dest).ok


def test_pack_on_a_base_with_compact_says_what_it_compacted(versions, tmp_path):
    src, old = versions
    new = tmp_path / "new.bundle"
    result = run_cli("pack", src, new, "--base", old, "--compact", "--min-live", "90%")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[0].startswith("packed 1,601 files") and lines[1].startswith("reused 800 files")
    assert lines[2].startswith("compacted: ") and "rewritten into" in lines[2]
    assert len(lines) == 3 and verify(new).ok


def test_pack_json_on_a_base_with_compact_has_the_compaction(versions, tmp_path):
    src, old = versions
    result = run_cli("pack", "--json", src, tmp_path / "n.bundle", "--base", old, "--compact")
    assert result.returncode == 0, result.stderr
    compaction = json.loads(result.stdout)["compaction"]
    assert compaction["dead_bytes"] <= compaction["dead_bytes_before"]
    assert {"kept", "rewritten", "written", "records_copied", "own_bytes"} <= set(compaction)


def test_compact_without_a_base_is_a_usage_error(versions, tmp_path):
    src, _old = versions
    result = run_cli("pack", src, tmp_path / "n.bundle", "--compact")
    assert "--compact compacts a pack on a base" in assert_one_line_error(result, 2)


def test_min_live_without_compact_is_a_usage_error(versions, tmp_path):
    src, old = versions
    result = run_cli("pack", src, tmp_path / "n.bundle", "--base", old, "--min-live", "0.3")
    assert "give --compact too" in assert_one_line_error(result, 2)


@pytest.mark.parametrize(
    "where",
    ["bundlefs.storage.shard_writer:ShardWriter.write_stored", "bundlefs.storage.publish:seal"],
)
def test_a_compacting_pack_killed_leaves_the_base_untouched_and_no_new_bundle(
    versions, tmp_path, where
):
    # The second seal is NEW's: the pack on the base inside its partial directory is sealed first.
    src, old = versions
    before = bundle_file_bytes(old)
    dest = tmp_path / "new.bundle"
    nth = 2 if where.endswith("seal") else 1
    args = ("pack", "-q", src, dest, "--base", old, "--compact", "--min-live", "1")
    with paused(tmp_path, where, nth, *args) as (process, _ready):
        process.kill()
        process.wait()
    assert bundle_file_bytes(old) == before
    with pytest.raises(NotABundleError):
        Bundle(dest)
    result = run_cli(*args)  # the next one clears up
    assert result.returncode == 0, result.stderr
    assert [p.name for p in tmp_path.iterdir() if ".partial-" in p.name] == []
    assert verify(dest).ok
