"""A new user's first minutes (issue 11, §1): every paper cut of installing, mounting and packing.

Each test runs the real command line in a subprocess, as a user would. Where a test needs the
machine to lack something (the FUSE bindings, /dev/fuse, /dev/log, read permission for root), it
takes it away from that one process only: an import blocker, a private mount namespace
(``unshare -m``) or a bounding set without the DAC capabilities (``setpriv``). Nothing on the host
changes, and every mount is unmounted, in ``finally`` or with the namespace that held it.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bundlefs import Bundle, PackOptions, pack
from bundlefs.core import format as fmt
from bundlefs.mount.options import DEFAULT_INDEX_RESIDENT, DEFAULT_READ_AHEAD_KB
from bundlefs.read.options import DEFAULT_CACHE_SIZE
from tests.conftest import build_tree, pseudo_random_bytes
from tests.support.mounting import Mount, is_mounted, mounted
from tests.support.trees import assert_one_line_error, run_cli

SMALL_RECORD = 16 * 1024
TREE = {"a.txt": b"first tree\n", "dir": {"b.txt": b"b" * 100}}
OTHER_TREE = {"c.txt": b"second tree\n", "d.txt": b"d", "e.txt": b"e"}

_BLOCK_FUSE = """
import sys
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pyfuse3", "trio"):
            raise ImportError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Blocker())
from bundlefs.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _needs(*tools: str) -> None:
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")


