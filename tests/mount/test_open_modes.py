"""Both open paths of the mount, checked with real tools against the source tree.

"no-open" (the patched pyfuse3: the kernel serves opens and cached reads without the daemon) and
"open" (every open answered by the daemon, as with a stock pyfuse3) must serve identical trees:
``diff -r``, ``cp -a``, ``rsync -c``, ``tar``, ``git fsck``, ``sqlite3``, ``find -printf`` and
``mmap`` see the mount as they see the source. The stats xattr says which path serves, and its
request counters show what each path costs the daemon. A stock pyfuse3 (built by ``make test``
beside the venv) falls back to the open path by itself.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bundlefs import PackOptions, pack
from tests.conftest import FIXED_MTIME_NS, SAMPLE_SPEC, build_tree, pseudo_random_bytes

pytestmark = pytest.mark.mount

MODES = ("no-open", "open")
STATS = "user.bundlefs.stats"


def run(*command: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def check(*command: str, cwd: Path | None = None) -> str:
    result = run(*command, cwd=cwd)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout


def stats(mountpoint: Path) -> dict:
    return json.loads(os.getxattr(mountpoint, STATS))


def _git(repo: Path, *args: str) -> str:
    env_args = ("-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "gc.auto=0")
    return check("git", *env_args, *args, cwd=repo)


@pytest.fixture(scope="module")
def tools_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample tree plus a git repository and an SQLite database (real tools' own formats)."""
    root = build_tree(tmp_path_factory.mktemp("tools") / "src", SAMPLE_SPEC)
    repo = root / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    for i in range(3):
        (repo / f"module{i}.py").write_bytes(pseudo_random_bytes(3000 + i, seed=10 + i))
        _git(repo, "add", ".")
        _git(repo, "commit", "-q", "-m", f"commit {i}")
    _git(repo, "gc", "-q")  # packs as well as loose objects are read below
    (repo / "loose.txt").write_text("a loose object\n")
    _git(repo, "add", "loose.txt")
    _git(repo, "commit", "-q", "-m", "loose")
    db = sqlite3.connect(root / "data.sqlite")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, blob BLOB)")
    db.executemany(
        "INSERT INTO t (name, blob) VALUES (?, ?)",
        [(f"row {i}", pseudo_random_bytes(200 + i, seed=i)) for i in range(2000)],
    )
    db.commit()
    db.close()
    # Fixed mtimes everywhere, so tar and find compare equal byte for byte.
    for top, dirs, files in os.walk(root, topdown=False):
        for name in dirs + files:
            os.utime(os.path.join(top, name), ns=(FIXED_MTIME_NS,) * 2, follow_symlinks=False)
    os.utime(root, ns=(FIXED_MTIME_NS,) * 2)
    return root


