"""No credential stays in ``ps``: storage options given on a command line (``--storage-option``,
fstab's ``-o storage_option=``) are moved off it before the command runs (``bundlefs.cli.scrub``),
and ``--storage-options-file`` (``-o storage_options_file=``) is refused unless only its owner can
read it.

Real mounts of a bundle on the local moto server (``tests/support/s3server.py``): a detached daemon,
the mount helper's form, ``mount -t fuse.bundlefs`` through ``mount.fuse3``, and a foreground
daemon; each is checked against every ``/proc/*/cmdline`` once it is ready, and reads the right
bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from tests.conftest import SAMPLE_FILES  # noqa: E402
from tests.support.mounting import is_mounted, wait_until  # noqa: E402
from tests.support.s3server import REGION, S3Server, s3_server, upload_bundle  # noqa: E402
from tests.support.trees import assert_one_line_error, run_cli  # noqa: E402

__all__ = ["s3_server"]  # a fixture, imported to be found

BUNDLEFS = [sys.executable, "-m", "bundlefs"]


@pytest.fixture(scope="module")
def bundle_url(s3_server: S3Server, sample_bundle_path: Path) -> str:
    return upload_bundle(s3_server, sample_bundle_path, f"s3://c{uuid.uuid4().hex[:12]}/x.bundle")


@pytest.fixture
def secret() -> str:
    """A credential no process has any reason to carry but the ones given it."""
    return f"Sekrit{uuid.uuid4().hex}"


def _pairs(server: S3Server, secret: str) -> list[str]:
    """The store's options as KEY=VALUE pairs, the secret among them (moto takes any)."""
    return [f"endpoint_url={server.endpoint}", "key=test", f"secret={secret}",
            f"client_kwargs.region_name={REGION}"]  # fmt: skip


def _processes_showing(needle: str) -> list[str]:
    """The command lines, of every process, that contain ``needle``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue  # gone meanwhile
        if needle.encode() in cmdline:
            found.append(f"{pid}: {_readable(cmdline)}")
    return found


def _readable(cmdline: bytes) -> str:
    return cmdline.replace(b"\0", b" ").decode(errors="replace")


def _daemon_pids(mountpoint: Path) -> list[int]:
    """The bundlefs processes whose command line names ``mountpoint`` (the daemon)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if str(mountpoint).encode() in args and any(b"bundlefs" in a for a in args):
            pids.append(int(pid))
    return pids


@pytest.fixture
def mountpoint(tmp_path: Path) -> Iterator[Path]:
    """An empty directory, unmounted at the end whatever the test did."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        yield mnt
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=30)
        assert wait_until(lambda: not _daemon_pids(mnt), timeout=15)


def _assert_reads(mnt: Path) -> None:
    assert (mnt / "hello.txt").read_bytes() == SAMPLE_FILES["hello.txt"]
    assert (mnt / "dir" / "a.txt").read_bytes() == SAMPLE_FILES["dir/a.txt"]


def _detached(*args: str | os.PathLike, tmp_path: Path) -> subprocess.CompletedProcess:
    command = [*BUNDLEFS, *map(str, args), "--log-file", str(tmp_path / "daemon.log")]
    return subprocess.run(command, capture_output=True, timeout=90)


# -- the command line -----------------------------------------------------------------------------


def test_a_secret_given_as_a_flag_is_in_no_cmdline_once_a_detached_mount_is_ready(
    s3_server, bundle_url, secret, mountpoint, tmp_path
):
    flags = [arg for pair in _pairs(s3_server, secret) for arg in ("--storage-option", pair)]
    result = _detached("mount", bundle_url, mountpoint, *flags,
                       "--disk-cache", tmp_path / "cache", tmp_path=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert _daemon_pids(mountpoint), "the daemon is not running"
    assert _processes_showing(secret) == []
    _assert_reads(mountpoint)
    assert secret not in (tmp_path / "daemon.log").read_text()


def test_a_secret_given_as_an_fstab_option_is_in_no_cmdline_once_the_mount_is_ready(
    s3_server, bundle_url, secret, mountpoint, tmp_path
):
    # mount.fuse3's form: ``bundlefs SOURCE MNT -o OPTIONS``.
    options = ",".join(["ro", *(f"storage_option={p}" for p in _pairs(s3_server, secret))])
    result = _detached(bundle_url, mountpoint, "-o", options,
                       "-o", f"disk_cache={tmp_path / 'cache'}", tmp_path=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert _daemon_pids(mountpoint), "the daemon is not running"
    assert _processes_showing(secret) == []
    _assert_reads(mountpoint)


def test_mount_t_fuse_bundlefs_keeps_an_fstab_secret_out_of_every_cmdline(
    s3_server, bundle_url, sample_tree, secret, mountpoint, tmp_path
):
    """Through mount(8) and mount.fuse3, as an fstab line is mounted. As in
    tests/mount/test_mount.py, this checkout's command is bound over /usr/local/bin in a private
    mount namespace."""
    if not shutil.which("mount.fuse3") or not shutil.which("unshare"):
        pytest.skip("needs mount.fuse3 and unshare")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bundlefs").symlink_to(Path(sys.executable).parent / "bundlefs")
    options = ",".join([
        "ro", *(f"storage_option={p}" for p in _pairs(s3_server, secret)),
        f"disk_cache={tmp_path / 'cache'}", f"log_file={tmp_path / 'd.log'}",
    ])  # fmt: skip
    ready, done = tmp_path / "ready", tmp_path / "done"
    # In a file, not on sh's command line: the script holds the secret.
    script = tmp_path / "mount.sh"
    script.write_text(f"""set -e
