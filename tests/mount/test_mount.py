"""The FUSE mount, checked with real tools on real mounts (issue 3).

Read-only checks share one module-scoped mount of the sample bundle; lifecycle and damage checks
make their own mounts. Every mount is unmounted in ``finally`` and its log must be clean.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import bundlefs
from bundlefs.core import format as fmt
from tests.conftest import (
    SAMPLE_FILES,
    SAMPLE_RECORD_SIZE,
    build_tree,
    flip_byte,
    pseudo_random_bytes,
)
from tests.support.mounting import is_mounted, wait_until

pytestmark = pytest.mark.mount

BUNDLEFS = [sys.executable, "-m", "bundlefs"]


def run(*command: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=120, **kwargs)


# -- the tree as tools see it ----------------------------------------------------------------------


def test_diff_r_finds_the_mount_identical_to_the_source(sample_mount, sample_tree):
    result = run("diff", "-r", "--no-dereference", str(sample_tree), str(sample_mount.mountpoint))
    assert result.returncode == 0, result.stdout + result.stderr


def test_find_reports_the_same_sizes_modes_and_mtimes(sample_mount, sample_tree):
    def listing(root: Path) -> list[str]:
        # Directory sizes are file-system specific; everything else must agree exactly.
        out = run("find", ".", "-printf", "%p %y %m %T@ %s %l\\n", cwd=root).stdout
        rows = []
        for line in out.splitlines():
            path, kind, mode, mtime, size, *target = line.split(" ")
            rows.append(" ".join([path, kind, mode, mtime, size if kind != "d" else "-", *target]))
        return sorted(rows)

    assert listing(sample_mount.mountpoint) == listing(sample_tree)


def test_tar_of_the_mount_equals_tar_of_the_source(sample_mount, sample_tree):
    def tar(root: Path) -> bytes:
        # --hard-dereference is off: hard links must come out as links in both.
        command = ["tar", "--sort=name", "--numeric-owner", "--format=gnu", "-C", str(root)]
        return subprocess.run(command + ["-cf", "-", "."], capture_output=True, check=True).stdout

    assert tar(sample_mount.mountpoint) == tar(sample_tree)


def test_cp_a_copies_the_tree_faithfully(sample_mount, sample_tree, tmp_path):
    copy = tmp_path / "copy"
    result = run("cp", "-a", str(sample_mount.mountpoint), str(copy))
    assert result.returncode == 0, result.stderr
    assert run("diff", "-r", "--no-dereference", str(sample_tree), str(copy)).returncode == 0
    assert os.stat(copy / "big.bin").st_mtime_ns == os.stat(sample_tree / "big.bin").st_mtime_ns


def test_os_walk_sees_every_name(sample_mount, sample_tree):
    def names(root: Path) -> list[tuple]:
        return sorted(
            (os.path.relpath(top, root), sorted(dirs), sorted(files))
            for top, dirs, files in os.walk(root)
        )

    assert names(sample_mount.mountpoint) == names(sample_tree)


def test_every_file_reads_back_exactly(sample_mount):
    for path, content in SAMPLE_FILES.items():
        with open(sample_mount.mountpoint / path, "rb") as f:
            assert f.read() == content, path


def test_stat_matches_the_source(sample_mount, sample_tree):
    for path in SAMPLE_FILES:
        got, want = os.lstat(sample_mount.mountpoint / path), os.lstat(sample_tree / path)
        assert (got.st_mode, got.st_size, got.st_mtime_ns, got.st_nlink) == (
            want.st_mode,
            want.st_size,
            want.st_mtime_ns,
            want.st_nlink,
        ), path


def test_hard_links_share_one_inode(sample_mount):
    root = sample_mount.mountpoint
    a, b = os.stat(root / "hard1"), os.stat(root / "dir/hard2")
    assert a.st_ino == b.st_ino
    assert a.st_nlink == b.st_nlink == 2


def test_symlinks_keep_their_targets(sample_mount):
    root = sample_mount.mountpoint
    assert os.readlink(root / "link") == "hello.txt"
    assert os.readlink(root / "dangling") == "does/not/exist"
    assert (root / "dirlink" / "a.txt").read_bytes() == SAMPLE_FILES["dir/a.txt"]
    assert not os.path.exists(root / "dangling")


def test_dot_and_dotdot_resolve(sample_mount):
    root = sample_mount.mountpoint
    assert os.stat(root / "dir" / "sub" / "..").st_ino == os.stat(root / "dir").st_ino
    assert os.stat(root / "dir" / ".").st_ino == os.stat(root / "dir").st_ino
    assert os.stat(root).st_ino == 1


def test_inode_numbers_are_stable_across_mounts(sample_bundle_path, sample_mount, mount_bundle):
    second = mount_bundle(sample_bundle_path)
    for path in ("dir/sub/deep.txt", "hello.txt", "emptydir", "link"):
        assert (
            os.lstat(sample_mount.mountpoint / path).st_ino
            == os.lstat(second.mountpoint / path).st_ino
        )


def test_mmap_reads_the_content(sample_mount):
    with (
        open(sample_mount.mountpoint / "big.bin", "rb") as f,
        mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m,
    ):
        assert m[:] == SAMPLE_FILES["big.bin"]


def test_random_preads_across_record_boundaries_match_the_source(sample_mount):
    rng = random.Random(7)
    content = SAMPLE_FILES["big.bin"]
    fd = os.open(sample_mount.mountpoint / "big.bin", os.O_RDONLY)
    try:
        offsets = [k * SAMPLE_RECORD_SIZE + d for k in range(6) for d in (-3, 0, 1)]
        offsets += [rng.randrange(len(content)) for _ in range(200)]
        for offset in offsets:
            offset = max(0, offset)
            size = rng.choice([1, 7, 4096, SAMPLE_RECORD_SIZE + 5, 3 * SAMPLE_RECORD_SIZE])
            assert os.pread(fd, size, offset) == content[offset : offset + size], offset
    finally:
        os.close(fd)


def test_eight_reader_threads_get_the_right_bytes(sample_mount):
    paths = sorted(SAMPLE_FILES)
    failures: list[str] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(150):
            path = rng.choice(paths)
            content = SAMPLE_FILES[path]
            offset = rng.randrange(len(content) + 1)
            size = rng.randrange(1, 70000)
            with open(sample_mount.mountpoint / path, "rb") as f:
                f.seek(offset)
                if f.read(size) != content[offset : offset + size]:
                    failures.append(f"{path}@{offset}+{size}")

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_statfs_reports_the_bundle_totals(sample_mount, sample_bundle_path):
    st = os.statvfs(sample_mount.mountpoint)
    with bundlefs.Bundle(sample_bundle_path) as b:
        info = b.info()
    assert st.f_files == b.config.entry_count
    assert st.f_blocks * st.f_frsize >= info.shard_bytes + info.index_bytes
    assert st.f_bavail == 0
    assert st.f_flag & os.ST_RDONLY


def test_xattrs_expose_the_stored_checksum(sample_mount):
    from bundlefs.core.checksum import crc32c

    path = sample_mount.mountpoint / "hello.txt"
    assert "user.bundlefs.crc32c" in os.listxattr(path)
    value = os.getxattr(path, "user.bundlefs.crc32c")
    assert int(value, 16) == crc32c(SAMPLE_FILES["hello.txt"])
    with pytest.raises(OSError) as e:
        os.getxattr(path, "user.nothing")
    assert e.value.errno == errno.ENODATA


def test_a_files_digest_is_an_xattr_in_hex(sample_mount):
    import hashlib

    path = sample_mount.mountpoint / "hello.txt"
    assert "user.bundlefs.digest" in os.listxattr(path)
    value = os.getxattr(path, "user.bundlefs.digest")
    assert value == hashlib.sha256(SAMPLE_FILES["hello.txt"]).hexdigest()[:32].encode()
    assert "user.bundlefs.digest" not in os.listxattr(sample_mount.mountpoint)


def test_root_xattr_reports_daemon_statistics(sample_mount):
    import json

    (sample_mount.mountpoint / "big.bin").read_bytes()
    stats = json.loads(os.getxattr(sample_mount.mountpoint, "user.bundlefs.stats"))
    assert stats["eio_count"] == 0
    assert stats["bytes_decompressed"] > 0
    assert set(stats) >= {"cache_hits", "cache_misses", "cache_evictions"}


# -- POSIX errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "action",
    [
        lambda root: os.open(root / "new.txt", os.O_WRONLY | os.O_CREAT),
        lambda root: os.open(root / "hello.txt", os.O_RDWR),
        lambda root: os.mkdir(root / "newdir"),
        lambda root: os.unlink(root / "hello.txt"),
        lambda root: os.rmdir(root / "emptydir"),
        lambda root: os.rename(root / "hello.txt", root / "x"),
        lambda root: os.symlink("x", root / "newlink"),
        lambda root: os.chmod(root / "hello.txt", 0o600),
        lambda root: os.truncate(root / "hello.txt", 0),
        lambda root: os.setxattr(root / "hello.txt", "user.x", b"1"),
    ],
    ids=["create", "open-rw", "mkdir", "unlink", "rmdir", "rename", "symlink", "chmod",
         "truncate", "setxattr"],
)  # fmt: skip
def test_every_mutation_fails_with_erofs(sample_mount, action):
    with pytest.raises(OSError) as e:
        action(sample_mount.mountpoint)
    assert e.value.errno == errno.EROFS


def test_missing_names_give_enoent(sample_mount):
    with pytest.raises(FileNotFoundError):
        os.stat(sample_mount.mountpoint / "no-such-file")
    with pytest.raises(FileNotFoundError):
        os.stat(sample_mount.mountpoint / "dir" / "no-such-file")


def test_a_file_used_as_a_directory_gives_enotdir(sample_mount):
    with pytest.raises(NotADirectoryError):
        os.stat(sample_mount.mountpoint / "hello.txt" / "x")
    with pytest.raises(NotADirectoryError):
        os.listdir(sample_mount.mountpoint / "hello.txt")


def test_reading_a_directory_gives_eisdir(sample_mount):
    with pytest.raises(IsADirectoryError):
        (sample_mount.mountpoint / "dir").read_bytes()


# -- special files (format version 4) --------------------------------------------------------------


def _special_tree(src: Path) -> Path:
    """A file, a FIFO, a socket and, as root, a character device 1:3 and a block device 7:0."""
    src.mkdir()
    (src / "file").write_bytes(b"data")
    os.mkfifo(src / "fifo")
    here = os.getcwd()
    os.chdir(src)  # a relative socket path avoids the 108-byte limit of sun_path
    try:
        with socket.socket(socket.AF_UNIX) as server:
            server.bind("sock")
    finally:
        os.chdir(here)
    if os.geteuid() == 0:
        os.mknod(src / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        os.mknod(src / "loop", stat.S_IFBLK | 0o640, os.makedev(7, 0))
    return src


def _facts(root: Path) -> dict[str, tuple]:
    """What diff -r would compare of each name, and a device's number besides."""
    out = {}
    for name in sorted(os.listdir(root)):
        st = os.lstat(root / name)
        out[name] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_rdev)
    return out


