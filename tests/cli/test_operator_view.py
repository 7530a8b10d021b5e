"""What an operator sees: a pack to a URL reports its build and its upload apart and shows the
upload's progress; the daemon logs its counters as JSON; under journald (stderr is the stream
``JOURNAL_STREAM`` names, as systemd sets it for a service) lines carry a priority prefix and no
timestamp or PID of their own.

Real packs to the local moto server (``tests/support/s3server.py``), real mounts
(``tests/support/mounting.py``).
"""

from __future__ import annotations

import errno
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import bundlefs
from bundlefs.core import format as fmt
from tests.conftest import SAMPLE_FILES, flip_byte, pseudo_random_bytes
from tests.support.mounting import mounted, wait_until
from tests.support.s3server import S3Server, s3_server
from tests.support.trees import run_cli

__all__ = ["s3_server"]  # a fixture, imported to be found

_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d")


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Several shards at --shard-size 256K: an upload of several objects."""
    src = tmp_path_factory.mktemp("operator") / "src"
    src.mkdir()
    for i in range(8):
        (src / f"{i}.bin").write_bytes(pseudo_random_bytes(200_000, i, compressible=False))
    return src


def _store_flags(server: S3Server) -> list[str]:
    return ["--storage-option", f"endpoint_url={server.endpoint}",
            "--storage-option", "key=test", "--storage-option", "secret=test"]  # fmt: skip


def _new_url(server: S3Server) -> str:
    server.create_bucket("operator")
    return f"s3://operator/{uuid.uuid4().hex[:8]}.bundle"


# -- pack to a URL ---------------------------------------------------------------------------------


def test_a_pack_to_a_url_reports_build_and_upload_times_apart(s3_server, big_tree):
    url = _new_url(s3_server)
    result = run_cli("pack", "--shard-size", "256K", big_tree, url, *_store_flags(s3_server))
    assert result.returncode == 0, result.stderr
    line = result.stdout.decode()
    found = re.search(
        r"in (?P<total>[\d.]+) s \(built in (?P<build>[\d.]+) s, [\d.]+ MB/s; uploaded "
        r"(?P<size>[\d.]+ \w+) in (?P<upload>[\d.]+) s, [\d.]+ MB/s\): " + re.escape(url),
        line,
    )
    assert found, line
    total, build, upload = (float(found[k]) for k in ("total", "build", "upload"))
    assert upload > 0 and build > 0
    assert total >= build + upload - 0.02  # the whole pack, not the build alone

    result = run_cli("pack", "--json", "--shard-size", "256K", big_tree, _new_url(s3_server),
                     *_store_flags(s3_server))  # fmt: skip
    facts = json.loads(result.stdout)
    assert facts["seconds"] >= facts["build_seconds"] + facts["upload_seconds"] - 0.002
    assert facts["uploaded_bytes"] > facts["stored_bytes"]  # shards, the index and the marker


def test_a_local_pack_reports_one_time_as_before(big_tree, tmp_path):
    result = run_cli("pack", big_tree, tmp_path / "b.bundle")
    assert result.returncode == 0, result.stderr
    assert "built in" not in result.stdout.decode() and "uploaded" not in result.stdout.decode()
    facts = json.loads(run_cli("pack", "--json", big_tree, tmp_path / "c.bundle").stdout)
    assert "upload_seconds" not in facts


def test_pack_reports_the_upload_as_it_goes(s3_server, big_tree, tmp_path):
    from bundlefs.packing.packer import PackOptions, pack

    seen = []

    def progress(p):
        if p.upload is not None:
            seen.append((p.upload.bytes_done, p.upload.objects_done, p.upload.total_bytes))

    options = PackOptions(shard_size=256 * 1024, staging=str(tmp_path),
                          storage_options={"endpoint_url": s3_server.endpoint,
                                           "key": "test", "secret": "test"})  # fmt: skip
    summary = pack(str(big_tree), _new_url(s3_server), options, progress)
    total = seen[-1][2]
    assert total == summary.uploaded_bytes
    assert len({done for done, _, _ in seen}) > 3  # several steps, not one at the end
    assert [done for done, _, _ in seen] == sorted(done for done, _, _ in seen)
    assert seen[-1][0] == total and seen[-1][1] >= 3  # shards, the index, the marker
    assert 0 < seen[0][0] < total


def test_the_pack_command_shows_upload_progress_on_a_terminal(s3_server, big_tree):
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "bundlefs", "pack", "--shard-size", "256K", str(big_tree),
             _new_url(s3_server), *_store_flags(s3_server)],
            stdout=subprocess.PIPE, stderr=terminal,
        )  # fmt: skip
        os.close(terminal)
        shown = b""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 1)
            if ready:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # EIO: the writer closed its end
                    break
                if not chunk:
                    break
                shown += chunk
            elif process.poll() is not None:
                break
        assert process.wait(60) == 0
        process.stdout.close()
    finally:
        os.close(controller)
    assert re.search(rb"uploading: [\d.]+ \w+ of [\d.]+ \w+ \(\d+%\), [\d.]+ MB/s", shown), shown


# -- the daemon's log ------------------------------------------------------------------------------


def test_the_daemon_logs_its_counters_as_json(sample_bundle_path, mount_bundle):
    m = mount_bundle(sample_bundle_path)
    assert (m.mountpoint / "hello.txt").read_bytes() == SAMPLE_FILES["hello.txt"]
    os.kill(m.pid, signal.SIGUSR1)
    assert wait_until(lambda: " stats {" in m.log_text())
    line = next(x for x in m.log_text().splitlines() if " stats {" in x)
    stats = json.loads(line.split(" stats ", 1)[1])
    assert stats["cache_misses"] >= 1 and isinstance(stats["requests"], dict)


def _journal_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file that stands for journald's stream: JOURNAL_STREAM names its device and inode, as
    systemd names the socket it connects to a service's stderr (the daemon writes to it)."""
    log = tmp_path / "journal.log"
    log.touch()
    st = log.stat()
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    return log