@pytest.fixture(scope="module")
def tools_bundle(tools_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("tools-bundle") / "tools.bundle"
    pack(str(tools_tree), str(dest), PackOptions(record_size=16 * 1024))
    return dest


@pytest.fixture(scope="module", params=MODES)
def tools_mount(request, tools_bundle: Path, tmp_path_factory: pytest.TempPathFactory):
    from tests.support.mounting import mounted

    work = tmp_path_factory.mktemp(f"tools-{request.param}")
    with mounted(
        tools_bundle, work / "mnt", "--open-mode", request.param, log_path=work / "daemon.log"
    ) as m:
        assert stats(m.mountpoint)["open_mode"] == request.param
        yield m


def _find_listing(root: Path) -> str:
    # Directory sizes differ by design (a bundle reports its child count), so sizes are printed
    # for non-directories only.
    others = check(
        "find", ".", "!", "-type", "d", "-printf", "%P %y %m %s %T@ %l %n %U %G\n", cwd=root
    )
    dirs = check("find", ".", "-type", "d", "-printf", "%P %m %T@ %U %G\n", cwd=root)
    return "".join(sorted(others.splitlines(True))) + "".join(sorted(dirs.splitlines(True)))


def test_diff_finds_no_difference(tools_mount, tools_tree):
    assert (
        check("diff", "-r", "--no-dereference", str(tools_tree), str(tools_mount.mountpoint)) == ""
    )


def test_find_printf_lists_the_same_metadata(tools_mount, tools_tree):
    assert _find_listing(tools_mount.mountpoint) == _find_listing(tools_tree)


def test_cp_a_copies_an_identical_tree(tools_mount, tools_tree, tmp_path):
    copy = tmp_path / "copy"
    check("cp", "-a", str(tools_mount.mountpoint), str(copy))
    assert check("diff", "-r", "--no-dereference", str(tools_tree), str(copy)) == ""
    assert _find_listing(copy) == _find_listing(tools_tree)


def test_rsync_checksums_see_nothing_to_transfer(tools_mount, tools_tree):
    out = check(
        "rsync", "-a", "-H", "-c", "-n", "--itemize-changes", f"{tools_tree}/",
        f"{tools_mount.mountpoint}/",
    )  # fmt: skip
    assert out == ""


def test_tar_archives_are_byte_identical(tools_mount, tools_tree):
    def archive(root: Path) -> bytes:
        command = ["tar", "-c", "--sort=name", "--numeric-owner", "-f", "-", "."]
        result = subprocess.run(command, cwd=root, capture_output=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert archive(tools_mount.mountpoint) == archive(tools_tree)


def test_git_fsck_and_log_work_on_the_mount(tools_mount, tools_tree):
    repo = tools_mount.mountpoint / "repo"
    safe = ("-c", f"safe.directory={repo}")
    result = run("git", *safe, "fsck", "--full", "--strict", cwd=repo)
    assert result.returncode == 0, result.stderr
    log = check("git", *safe, "log", "--format=%H %s", cwd=repo)
    assert log == check("git", "log", "--format=%H %s", cwd=tools_tree / "repo")
    assert len(log.splitlines()) == 4


def test_sqlite3_reads_the_database(tools_mount, tools_tree):
    query = "PRAGMA integrity_check; SELECT count(*), sum(length(blob)), max(name) FROM t;"
    on_mount = check("sqlite3", "-readonly", str(tools_mount.mountpoint / "data.sqlite"), query)
    assert on_mount.splitlines()[0] == "ok"
    assert on_mount == check("sqlite3", "-readonly", str(tools_tree / "data.sqlite"), query)


def test_mmap_sees_the_file_bytes(tools_mount, tools_tree):
    for name in ("big.bin", "noise.bin", "zeros.bin", "hello.txt"):
        with (
            open(tools_mount.mountpoint / name, "rb") as f,
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m,
        ):
            assert m[:] == (tools_tree / name).read_bytes(), name


def test_write_opens_fail_with_erofs(tools_mount):
    target = tools_mount.mountpoint / "hello.txt"
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_WRONLY | os.O_APPEND):
        with pytest.raises(OSError) as caught:
            os.close(os.open(target, flags))
        assert caught.value.errno == errno.EROFS
    with pytest.raises(OSError) as caught:
        os.close(os.open(tools_mount.mountpoint / "new", os.O_WRONLY | os.O_CREAT, 0o644))
    assert caught.value.errno == errno.EROFS


# -- what each path costs the daemon ---------------------------------------------------------------


def _read_all(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            while os.read(fd, 1 << 20):
                pass
        finally:
            os.close(fd)


@pytest.fixture
def fresh_mount(mount_bundle, tools_bundle):
    def _mount(mode: str):
        return mount_bundle(tools_bundle, "--open-mode", mode)

    return _mount


def test_no_open_serves_warm_reads_without_requests(fresh_mount):
    m = fresh_mount("no-open")
    files = [m.mountpoint / n for n in ("hello.txt", "big.bin", "lines.txt", "dir/a.txt")]
    _read_all(files)  # cold: the daemon reads them once
    before = stats(m.mountpoint)["requests"]
    _read_all(files * 3)  # warm: the kernel serves opens and page-cached bytes on its own
    after = stats(m.mountpoint)["requests"]
    assert before["read"] > 0
    for op in ("open", "read", "release", "lookup", "getattr"):
        assert after[op] == before[op], op
    assert after["open"] <= 1  # the one OPEN answered ENOSYS switched the kernel to no_open


def test_no_open_caches_directory_listings(fresh_mount):
    m = fresh_mount("no-open")
    first = sorted(os.listdir(m.mountpoint / "dir"))
    before = stats(m.mountpoint)["requests"]
    for _ in range(3):
        assert sorted(os.listdir(m.mountpoint / "dir")) == first
    after = stats(m.mountpoint)["requests"]
    assert after["readdir"] == before["readdir"]
    assert after["opendir"] == before["opendir"] <= 1


def test_open_path_answers_every_open_and_keeps_the_page_cache(fresh_mount):
    m = fresh_mount("open")
    files = [m.mountpoint / n for n in ("hello.txt", "big.bin", "dir/a.txt")]
    _read_all(files)
    before = stats(m.mountpoint)["requests"]
    _read_all(files * 2)
    after = stats(m.mountpoint)["requests"]
    assert after["open"] - before["open"] == 6  # one round trip per open…
    assert after["read"] == before["read"]  # …but keep_cache: no bytes read twice


def test_info_says_which_open_path_serves(fresh_mount):
    for mode in MODES:
        m = fresh_mount(mode)
        out = check(sys.executable, "-m", "bundlefs", "info", "--json", str(m.mountpoint))
        daemon = json.loads(out)["daemon"]
        assert daemon["open_mode"] == mode
        assert (daemon["open_mode_reason"] == "") == (mode == "no-open")


# -- a stock pyfuse3 ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stock_pyfuse3() -> str:
    path = os.environ.get("BUNDLEFS_STOCK_PYFUSE3")
    if not path:
        pytest.skip("set BUNDLEFS_STOCK_PYFUSE3 to a stock pyfuse3 build (make test does)")
    assert (Path(path) / "pyfuse3").is_dir(), f"no stock pyfuse3 in {path}: run make test"
    return path


def test_stock_pyfuse3_falls_back_to_the_open_path(mount_bundle, tools_bundle, tools_tree,
                                                   stock_pyfuse3):  # fmt: skip
    m = mount_bundle(tools_bundle, python_path=(stock_pyfuse3,))
    served = stats(m.mountpoint)
    assert served["open_mode"] == "open"
    assert "lacks the no-open patch" in served["open_mode_reason"]
    assert served["workers"] == 1  # and said why: stock pyfuse3 cannot share the mount
    assert "cannot share a mount between processes" in served["single_process_reason"]
    assert check("diff", "-r", "--no-dereference", str(tools_tree), str(m.mountpoint)) == ""
    assert stats(m.mountpoint)["requests"]["open"] > 0


def test_a_stock_pyfuse3_mount_says_so_its_cost_and_the_fix_first(mount_bundle, tools_bundle,
                                                                  stock_pyfuse3):  # fmt: skip
    m = mount_bundle(tools_bundle, python_path=(stock_pyfuse3,))
    assert stats(m.mountpoint)["binding"] == "stock"
    first = m.log_text().splitlines()[0]
    assert "stock" in first and "lacks the no-open patch" in first
    assert "about 5 times slower" in first and "every open is a round trip" in first
    assert "make -C" in first or "pip install" in first  # the one command that fixes it


def test_stock_pyfuse3_refuses_a_required_no_open(tools_bundle, tmp_path, stock_pyfuse3):
    from tests.support.mounting import _daemon_env

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = _daemon_env("", (stock_pyfuse3,))
    del env["NOTIFY_SOCKET"]
    result = subprocess.run(
        [sys.executable, "-m", "bundlefs", "mount", "--foreground", "--open-mode", "no-open",
         str(tools_bundle), str(mnt)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "no-open is not available" in result.stderr
    assert "Traceback" not in result.stderr
    assert not os.path.ismount(mnt)


@pytest.mark.parametrize("mode", MODES)
def test_damaged_data_fails_with_eio_in_both_modes(mode, pack_tree, mount_bundle):
    from bundlefs import Bundle
    from bundlefs.core import format as fmt
    from tests.conftest import flip_byte

    victim = pseudo_random_bytes(3 * 4096, seed=5, compressible=False)
    bundle = pack_tree({"victim.bin": victim, "fine.txt": b"fine\n" * 100}, record_size=4096)
    with Bundle(bundle) as b:
        record = b.content.record_at(0, b.resolve("victim.bin").offset + 4096)
    flip_byte(bundle / fmt.shard_filename(0), record.stored_offset + 10)
    m = mount_bundle(bundle, "--open-mode", mode, allowed_log=[r"ERROR .*damaged.*victim\.bin"])
    with pytest.raises(OSError) as caught:
        (m.mountpoint / "victim.bin").read_bytes()
    assert caught.value.errno == errno.EIO
    with pytest.raises(OSError) as caught:  # not cached as good: the next read fails too
        (m.mountpoint / "victim.bin").read_bytes()
    assert caught.value.errno == errno.EIO
    assert (m.mountpoint / "fine.txt").read_bytes() == b"fine\n" * 100
    assert stats(m.mountpoint)["eio_count"] >= 2


# -- the index held in memory ----------------------------------------------------------------------


def _index_mappings(pid: int) -> int:
    with open(f"/proc/{pid}/maps") as f:
        return sum(line.rstrip().endswith("/data.mdb") for line in f)


def test_the_index_is_held_in_memory_after_ready(mount_bundle, tools_bundle):
    from tests.support.mounting import wait_until

    m = mount_bundle(tools_bundle)
    assert wait_until(lambda: "index held in memory" in m.log_text())
    # The process that holds it: the daemon, or its first worker where several serve.
    holder = int(re.search(r"\[(\d+)\] INFO .*index held in memory", m.log_text())[1])
    # LMDB's own map, the page guard's (CheckedPaths reads checked branch pages), the resident one
    assert _index_mappings(holder) == 3


def test_index_resident_zero_leaves_the_index_to_lmdb(mount_bundle, tools_bundle):
    m = mount_bundle(tools_bundle, "--index-resident", "0")
    assert (m.mountpoint / "hello.txt").read_bytes() == SAMPLE_SPEC["hello.txt"]
    assert "index held in memory" not in m.log_text()
    assert _index_mappings(m.pid) == 2  # LMDB's own map and the page guard's


# -- the options, as the command line and fstab give them ------------------------------------------


def _options(*argv: str):
    # The whole CLI's parser: mount's own arguments and the shared option groups it takes.
    from bundlefs.cli.app import build_parser
    from bundlefs.cli.mount import options_from_args

    return options_from_args(build_parser().parse_args(["mount", *argv, "b.bundle", "mnt"]))


def test_open_mode_and_index_resident_defaults():
    from bundlefs.mount.options import DEFAULT_INDEX_RESIDENT

    options = _options()
    assert (options.open_mode, options.index_resident, options.prefetch) == (
        "auto",
        DEFAULT_INDEX_RESIDENT,
        True,
    )


def test_open_mode_and_index_resident_come_from_flags_and_fstab_options():
    assert _options("--open-mode", "open", "--index-resident", "1GiB").index_resident == 1 << 30
    options = _options("-o", "ro,open_mode=no-open,index_resident=0", "--no-prefetch")
    assert (options.open_mode, options.index_resident, options.prefetch) == ("no-open", 0, False)


def test_an_unknown_open_mode_option_is_refused():
    from bundlefs.errors import MountError

    with pytest.raises(MountError, match="open_mode= takes"):
        _options("-o", "open_mode=sometimes")
