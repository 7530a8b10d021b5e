"""Several worker processes serving one mount (bundlefs.mount.supervisor), on real mounts.

The workers share one FUSE connection, each on a cloned descriptor; the supervisor replaces a
worker that dies, fans stop signals out and unmounts once. These tests check what a user sees:
the same bytes from every worker, readers that never hang when a worker is killed under load,
counters summed over the whole mount, no worker left behind whatever way the mount ends, and one
process (said so) where the workers cannot serve.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bundlefs import PackOptions, pack
from bundlefs.mount import supervisor
from bundlefs.mount.kernel import no_open_unavailable
from bundlefs.storage import native
from tests.conftest import build_tree, pseudo_random_bytes
from tests.support.mounting import is_mounted, wait_until

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(
        no_open_unavailable() is not None, reason="workers need the patched pyfuse3"
    ),
]

STATS = "user.bundlefs.stats"
FILES = 400


def stats(mountpoint: Path) -> dict:
    return json.loads(os.getxattr(mountpoint, STATS))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def many_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tree of 400 files of 1-40 KiB (some compressible) and its bundle, in small records."""
    spec: dict = {f"d{d}": {} for d in range(8)}
    for i in range(FILES):
        data = pseudo_random_bytes(1024 + 97 * i, seed=i, compressible=i % 2 == 0)
        spec[f"d{i % 8}"][f"f{i:04d}.bin"] = data
    work = tmp_path_factory.mktemp("workers")
    src = build_tree(work / "src", spec)
    bundle = work / "b.bundle"
    pack(src, bundle, PackOptions(record_size=16 * 1024))
    return src, bundle


def test_four_workers_serve_the_tree_diff_clean_and_share_the_requests(many_files, mount_bundle):
    src, bundle = many_files
    m = mount_bundle(bundle, "--workers", "4")
    subprocess.run(["diff", "-r", str(src), str(m.mountpoint)], check=True, timeout=120)
    served = stats(m.mountpoint)
    assert served["workers"] == 4 and served["single_process_reason"] == ""
    workers = served["worker_processes"]
    assert len({w["pid"] for w in workers}) == 4
    assert m.pid not in {w["pid"] for w in workers}  # the supervisor serves nothing itself
    # The totals are the sum of every worker's counts, whichever worker answered.
    assert sum(w["requests"] for w in workers) == sum(served["requests"].values())
    assert served["requests"]["read"] >= FILES
    assert sum(w["rss_bytes"] > 0 for w in workers) == 4


def test_the_cache_size_is_the_total_across_workers(many_files, mount_bundle):
    m = mount_bundle(many_files[1], "--workers", "4", "--cache-size", "8MiB")
    assert stats(m.mountpoint)["cache_capacity"] == 8 * 1024 * 1024
    for path in sorted(m.mountpoint.rglob("*.bin")):
        path.read_bytes()
    assert stats(m.mountpoint)["cache_bytes"] <= 8 * 1024 * 1024


_READER = r"""
import os, sys, time, zlib
root, rounds = sys.argv[1], int(sys.argv[2])
expected = dict(line.split() for line in open(sys.argv[3]))
errors = 0
for _ in range(rounds):
    for rel, crc in expected.items():
        try:
            with open(os.path.join(root, rel), "rb") as f:
                data = f.read()
        except OSError as e:
            # A request the killed worker had read ends with ECONNABORTED: said, never wrong bytes.
            assert e.errno == 103, e
            errors += 1
            continue
        assert format(zlib.crc32(data), "08x") == crc, rel
print(errors)
"""


def test_a_worker_killed_under_load_is_replaced_and_no_reader_hangs(
    many_files, mount_bundle, tmp_path
):
    import zlib

    src, bundle = many_files
    m = mount_bundle(
        bundle,
        "--workers",
        "4",
        "--cache-size",
        "1MiB",  # small: the readers keep the workers loading records
        allowed_log=[r"WARNING .*worker \d \(pid \d+\) was killed by SIGKILL; replaced by pid"],
    )
    listing = tmp_path / "expected.txt"
    listing.write_text(
        "".join(
            f"{p.relative_to(src)} {zlib.crc32(p.read_bytes()):08x}\n"
            for p in sorted(src.rglob("*.bin"))
        )
    )
    victim = stats(m.mountpoint)["worker_processes"][1]["pid"]
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", _READER, str(m.mountpoint), "3", str(listing)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    time.sleep(0.3)
    os.kill(victim, signal.SIGKILL)
    for reader in readers:
        out, _ = reader.communicate(timeout=90)  # none hangs
        assert reader.returncode == 0
        assert int(out) <= 8  # at most the few requests the victim held
    assert wait_until(lambda: "replaced by pid" in m.log_text())
    served = stats(m.mountpoint)
    pids = {w["pid"] for w in served["worker_processes"]}
    assert len(pids) == 4 and victim not in pids and all(alive(p) for p in pids)
    assert sum(w["restarts"] for w in served["worker_processes"]) == 1
    subprocess.run(["diff", "-r", str(src), str(m.mountpoint)], check=True, timeout=120)