def test_fifos_sockets_and_devices_mount_and_extract_with_their_types_and_numbers(
    mount_bundle, tmp_path
):
    src = _special_tree(tmp_path / "src")
    bundle = tmp_path / "b.bundle"
    bundlefs.pack(str(src), str(bundle))
    mnt = mount_bundle(bundle).mountpoint
    assert _facts(mnt) == _facts(src)
    kinds = {"p": "./fifo", "s": "./sock", "f": "./file"}
    if os.geteuid() == 0:
        kinds |= {"c": "./null", "b": "./loop"}
        with pytest.raises(PermissionError):  # the mount is nodev: a device never opens there
            (mnt / "null").read_bytes()
    for kind, path in kinds.items():
        assert run("find", ".", "-type", kind, cwd=mnt).stdout.split() == [path], kind
    listing = {line.split()[-1]: line for line in run("ls", "-l", str(mnt)).stdout.splitlines()[1:]}
    assert listing["fifo"].startswith("p") and listing["sock"].startswith("s")
    if os.geteuid() == 0:
        assert listing["null"].startswith("crw-------") and " 1, 3 " in listing["null"]
        assert listing["loop"].startswith("brw-r-----") and " 7, 0 " in listing["loop"]
    with pytest.raises(OSError) as error:
        (mnt / "sock").read_bytes()
    assert error.value.errno == errno.ENXIO
    out = tmp_path / "out"
    result = run(*BUNDLEFS, "extract", str(bundle), str(out))
    assert result.returncode == 0, result.stderr
    assert _facts(out) == _facts(src)