mount --bind {bin_dir} /usr/local/bin
mount -t fuse.bundlefs -o {options} {bundle_url} {mountpoint}
trap 'umount {mountpoint}' EXIT
cmp {mountpoint}/hello.txt {sample_tree}/hello.txt
touch {ready}
for i in $(seq 600); do [ -e {done} ] && exit 0; sleep 0.1; done
exit 1
""")
    process = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", str(script)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert wait_until(lambda: ready.exists() or process.poll() is not None, timeout=60)
        assert ready.exists(), process.communicate(timeout=30)
        assert _daemon_pids(mountpoint), "the daemon is not running"
        assert _processes_showing(secret) == []
    finally:
        done.touch()
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert wait_until(lambda: not _daemon_pids(mountpoint), timeout=15)


def test_a_foreground_daemon_keeps_no_secret_in_its_cmdline(
    s3_server, bundle_url, secret, mount_bundle, tmp_path
):
    """The same process (PID) serves: the notify socket and systemd's main PID stay right."""
    flags = [arg for pair in _pairs(s3_server, secret) for arg in ("--storage-option", pair)]
    m = mount_bundle(bundle_url, *flags, "--disk-cache", str(tmp_path / "cache"))
    assert _processes_showing(secret) == []
    with open(f"/proc/{m.pid}/cmdline", "rb") as f:
        assert b"--storage-options-file\0/dev/fd/" in f.read()
    _assert_reads(m.mountpoint)