def test_sigterm_stops_every_worker_and_unmounts(many_files, mount_bundle):
    m = mount_bundle(many_files[1], "--workers", "3")
    workers = [w["pid"] for w in stats(m.mountpoint)["worker_processes"]]
    m.process.send_signal(signal.SIGTERM)
    assert m.process.wait(timeout=30) == 0
    assert wait_until(lambda: not is_mounted(m.mountpoint))
    assert wait_until(lambda: not any(alive(p) for p in workers))


_WATCH_TRIO = """
import importlib.util, os, sys, traceback

with open({loaded!r}, "a") as f:
    f.write(f"{{os.getpid()}}\\n")  # this process runs with the watch (its forks inherit it)

class _WatchTrio:  # records any import of trio (not a look for it) here or in a fork
    def find_spec(self, name, path=None, target=None):
        if name != "trio":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None:
            real = spec.loader

            class Recording:
                def create_module(self, spec):
                    return real.create_module(spec)

                def exec_module(self, module):
                    with open({marker!r}, "a") as f:
                        f.write(f"pid {{os.getpid()}}:\\n" + "".join(traceback.format_stack()))
                    real.exec_module(module)

            spec.loader = Recording()
        return spec

sys.meta_path.insert(0, _WatchTrio())
"""


@pytest.mark.parametrize("stop", ["sigterm", "umount"])
def test_a_mount_served_by_workers_never_imports_trio(many_files, mount_bundle, tmp_path, stop):
    # ~170 ms of every mount's start (bundlefs/mount/direct.py): the handshake and the workers'
    # blocking loops run pyfuse3's loop with no event loop, through start, reads and either stop.
    from bundlefs.mount.bindings import binding

    if binding() != "patched":
        pytest.skip("a stock pyfuse3 serves under trio")
    hook, marker, loaded = tmp_path / "hook", tmp_path / "trio-imported", tmp_path / "loaded"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        _WATCH_TRIO.format(marker=str(marker), loaded=str(loaded))
    )
    m = mount_bundle(many_files[1], "--workers", "2", python_path=(str(hook),))
    assert stats(m.mountpoint)["workers"] == 2
    subprocess.run(["diff", "-r", str(many_files[0]), str(m.mountpoint)], check=True)
    if stop == "sigterm":
        m.process.send_signal(signal.SIGTERM)
    else:
        subprocess.run(["umount", str(m.mountpoint)], check=True)
    assert m.process.wait(timeout=30) == 0
    assert str(m.pid) in loaded.read_text().split()  # the daemon ran with the watch
    assert not marker.exists(), marker.read_text()


def test_umount_stops_every_worker(many_files, mount_bundle):
    m = mount_bundle(many_files[1], "--workers", "3")
    workers = [w["pid"] for w in stats(m.mountpoint)["worker_processes"]]
    subprocess.run(["fusermount3", "-u", str(m.mountpoint)], check=True, timeout=30)
    assert m.process.wait(timeout=30) == 0
    assert wait_until(lambda: not any(alive(p) for p in workers))
    assert "the file system was unmounted" in m.log_text()


def test_no_worker_outlives_a_killed_supervisor(many_files, mount_bundle):
    m = mount_bundle(many_files[1], "--workers", "3", allowed_log=[".*"])
    workers = [w["pid"] for w in stats(m.mountpoint)["worker_processes"]]
    m.process.kill()
    m.process.wait(timeout=30)
    assert wait_until(lambda: not any(alive(p) for p in workers))
    # The workers unmount when their supervisor dies (fusermount3's auto_unmount races here).
    assert wait_until(lambda: not is_mounted(m.mountpoint), timeout=30), _fuse_holders()


def test_a_supervisor_stopped_past_its_wait_then_continued_keeps_the_mount(
    many_files, mount_bundle
):
    # Ctrl-Z, a cgroup freeze, or a debugger or py-spy attaching interrupt the supervisor's wait
    # for signals; a wait whose time ran out meanwhile once came back with a siginfo CPython never
    # filled in, and the supervisor stopped the mount (as if sent SIGHUP) or failed.
    src, bundle = many_files
    m = mount_bundle(bundle, "--workers", "2")
    workers = {w["pid"] for w in stats(m.mountpoint)["worker_processes"]}
    m.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(supervisor.IDLE_WAIT + 1.0)
    finally:
        m.process.send_signal(signal.SIGCONT)
    time.sleep(1.0)  # what the supervisor would have done by now
    assert m.process.poll() is None and is_mounted(m.mountpoint)
    subprocess.run(["diff", "-r", str(src), str(m.mountpoint)], check=True, timeout=120)
    assert {w["pid"] for w in stats(m.mountpoint)["worker_processes"]} == workers
    assert "stopping" not in m.log_text()