# -- large directories -----------------------------------------------------------------------------


def test_a_large_directory_lists_completely_and_in_order(pack_tree, mount_bundle, tmp_path):
    # The kernel asks for a listing in many pieces; each must resume exactly where it stopped.
    count = 20_000
    src = tmp_path / "wide"
    src.mkdir()
    for i in range(count):
        (src / f"f{i:06d}").touch()
    m = mount_bundle(pack_tree(str(src)))
    names = os.listdir(m.mountpoint)
    assert names == sorted(f"f{i:06d}" for i in range(count))
    assert run("find", str(m.mountpoint), "-type", "f").stdout.count("\n") == count


# -- damage ----------------------------------------------------------------------------------------


def test_a_corrupt_record_gives_eio_while_other_files_still_read(pack_tree, mount_bundle, tmp_path):
    victim = pseudo_random_bytes(3 * 4096, seed=5, compressible=False)
    bundle = pack_tree({"victim.bin": victim, "other": {"fine.txt": b"fine\n" * 1000}},
                       record_size=4096)  # fmt: skip
    with bundlefs.Bundle(bundle) as b:
        record = b.content.record_at(0, b.resolve("victim.bin").offset + 4096)
    flip_byte(bundle / fmt.shard_filename(0), record.stored_offset + 10)
    m = mount_bundle(bundle, allowed_log=[r"ERROR .*damaged data.*victim\.bin"])
    fd = os.open(m.mountpoint / "victim.bin", os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == victim[:4096]  # an undamaged record of the same file
        with pytest.raises(OSError) as e:
            os.pread(fd, 4096, 4096)
        assert e.value.errno == errno.EIO
    finally:
        os.close(fd)
    with pytest.raises(OSError) as e:
        (m.mountpoint / "victim.bin").read_bytes()
    assert e.value.errno == errno.EIO
    assert (m.mountpoint / "other" / "fine.txt").read_bytes() == b"fine\n" * 1000
    assert wait_until(lambda: "victim.bin" in m.log_text())
    assert m.process.poll() is None  # still serving


# -- lifecycle -------------------------------------------------------------------------------------


def test_sigterm_unmounts_and_exits_zero(sample_bundle_path, mount_bundle):
    m = mount_bundle(sample_bundle_path)
    os.kill(m.pid, signal.SIGTERM)
    assert m.process.wait(timeout=20) == 0
    assert not is_mounted(m.mountpoint)


def test_sigint_unmounts_and_exits_zero(sample_bundle_path, mount_bundle):
    m = mount_bundle(sample_bundle_path)
    os.kill(m.pid, signal.SIGINT)
    assert m.process.wait(timeout=20) == 0
    assert not is_mounted(m.mountpoint)


def test_fusermount_u_ends_the_daemon_with_exit_zero(sample_bundle_path, mount_bundle):
    m = mount_bundle(sample_bundle_path)
    assert run("fusermount3", "-u", str(m.mountpoint)).returncode == 0
    assert m.process.wait(timeout=20) == 0


def test_a_sigkilled_daemon_leaves_no_dead_mount(sample_bundle_path, mount_bundle):
    m = mount_bundle(sample_bundle_path, allowed_log=[".*"])
    os.kill(m.pid, signal.SIGKILL)
    m.process.wait(timeout=20)
    assert wait_until(lambda: not is_mounted(m.mountpoint), timeout=20)
    assert os.listdir(m.mountpoint) == []  # the plain directory again, not ENOTCONN


def test_sigusr1_logs_statistics(sample_bundle_path, mount_bundle):
    m = mount_bundle(sample_bundle_path)
    (m.mountpoint / "big.bin").read_bytes()
    os.kill(m.pid, signal.SIGUSR1)
    assert wait_until(lambda: "cache_hits" in m.log_text())


def test_owner_mounter_shows_the_mounting_user(sample_bundle_path, mount_bundle):
    m = mount_bundle(sample_bundle_path, "--uid", "4242", "--gid", "4343")
    st = os.stat(m.mountpoint / "hello.txt")
    assert (st.st_uid, st.st_gid) == (4242, 4343)


def test_daemon_mode_returns_once_the_mount_is_usable(sample_bundle_path, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    try:
        result = run(*BUNDLEFS, "mount", "--log-file", str(log), str(sample_bundle_path), str(mnt))
        assert result.returncode == 0, result.stderr
        # No waiting: usable on the very next line.
        assert (mnt / "hello.txt").read_bytes() == SAMPLE_FILES["hello.txt"]
        result = run(*BUNDLEFS, "umount", str(mnt))
        assert result.returncode == 0, result.stderr
        assert wait_until(lambda: not is_mounted(mnt))
    finally:
        if is_mounted(mnt):
            run("fusermount3", "-u", "-z", str(mnt))


def test_mount_t_fuse_bundlefs_works(sample_bundle_path, sample_tree, tmp_path):
    # mount(8) runs mount.fuse3, which runs `bundlefs BUNDLE MNT -o OPTS` with PATH reset to the
    # system directories. Rather than link this checkout's command into /usr/local/bin, the test
    # binds a directory holding it over /usr/local/bin in a private mount namespace: the host
    # never sees the bind nor the mount, and both vanish with the namespace.
    if not shutil.which("mount.fuse3") or not shutil.which("unshare"):
        pytest.skip("needs mount.fuse3 and unshare")
    command = Path(sys.executable).parent / "bundlefs"
    assert command.exists(), "the bundlefs console script is not installed in this venv"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bundlefs").symlink_to(command)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    # Detached and without /dev/log (as here), the daemon logs under XDG_STATE_HOME: keep it in
    # the test's directory, not in the user's home.
    script = f"""set -e
export XDG_STATE_HOME={tmp_path}/state
mount --bind {bin_dir} /usr/local/bin
mount -t fuse.bundlefs -o ro,nodev,x-systemd.automount {sample_bundle_path} {mnt}
trap 'umount {mnt}' EXIT
cmp {mnt}/dir/a.txt {sample_tree}/dir/a.txt
grep -q " {mnt} fuse.bundlefs " /proc/mounts
"""
    host_bin = sorted(os.listdir("/usr/local/bin"))
    result = run("unshare", "-m", "--propagation", "private", "sh", "-c", script)
    assert result.returncode == 0, result.stderr
    assert not is_mounted(mnt)
    assert sorted(os.listdir("/usr/local/bin")) == host_bin  # the host never saw the bind


@pytest.mark.parametrize(
    "case, expected",
    [
        ("not-a-bundle", "not a bundle"),
        ("missing-mountpoint", "does not exist"),
        ("busy-mountpoint", "busy"),
    ],
)
def test_mount_failures_are_one_clear_sentence(case, expected, sample_mount, sample_bundle_path,
                                               tmp_path):  # fmt: skip
    bundle, mnt = sample_bundle_path, tmp_path / "mnt"
    mnt.mkdir()
    if case == "not-a-bundle":
        bundle = build_tree(tmp_path / "plain", {"x": b"1"})
    elif case == "missing-mountpoint":
        mnt = tmp_path / "nowhere"
    else:
        mnt = sample_mount.mountpoint
    result = run(*BUNDLEFS, "mount", str(bundle), str(mnt))
    assert result.returncode != 0
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_umount_clears_a_stale_mount(sample_bundle_path, mount_bundle):
    m = mount_bundle(sample_bundle_path, "--no-auto-unmount", allowed_log=[".*"])
    os.kill(m.pid, signal.SIGKILL)
    m.process.wait(timeout=20)

    def listing_errno() -> int | None:
        try:
            os.listdir(m.mountpoint)
        except OSError as e:
            return e.errno
        return None

    # A dead mount, as an older bundlefs could leave (once the workers, which die with the
    # supervisor, are gone too; a request one of them had read ends with ECONNABORTED).
    assert wait_until(lambda: listing_errno() == errno.ENOTCONN)
    result = run(*BUNDLEFS, "umount", str(m.mountpoint))
    assert result.returncode == 0, result.stderr
    assert wait_until(lambda: not is_mounted(m.mountpoint))
    assert stat.S_ISDIR(os.stat(m.mountpoint).st_mode)


@pytest.fixture
def truncated_bundle(pack_tree):
    """Two files, each in a shard of its own; the second shard lost its second half."""
    spec = {"a.bin": pseudo_random_bytes(200_000, 1), "b.bin": pseudo_random_bytes(200_000, 2)}
    bundle = pack_tree(spec, shard_size=100_000, record_size=16 * 1024)
    shard = bundle / fmt.shard_filename(1)
    os.truncate(shard, shard.stat().st_size // 2)
    return bundle, spec


def test_a_mount_of_a_truncated_bundle_warns_and_serves_what_is_intact(
    truncated_bundle, mount_bundle
):
    bundle, spec = truncated_bundle
    # The warning at open, and the EIO of the read below.
    m = mount_bundle(bundle, allowed_log=[r"shard 1 \(.*\) is [0-9,]+ bytes short", "truncated"])
    assert "reads of what it lacks fail with EIO" in m.log_text()
    assert (m.mountpoint / "a.bin").read_bytes() == spec["a.bin"]
    with pytest.raises(OSError) as e:
        (m.mountpoint / "b.bin").read_bytes()
    assert e.value.errno == errno.EIO


def test_mount_strict_refuses_a_truncated_bundle(truncated_bundle, tmp_path):
    bundle, _spec = truncated_bundle
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        result = run(*BUNDLEFS, "mount", "--strict", str(bundle), str(mnt))
    finally:
        if is_mounted(mnt):
            run("fusermount3", "-u", "-z", str(mnt))
    assert result.returncode == 1
    warning, refusal = result.stderr.splitlines()
    assert warning.startswith(f"bundlefs: warning: {bundle}: shard 1 (")
    assert refusal == f"bundlefs: error: {bundle} is damaged; refusing to mount it (--strict)"


@pytest.fixture
def tmpfs_mount(tmp_path):
    """A tmpfs mounted on a directory of the test (root only), unmounted whatever happens."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if run("mount", "-t", "tmpfs", "-o", "size=1m", "none", str(mnt)).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        if is_mounted(mnt):
            run("umount", str(mnt))


def test_umount_refuses_a_mount_that_is_not_bundlefs(tmpfs_mount):
    result = run(*BUNDLEFS, "umount", str(tmpfs_mount))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"bundlefs: error: {tmpfs_mount} is not a bundlefs mount (it is tmpfs); refusing to "
        "unmount it (use --force, or fusermount3 -u or umount, for other file systems)"
    ]
    assert is_mounted(tmpfs_mount)


def test_umount_force_unmounts_a_mount_that_is_not_bundlefs(tmpfs_mount):
    result = run(*BUNDLEFS, "umount", "--force", str(tmpfs_mount))
    assert result.returncode == 0, result.stderr
    assert not is_mounted(tmpfs_mount)


def test_info_json_on_a_mount_point_reports_daemon_statistics(sample_mount):
    import json

    (sample_mount.mountpoint / "noise.bin").read_bytes()
    result = run(*BUNDLEFS, "info", "--json", str(sample_mount.mountpoint))
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["path"] == str(sample_mount.bundle)
    daemon = facts["daemon"]
    for key in ("cache_hits", "cache_misses", "cache_evictions", "bytes_decompressed", "eio_count"):
        assert isinstance(daemon[key], int)
    assert daemon["cache_misses"] > 0


def test_info_on_a_mount_point_works_where_pyfuse3_and_trio_cannot_be_imported(sample_mount):
    # info reads the mount table and the stats xattr: a monitoring host needs no FUSE bindings.
    program = (
        "import sys\n"
        "class Blocker:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pyfuse3', 'trio'):\n"
        "            raise ImportError(name + ' is blocked in this test')\n"
        "sys.meta_path.insert(0, Blocker())\n"
        "from bundlefs.cli import main\n"
        "sys.exit(main(['info', '--json', sys.argv[1]]))\n"
    )
    result = run(sys.executable, "-c", program, str(sample_mount.mountpoint))
    assert result.returncode == 0, result.stderr
    assert '"daemon"' in result.stdout


def test_kernel_read_ahead_is_raised_before_ready(sample_mount):
    # Large sequential reads arrive in read_ahead_kb pieces; the daemon raises it (root only)
    # before it reports READY=1.
    device = run("mountpoint", "-d", str(sample_mount.mountpoint)).stdout.strip()
    assert Path(f"/sys/class/bdi/{device}/read_ahead_kb").read_text().strip() == "1024"
