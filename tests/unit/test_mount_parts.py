"""The mount's parts below the adapter, each alone: the counters' process view (``stats``), the
kernel probes (``kernel``), the checks and options before mounting (``preflight``), readiness
(``lifecycle``), the load-thread choice (``tuning``) and a worker's loop ending (``worker``). No
FUSE file system is mounted here.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from bundlefs.errors import MountError
from bundlefs.mount import kernel, lifecycle, preflight, tuning
from bundlefs.mount.options import MountOptions
from bundlefs.mount.stats import EIO, MountCounters, MountStats
from bundlefs.storage.store import FailedRead


def test_damage_is_counted_every_time_and_logged_once_per_record():
    stats = MountStats()
    key = (0, 3, "a.bin", "bad CRC")
    assert stats.failed_read(FailedRead.DAMAGE, key) is True
    assert stats.failed_read(FailedRead.DAMAGE, key) is False
    assert stats.failed_read(FailedRead.DAMAGE, (0, 4, "a.bin", "bad CRC")) is True
    counts = stats.counters.as_dict()
    assert (counts["eio_count"], counts["damage_eio_count"], counts["outage_eio_count"]) == (
        3,
        3,
        0,
    )


def test_an_outage_is_counted_apart_and_never_logged_as_damage():
    stats = MountStats()
    assert stats.failed_read(FailedRead.OUTAGE, (0, 3, None, "timed out")) is False
    counts = stats.counters.as_dict()
    assert (counts["eio_count"], counts["damage_eio_count"], counts["outage_eio_count"]) == (
        0,
        0,
        1,
    )


def test_shared_counters_are_reported_and_counted_into_the_given_slot():
    stats = MountStats()
    shared = MountCounters(3)
    stats.share(shared)  # the supervisor: reports them, counts into none of them
    assert stats.workers == 3
    stats.share(shared, 2)  # a worker
    stats.counters.count(EIO)
    assert shared.slot(2).get("eio_count") == 1
    assert shared.totals()["eio_count"] == 1


def test_no_open_is_refused_when_the_open_path_is_chosen():
    assert kernel.no_open_refused("open") == "chosen with --open-mode open"
    assert kernel.no_open_refused("auto") == (kernel.no_open_unavailable() or "")


def test_the_kernels_mount_options_name_the_bundle_escaped(tmp_path: Path):
    options = MountOptions(bundle="/data/a,b\\c.bundle", mountpoint=str(tmp_path))
    opts = preflight.fuse_options(options)
    assert "fsname=/data/a\\,b\\\\c.bundle" in opts
    assert {"ro", "nosuid", "nodev", "auto_unmount"} <= opts
    assert "allow_other" not in opts


def test_a_mount_point_that_holds_files_is_refused_unless_allowed(tmp_path: Path):
    (tmp_path / "kept").write_text("x")
    with pytest.raises(MountError, match="not empty"):
        preflight.check_mountpoint(str(tmp_path))
    preflight.check_mountpoint(str(tmp_path), allow_nonempty=True)


def test_workers_below_one_are_refused(tmp_path: Path):
    options = MountOptions(bundle=str(tmp_path / "b"), mountpoint=str(tmp_path), workers=0)
    with pytest.raises(MountError, match="--workers must be at least 1"):
        preflight.choose_workers(options, pytest)  # any module: not reached


def test_the_default_is_one_worker_per_usable_cpu_at_least_two_at_most_eight(monkeypatch):
    from bundlefs.mount import options as mount_options

    for cpus, workers in ((1, 2), (2, 2), (3, 3), (64, 8)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)))
        assert mount_options.default_workers() == workers


def test_a_default_mount_on_a_patched_binding_is_served_by_workers(tmp_path: Path):
    options = MountOptions(bundle=str(tmp_path / "b"), mountpoint=str(tmp_path))

    class Patched:
        get_session_fd = None

    workers, reason = preflight.choose_workers(options, Patched)  # type: ignore[arg-type]
    assert workers >= 2 and reason == ""


def test_load_threads_follow_the_worker_count_unless_given(sample_bundle_path: Path):
    from bundlefs import Bundle

    options = MountOptions(bundle=str(sample_bundle_path), mountpoint="/mnt")
    with Bundle(str(sample_bundle_path)) as bundle:
        assert tuning.load_threads(options, 1, bundle) == 4
        assert tuning.load_threads(options, 4, bundle) == 0
        given = MountOptions(bundle=str(sample_bundle_path), mountpoint="/mnt", load_threads=2)
        assert tuning.load_threads(given, 4, bundle) == 2


def test_readiness_in_the_foreground_tells_systemd(tmp_path: Path, monkeypatch):
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(address)
        monkeypatch.setenv("NOTIFY_SOCKET", address)
        lifecycle.Readiness().ready("serving B")
        assert listener.recv(100) == b"READY=1\nSTATUS=serving B"


def test_a_missing_trio_is_one_sentence_before_mounting(monkeypatch):
    # The patched binding imports trio only on first use: its absence must still be said
    # before a mount starts, not when a one-process loop first needs it.
    import importlib.util

    from bundlefs.mount import bindings

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "trio" else real(name, *a)
    )
    with pytest.raises(MountError, match="trio is not installed: pip install 'bundlefs.mount.'"):
        bindings.load.__wrapped__()