def test_a_pack_to_a_url_keeps_the_secret_off_its_command_line(
    s3_server, sample_tree, secret, tmp_path
):
    """Any command does it, not only mount: a pack runs for hours."""
    s3_server.create_bucket("packs")
    url = f"s3://packs/{uuid.uuid4().hex[:8]}.bundle"
    flags = [arg for pair in _pairs(s3_server, secret) for arg in ("--storage-option", pair)]
    process = subprocess.Popen([*BUNDLEFS, "pack", "--quiet", str(sample_tree), url, *flags],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    samples = []
    while process.poll() is None:
        with contextlib.suppress(OSError), open(f"/proc/{process.pid}/cmdline", "rb") as f:
            samples.append(f.read())
        time.sleep(0.005)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    # Only the start-up before the re-exec may show it; from then on (most of the run) never.
    cut = next(i for i, s in enumerate(samples) if b"--storage-options-file\0/dev/fd/" in s)
    assert not [s for s in samples[cut:] if secret.encode() in s]
    assert s3_server.get(url + "/COMPLETE")


def test_a_command_line_the_rewrite_cannot_follow_is_refused_without_echoing_the_secret(
    s3_server, bundle_url, secret, tmp_path
):
    # ``-fo X``: argparse reads -f and -o X; the rewrite does not, so the pair would stay.
    result = run_cli("mount", bundle_url, tmp_path, "-fo", f"storage_option=secret={secret}")
    line = assert_one_line_error(result)
    assert "--storage-options-file" in line and secret not in line


# -- --storage-options-file -----------------------------------------------------------------------


def _options_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("form", ["json", "lines"])
def test_a_storage_options_file_reaches_the_store(s3_server, bundle_url, secret, form, tmp_path):
    pairs = _pairs(s3_server, secret)
    if form == "json":
        text = json.dumps({"endpoint_url": s3_server.endpoint, "key": "test", "secret": secret,
                           "client_kwargs": {"region_name": REGION}})  # fmt: skip
    else:
        text = "# the store\n\n" + "\n".join(pairs) + "\n"
    path = _options_file(tmp_path / "store.conf", text)
    result = run_cli("cat", bundle_url, "hello.txt", "--storage-options-file", path,
                     "--disk-cache", tmp_path / "cache")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == SAMPLE_FILES["hello.txt"]


def test_an_fstab_storage_options_file_mounts(s3_server, bundle_url, secret, mountpoint, tmp_path):
    path = _options_file(tmp_path / "store.json", json.dumps(
        {"endpoint_url": s3_server.endpoint, "key": "test", "secret": secret}))  # fmt: skip
    result = _detached(bundle_url, mountpoint, "-o", f"ro,storage_options_file={path}",
                       "-o", f"disk_cache={tmp_path / 'cache'}", tmp_path=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    _assert_reads(mountpoint)


def test_a_storage_options_file_others_may_read_is_refused(s3_server, bundle_url, secret, tmp_path):
    path = _options_file(tmp_path / "store.conf", f"secret={secret}\n", mode=0o640)
    line = assert_one_line_error(run_cli("info", bundle_url, "--storage-options-file", path))
    assert "other users may read it (mode 0640); chmod 600 it" in line
    assert secret not in line


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to another user")
def test_a_storage_options_file_of_another_user_is_refused(bundle_url, secret, tmp_path):
    path = _options_file(tmp_path / "store.conf", f"secret={secret}\n")
    os.chown(path, 65534, 65534)
    line = assert_one_line_error(run_cli("info", bundle_url, "--storage-options-file", path))
    assert "owned by uid 65534, neither by you nor by root" in line


def test_a_malformed_storage_options_file_is_one_sentence_that_quotes_none_of_it(
    bundle_url, secret, tmp_path
):
    path = _options_file(tmp_path / "store.conf", f"endpoint_url=http://x\n{secret}\n")
    line = assert_one_line_error(run_cli("info", bundle_url, "--storage-options-file", path))
    assert "line 2 of the storage options file" in line and secret not in line
    _options_file(path, '{"secret": ')
    line = assert_one_line_error(run_cli("info", bundle_url, "--storage-options-file", path))
    assert "is not a JSON object" in line


def test_the_command_line_options_win_over_the_file_and_the_file_over_the_environment(tmp_path):
    from bundlefs.cli.app import _mount_helper_form, build_parser
    from bundlefs.cli.mount import options_from_args

    path = _options_file(tmp_path / "s.json", json.dumps({"a": 1, "b": 1, "c": 1}))
    argv = _mount_helper_form(["s3://bucket/x.bundle", str(tmp_path), "-o",
                               f"storage_options_file={path},storage_option=b=2",
                               "--storage-option", "c=3"])  # fmt: skip
    env = os.environ.pop("BUNDLEFS_STORAGE_OPTIONS", None)
    os.environ["BUNDLEFS_STORAGE_OPTIONS"] = json.dumps({"a": 0, "d": 0})
    try:
        options = options_from_args(build_parser().parse_args(argv))
    finally:
        os.environ.pop("BUNDLEFS_STORAGE_OPTIONS")
        if env is not None:
            os.environ["BUNDLEFS_STORAGE_OPTIONS"] = env
    assert options.read.remote.storage_options == {"a": 1, "b": 2, "c": 3, "d": 0}


def test_the_rewrite_moves_every_pair_and_keeps_the_rest_in_order():
    from bundlefs.cli.scrub import split_command_line

    argv = ["mount", "s3://b/x", "/mnt", "--storage-option", "key=K", "-o",
            "ro,storage_option=secret=S,storage_options_file=/f,cache_size=1G",
            "--storage-option=token=T", "--", "-odd"]  # fmt: skip
    clean, flag_pairs, o_pairs = split_command_line(argv)
    assert clean == ["mount", "s3://b/x", "/mnt", "-o", "ro,cache_size=1G",
                     "--storage-options-file", "/f", "--", "-odd"]  # fmt: skip
    assert flag_pairs == ["key=K", "token=T"]
    assert o_pairs == ["secret=S"]
