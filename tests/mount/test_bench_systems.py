"""bench.systems mounts what it measures through the tests' harness (tests/support/mounting.py):
ready once the mount table lists the mount point and its root answers, the serving process known,
torn down whatever happens."""

from __future__ import annotations

import pytest

from bench.systems import Bundlefs, mounted
from tests.conftest import SAMPLE_FILES
from tests.support.mounting import is_mounted

pytestmark = pytest.mark.mount


def test_the_bench_mounts_bundlefs_through_the_harness_and_unmounts_it(
    sample_bundle_path, tmp_path
):
    with mounted(Bundlefs(tmp_path / "work"), sample_bundle_path, tmp_path / "mnt") as m:
        assert m.daemon is not None and m.pid == m.daemon.pid
        assert is_mounted(m.root) and m.ready_seconds > 0
        for name, data in SAMPLE_FILES.items():
            assert (m.root / name).read_bytes() == data
    assert not is_mounted(tmp_path / "mnt")
    assert m.daemon.process.poll() is not None


def test_a_daemon_that_exits_before_it_mounts_is_named_with_its_log(tmp_path):
    (tmp_path / "not-a-bundle").mkdir()
    with pytest.raises(RuntimeError, match=r"(?s)^bundlefs: mount daemon exited with \d+.*bundle"):
        Bundlefs(tmp_path / "work").mount(tmp_path / "not-a-bundle", tmp_path / "mnt", timeout=30)
    assert not is_mounted(tmp_path / "mnt")