def test_under_journald_lines_carry_priorities_and_no_time_or_pid(pack_tree, tmp_path,
                                                                   monkeypatch):  # fmt: skip

    victim = pseudo_random_bytes(2 * 4096, seed=7, compressible=False)
    bundle = pack_tree({"victim.bin": victim, "fine.txt": b"fine\n"}, record_size=4096)
    with bundlefs.Bundle(bundle) as b:
        record = b.content.record_at(0, b.resolve("victim.bin").offset + 4096)
    flip_byte(bundle / fmt.shard_filename(0), record.stored_offset + 10)
    log = _journal_log(tmp_path, monkeypatch)
    with mounted(bundle, tmp_path / "mnt", log_path=log,
                 allowed_log=[r"ERROR .*damaged data"]) as m:  # fmt: skip
        assert log.stat().st_ino == int(os.environ["JOURNAL_STREAM"].split(":")[1])
        with pytest.raises(OSError) as e:
            (m.mountpoint / "victim.bin").read_bytes()
        assert e.value.errno == errno.EIO
        os.kill(m.pid, signal.SIGUSR1)
        assert wait_until(lambda: " stats {" in m.log_text())
    lines = m.log_text().splitlines()
    assert lines and all(re.match(r"<[2-7]>", line) for line in lines), lines
    errors = [line for line in lines if line.startswith("<3>")]
    assert errors and all("damaged data" in line for line in errors), lines
    assert any(line.startswith("<6>INFO bundlefs") and "mounted" in line for line in lines)
    for line in lines:
        assert not _TIMESTAMP.search(line) and f"[{m.pid}]" not in line, line


def test_a_one_sentence_failure_reaches_the_journal_as_an_error(tmp_path, monkeypatch):
    log = _journal_log(tmp_path, monkeypatch)
    with open(log, "wb") as stderr:  # the same inode: "wb" truncates, it does not replace
        result = subprocess.run(
            [sys.executable, "-m", "bundlefs", "info", str(tmp_path / "missing.bundle")],
            stderr=stderr, timeout=60,
        )  # fmt: skip
    assert result.returncode == 1
    assert log.read_text().startswith("<3>bundlefs: error: "), log.read_text()


def test_without_journald_the_foreground_log_keeps_its_timestamps(sample_bundle_path, tmp_path,
                                                                   monkeypatch):  # fmt: skip
    # JOURNAL_STREAM inherited by a process whose stderr is somewhere else: not the journal.
    monkeypatch.setenv("JOURNAL_STREAM", "1:1")

    with mounted(sample_bundle_path, tmp_path / "mnt", log_path=tmp_path / "d.log") as m:
        pass
    first = m.log_text().splitlines()[0]
    assert _TIMESTAMP.match(first) and f"bundlefs[{m.pid}]" in first, first