def _in_private_namespace(
    script: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``sh -c script`` in a private mount namespace: its binds and mounts die with it."""
    _needs("unshare")
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    dest = tmp_path / "b.bundle"
    pack(str(build_tree(tmp_path / "src", TREE)), str(dest))
    return dest


# -- 1. the FUSE bindings are an extra -------------------------------------------------------------


def test_mount_without_pyfuse3_names_the_extra_in_one_sentence(bundle, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", _BLOCK_FUSE, "mount", str(bundle), str(mnt)],
        capture_output=True,
        timeout=60,
    )
    line = assert_one_line_error(result)
    assert "pyfuse3 is not installed" in line
    assert "pip install 'bundlefs[mount]'" in line
    assert "bundlefs.Bundle" in line  # and what works without it
    assert not is_mounted(mnt)


# -- 2. the mount point and /dev/fuse --------------------------------------------------------------


@pytest.mark.mount
def test_mount_refuses_a_directory_that_is_not_empty(bundle, tmp_path):
    mnt = build_tree(tmp_path / "mnt", {"mine.txt": b"keep me visible"})
    line = assert_one_line_error(run_cli("mount", bundle, mnt))
    assert f"mountpoint {mnt} is not empty" in line
    assert "--allow-nonempty" in line and "-o nonempty" in line
    assert not is_mounted(mnt)
    assert (mnt / "mine.txt").read_bytes() == b"keep me visible"


@pytest.mark.mount
@pytest.mark.parametrize("flag", [["--allow-nonempty"], ["-o", "ro,nonempty"]])
def test_allow_nonempty_mounts_over_a_directory_that_is_not_empty(flag, bundle, tmp_path):
    mnt = build_tree(tmp_path / "mnt", {"mine.txt": b"hidden while mounted"})
    with mounted(bundle, mnt, *flag, log_path=tmp_path / "daemon.log") as m:
        assert sorted(os.listdir(m.mountpoint)) == ["a.txt", "dir"]
    assert (mnt / "mine.txt").read_bytes() == b"hidden while mounted"


@pytest.mark.mount
def test_a_relative_log_file_is_taken_from_the_callers_directory(bundle, tmp_path):
    # The detached daemon changes its directory to /: the CLI makes the path absolute first.
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "bundlefs", "mount", "--log-file", "rel.log", bundle, mnt],
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert (tmp_path / "rel.log").exists()
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], timeout=30)


@pytest.mark.mount
def test_mount_on_a_regular_file_says_it_is_not_a_directory(bundle, tmp_path):
    target = tmp_path / "afile"
    target.write_bytes(b"")
    line = assert_one_line_error(run_cli("mount", bundle, target))
    assert line.endswith(f"mountpoint {target} is not a directory")


@pytest.mark.mount
@pytest.mark.parametrize(
    "hide, expected",
    [
        # /dev without the device, as in a container started without --device /dev/fuse
        ("mount -t tmpfs none /dev", "/dev/fuse does not exist"),
        # something else in its place
        ("mount --bind /dev/null /dev/fuse", "/dev/fuse is not the FUSE device"),
    ],
    ids=["missing", "not-the-device"],
)
def test_mount_without_dev_fuse_says_so_and_points_to_the_python_api(
    hide, expected, bundle, tmp_path
):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = f"set -e\n{hide}\nexec {sys.executable} -m bundlefs mount {bundle} {mnt}\n"
    result = _in_private_namespace(script)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"bundlefs: error: {expected}")
    assert "the Python API (bundlefs.Bundle) reads bundles without FUSE" in lines[0]
    assert not is_mounted(mnt)


def test_mount_help_names_the_daemons_defaults():
    help_text = " ".join(run_cli("mount", "--help").stdout.decode().split())
    assert f"default: {DEFAULT_READ_AHEAD_KB})" in help_text
    assert f"(default: {DEFAULT_INDEX_RESIDENT >> 20}MiB; 0: never)" in help_text
    assert f"e.g. 512MiB (default: {DEFAULT_CACHE_SIZE >> 20}MiB)" in help_text


# -- 3. the daemon's log without /dev/log ----------------------------------------------------------


def _damaged_copy(tmp_path: Path) -> Path:
    """A bundle whose file noise.bin spans a record that fails its CRC."""
    dest = tmp_path / "damaged.bundle"
    noise = pseudo_random_bytes(3 * SMALL_RECORD, seed=7, compressible=False)
    source = build_tree(tmp_path / "damaged.src", {"ok.txt": b"fine\n", "noise.bin": noise})
    pack(str(source), str(dest), PackOptions(record_size=SMALL_RECORD))
    with Bundle(dest) as b:
        entry = b.resolve("noise.bin")
        record = b.content.record_at(entry.shard, entry.offset + SMALL_RECORD)
    with open(dest / fmt.shard_filename(record.shard), "r+b") as f:
        f.seek(record.stored_offset + 10)
        f.write(b"\xff\x00\xff")
    return dest


@pytest.mark.mount
def test_without_dev_log_a_detached_daemon_logs_damage_under_xdg_state_home(tmp_path):
    _needs("fusermount3")
    bundle = _damaged_copy(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    state = tmp_path / "state"
    # Documented (docs/mount.md): $XDG_STATE_HOME/bundlefs/mount-<mount point, / as ->.log
    log = state / "bundlefs" / f"mount-{str(mnt).strip('/').replace('/', '-')}.log"
    # /dev/log is hidden in the namespace (if the host has one); the daemon detaches as usual.
    script = f"""
trap 'fusermount3 -u -z {mnt} 2>/dev/null' EXIT
if [ -e /dev/log ]; then mount --bind /dev/null /dev/log || exit 3; fi
{sys.executable} -m bundlefs mount {bundle} {mnt} || exit 4
cat {mnt}/ok.txt || exit 5
if cat {mnt}/noise.bin > /dev/null 2>&1; then exit 6; fi
{sys.executable} -m bundlefs umount {mnt} || exit 7
"""
    env = dict(os.environ, XDG_STATE_HOME=str(state))
    result = _in_private_namespace(script, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "fine\n"
    text = log.read_text()
    assert "damaged data, read failed with EIO" in text and "noise.bin" in text, text
    assert not is_mounted(mnt)


# -- 4. info MNT asks the daemon -------------------------------------------------------------------


@dataclass
class Replaced:
    mount: Mount
    old_id: str
    new_id: str


@pytest.fixture
def replaced_mount(bundle, tmp_path) -> Iterator[Replaced]:
    """``bundle`` mounted, then replaced on disk by ``pack --force`` of another tree."""
    with Bundle(bundle) as b:
        old_id = b.info().bundle_id.hex()
    with mounted(bundle, tmp_path / "mnt", log_path=tmp_path / "daemon.log") as m:
        other = build_tree(tmp_path / "other.src", OTHER_TREE)
        result = run_cli("pack", "--force", "--quiet", other, bundle)
        assert result.returncode == 0, result.stderr
        with Bundle(bundle) as b:
            new_id = b.info().bundle_id.hex()
        assert new_id != old_id
        yield Replaced(m, old_id, new_id)


@pytest.mark.mount
def test_info_json_on_a_mount_describes_the_bundle_served_not_the_one_now_on_disk(
    replaced_mount,
):
    m = replaced_mount.mount
    assert sorted(os.listdir(m.mountpoint)) == ["a.txt", "dir"]  # the mount serves the old one
    result = run_cli("info", "--json", m.mountpoint)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["bundle_id"] == replaced_mount.old_id
    assert (facts["files"], facts["dirs"]) == (2, 2)
    assert facts["path"] == str(m.bundle)
    assert facts["replaced_on_disk_by"] == f"bundle {replaced_mount.new_id}"
    assert isinstance(facts["daemon"]["cache_hits"], int)


@pytest.mark.mount
def test_info_on_a_mount_says_the_bundle_on_disk_was_replaced(replaced_mount):
    result = run_cli("info", replaced_mount.mount.mountpoint)
    assert result.returncode == 0, result.stderr
    rows = dict(line.split(None, 1) for line in result.stdout.decode().splitlines())
    assert rows["files"].strip() == "2"
    assert replaced_mount.new_id in result.stdout.decode()
    assert "remount to serve that" in result.stdout.decode()


# -- 5. --skip-errors and unreadable directories ---------------------------------------------------


def _pack_without_dac_override(*args: str | os.PathLike) -> subprocess.CompletedProcess:
    """``bundlefs pack ARGS`` unable to read past permissions, even as root."""
    _needs("setpriv")
    command = [sys.executable, "-m", "bundlefs", "pack", *map(os.fspath, args)]
    if os.getuid() == 0:
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.fixture
def locked_source(tmp_path: Path) -> Iterator[Path]:
    src = build_tree(tmp_path / "src", {"ok": {"f": b"x"}, "locked": {"inner": {"g": b"y"}}})
    (src / "locked").chmod(0)
    try:
        yield src
    finally:
        (src / "locked").chmod(0o755)  # so pytest can remove it


def test_skip_errors_leaves_an_unreadable_directory_out_of_the_bundle(locked_source, tmp_path):
    dest = tmp_path / "out.bundle"
    result = _pack_without_dac_override("--skip-errors", "--json", locked_source, dest)
    assert result.returncode == 4, result.stderr  # published, with a directory left out
    assert result.stderr == "bundlefs: warning: skipping locked: Permission denied\n"
    assert json.loads(result.stdout)["skipped"] == ["locked"]
    with Bundle(dest) as b:
        assert not b.exists("locked")
        assert b.read("ok/f") == b"x"
        assert b.config.dir_count == 2


def test_an_unreadable_directory_fails_the_pack_naming_it(locked_source, tmp_path):
    dest = tmp_path / "out.bundle"
    result = _pack_without_dac_override(locked_source, dest)
    assert result.returncode == 1
    assert result.stderr == "bundlefs: error: cannot read locked: Permission denied\n"
    assert not dest.exists()


# -- 6. what killed packs leave: gc and info -------------------------------------------------------


def _leftover(directory: Path, name: str, pid: int) -> Path:
    """What a pack killed while writing ``name`` leaves: its partial, which nobody locks now."""
    partial = directory / f".{name}.partial-{pid}"
    build_tree(partial, {"index": {"data.mdb": b"\0" * 50_000}, "shard-000000": b"s" * 10_000})
    return partial


@pytest.fixture
def live_partial(tmp_path: Path) -> Iterator[Path]:
    """A partial a pack is writing: its lock is held (here, by this process)."""
    partial = _leftover(tmp_path, "live.bundle", 2)
    fd = os.open(partial, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield partial
    finally:
        os.close(fd)


def test_gc_removes_partials_nobody_holds_and_keeps_a_live_packs(live_partial, tmp_path):
    dead = _leftover(tmp_path, "x.bundle", 1)
    result = run_cli("gc", tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert f"removed {dead} (" in out
    assert f"kept {live_partial}: a pack is writing it" in out
    assert out.splitlines()[-1].startswith("removed 1 partial bundle (")
    assert not dead.exists() and live_partial.exists()


def test_gc_dry_run_removes_nothing(tmp_path):
    dead = _leftover(tmp_path, "x.bundle", 1)
    result = run_cli("gc", "--dry-run", "--json", tmp_path)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert [p["path"] for p in facts["removed"]] == [str(dead)]
    assert facts["freed_bytes"] == 0
    assert dead.exists()


def test_gc_of_a_bundle_removes_only_that_bundles_partials(bundle, tmp_path):
    mine = _leftover(tmp_path, bundle.name, 1)
    other = _leftover(tmp_path, "other.bundle", 1)
    assert run_cli("gc", bundle).returncode == 0
    assert not mine.exists() and other.exists()
    with Bundle(bundle) as b:  # the bundle itself untouched
        assert b.read("a.txt") == TREE["a.txt"]


def test_info_of_a_directory_holding_partials_mentions_them_and_gc(tmp_path):
    _leftover(tmp_path, "x.bundle", 1)
    line = assert_one_line_error(run_cli("info", tmp_path))
    assert f"{tmp_path} is not a bundle" in line
    assert "1 partial bundle left by killed packs" in line
    assert f"'bundlefs gc {tmp_path}'" in line


def test_info_of_a_bundle_mentions_partials_beside_it(bundle, tmp_path):
    _leftover(tmp_path, "x.bundle", 1)
    out = run_cli("info", bundle).stdout.decode()
    assert f"1 left by killed packs in {tmp_path}" in out
    facts = json.loads(run_cli("info", "--json", bundle).stdout)
    assert [os.path.basename(p["path"]) for p in facts["stale_partials"]] == [".x.bundle.partial-1"]


def test_info_of_a_bundle_does_not_mention_a_live_pack(bundle, live_partial):
    assert "stale_partials" not in json.loads(run_cli("info", "--json", bundle).stdout)


def test_pack_force_over_a_directory_that_is_not_a_bundle_names_it(tmp_path):
    src = build_tree(tmp_path / "src", TREE)
    dest = build_tree(tmp_path / "dest", {"notes.txt": b"mine"})
    line = assert_one_line_error(run_cli("pack", "--force", src, dest))
    assert line == f"bundlefs: error: {dest} exists and is not a bundle; refusing to replace it"


def test_gc_leaves_a_directory_that_only_looks_like_a_partial(tmp_path):
    mine = build_tree(tmp_path / ".notes.partial-drafts", {"draft.txt": b"mine"})
    result = run_cli("gc", tmp_path)
    assert result.returncode == 0, result.stderr
    assert (mine / "draft.txt").read_bytes() == b"mine"


# -- 7. docs ---------------------------------------------------------------------------------------


def test_the_systemd_unit_points_to_a_document_that_exists():
    root = Path(__file__).resolve().parents[2]
    unit = (root / "systemd" / "bundlefs@.service").read_text()
    assert "docs/systemd.md" in unit
    doc = (root / "docs" / "systemd.md").read_text()
    assert "bundlefs@" in doc and "systemd-escape" in doc and "journalctl" in doc