def test_the_open_path_is_served_by_one_process_and_says_why(many_files, mount_bundle):
    m = mount_bundle(many_files[1], "--workers", "4", "--open-mode", "open")
    served = stats(m.mountpoint)
    assert served["workers"] == 1 and "worker_processes" not in served
    assert served["single_process_reason"] == "--open-mode open"
    assert "serving in one process: --open-mode open" in m.log_text()


def test_workers_1_is_one_process(many_files, mount_bundle):
    m = mount_bundle(many_files[1], "--workers", "1")
    served = stats(m.mountpoint)
    assert (served["workers"], served["single_process_reason"]) == (1, "")
    children = [p for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == m.pid]
    commands = [_command(int(p)) for p in children]
    assert [c for c in commands if not c.startswith("fusermount3 ")] == []  # auto_unmount's helper


def _fuse_holders() -> list[str]:
    """Every process holding /dev/fuse open, with its command line (for a failure's message)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/fuse" for fd in fds):
                found.append(f"{pid} ({_parent(int(pid))}): {_command(int(pid))}")
        except OSError:
            continue
    return found


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().split(") ", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_ls_l_asks_the_daemon_for_no_security_label_or_acl_per_entry(many_files, mount_bundle):
    m = mount_bundle(many_files[1], "--workers", "2")
    before = stats(m.mountpoint)["requests"]["getxattr"]
    subprocess.run(["ls", "-lR", str(m.mountpoint)], check=True, capture_output=True, timeout=60)
    asked = stats(m.mountpoint)["requests"]["getxattr"] - before
    # GNU ls remembers "not supported" per file system: a few requests, not two per entry.
    assert asked <= 8, asked
    with pytest.raises(OSError) as caught:
        os.getxattr(m.mountpoint / "d0" / "f0000.bin", "security.selinux")
    assert caught.value.errno == errno.EOPNOTSUPP
    assert os.getxattr(m.mountpoint / "d0" / "f0000.bin", "user.bundlefs.crc32c")


def test_workers_come_from_the_flag_and_fstab_options():
    from bundlefs.cli.app import build_parser
    from bundlefs.cli.mount import options_from_args

    def options(*argv: str):
        return options_from_args(build_parser().parse_args(["mount", *argv, "b", "mnt"]))

    assert options().workers is None
    assert options("--workers", "3").workers == 3
    assert options("-o", "ro,workers=5").workers == 5


def test_workers_below_one_is_one_sentence(many_files, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "bundlefs", "mount", "--foreground", "--workers", "0",
         str(many_files[1]), str(mnt)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "--workers must be at least 1" in result.stderr
    assert "Traceback" not in result.stderr
    assert not os.path.ismount(mnt)


@pytest.mark.parametrize("option", ["io_uring", "clone_fd", "max_threads=8"])
def test_a_libfuse_transport_the_workers_do_not_use_is_refused(option):
    from bundlefs.cli.mount import parse_mount_options
    from bundlefs.errors import MountError

    with pytest.raises(MountError, match="is not supported: bundlefs serves /dev/fuse"):
        parse_mount_options([f"ro,{option}"])


def test_info_on_the_mount_names_the_daemon_its_workers_and_its_options(many_files, mount_bundle):
    m = mount_bundle(many_files[1], "--workers", "2", "--cache-size", "8MiB")

    def info(*flags: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "bundlefs", "info", *flags, str(m.mountpoint)],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip

    daemon = json.loads(info("--json"))["daemon"]
    assert daemon["pid"] == m.pid  # the supervisor: what kill and systemd name
    assert daemon["workers"] == 2 and daemon["version"] and daemon["started"]
    assert daemon["log"] == "stderr"  # the test harness runs it in the foreground
    assert daemon["index_steps"] == native.status  # "compiled" where make install built it
    assert daemon["options"]["cache_size"] == 8 * 1024 * 1024
    assert daemon["options"]["workers"] == 2
    text = info()
    assert f"daemon pid                 {m.pid}" in text
    workers = [line for line in text.splitlines() if line.startswith("daemon worker ")]
    assert len(workers) == 2 and all("resident" in w for w in workers)
