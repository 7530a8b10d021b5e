"""The packer under SIGKILL, under a changing source, and with unreadable files (issue 5).

Kills are placed by what the packer has produced, not by delays: the test polls the temporary
sibling ``.NAME.partial-PID`` and kills ``python -m bundlefs pack`` with SIGKILL as soon as a given
file appears (or grows past a size). Whatever the point, DEST must not exist afterwards — or, if
the kill came after the final rename, be a complete bundle — and the next pack to the same DEST
must succeed and leave no ``.partial-`` sibling behind.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bundlefs import Bundle, PackOptions, pack
from bundlefs.core import format as fmt
from bundlefs.errors import NotABundleError, PackError
from bundlefs.read.verify import verify

BUNDLEFS = [sys.executable, "-m", "bundlefs"]
FILE_SIZE = 12 * 1024
FILES = 2400  # ~28 MiB of incompressible data: packing takes long enough to be caught at work


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("crash") / "src"
    rng = random.Random(5)
    for i in range(FILES):
        d = root / f"d{i % 40:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05d}.bin").write_bytes(rng.randbytes(FILE_SIZE))
    return root


def _partial(dest: Path, pid: int) -> Path:
    return dest.parent / f".{dest.name}.partial-{pid}"


def _leftovers(dest: Path) -> list[str]:
    return [p.name for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}.partial-")]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


# What the partial directory holds when the kill comes: name -> predicate on the partial dir.
KILL_POINTS: dict[str, Callable[[Path], bool]] = {
    "partial directory created": lambda p: p.is_dir(),
    "first shard opened": lambda p: (p / fmt.shard_filename(0)).exists(),
    "first shard past 4 MiB": lambda p: _size(p / fmt.shard_filename(0)) > 4 * 2**20,
    "second shard opened": lambda p: (p / fmt.shard_filename(1)).exists(),
    "last shard past 4 MiB": lambda p: _size(p / fmt.shard_filename(2)) > 4 * 2**20,
    "index committed": lambda p: _size(p / fmt.INDEX_DIR / fmt.INDEX_FILE) > 64 * 1024,
    "completion marker written": lambda p: (p / fmt.MARKER_NAME).exists(),
}


def _pack_and_kill(source: Path, dest: Path, point: Callable[[Path], bool]) -> bool:
    """Start a pack, SIGKILL it when ``point`` holds; False if it finished first."""
    process = subprocess.Popen(
        [*BUNDLEFS, "pack", "-q", "--shard-size", "10M", str(source), str(dest)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    partial = _partial(dest, process.pid)
    deadline = time.monotonic() + 120
    try:
        while process.poll() is None and time.monotonic() < deadline:
            if point(partial):
                process.send_signal(signal.SIGKILL)
                process.wait()
                return True
            time.sleep(0.0005)
        return False
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stderr.close()


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_pack_killed_at_any_point_leaves_no_bundle_and_the_next_pack_succeeds(
    big_tree, tmp_path, point
):
    dest = tmp_path / "out.bundle"
    killed = _pack_and_kill(big_tree, dest, KILL_POINTS[point])
    if killed and os.path.lexists(dest):
        # Killed after the final rename: then DEST must be whole.
        assert verify(dest).ok
    elif killed:
        partial = [tmp_path / name for name in _leftovers(dest)]
        assert partial, "a killed pack leaves its temporary sibling for the next pack to clear"
        with pytest.raises(NotABundleError):
            Bundle(dest)
        if not (partial[0] / fmt.MARKER_NAME).exists():
            with pytest.raises(NotABundleError):  # IncompleteBundleError once index/ exists
                Bundle(partial[0])
    else:
        assert point == "completion marker written", f"the pack finished before {point!r}"
        shutil.rmtree(dest)
    result = subprocess.run(
        [*BUNDLEFS, "pack", "-q", "--force", str(big_tree), str(dest)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert _leftovers(dest) == []
    report = verify(dest)
    assert report.ok and report.files == FILES, report.problems[:3]


def test_a_pack_killed_twice_in_a_row_still_recovers(big_tree, tmp_path):
    dest = tmp_path / "twice.bundle"
    assert _pack_and_kill(big_tree, dest, KILL_POINTS["first shard opened"])
    assert _pack_and_kill(big_tree, dest, KILL_POINTS["first shard past 4 MiB"])
    # The second pack cleared the first one's sibling before it was killed in turn.
    assert len(_leftovers(dest)) == 1 and not dest.exists()
    pack(str(big_tree), str(dest))
    assert _leftovers(dest) == [] and verify(dest).ok


# --- a source that changes while it is packed -----------------------------------------------------

VERSION_A = b"a" * (3 * 2**20)
VERSION_B = bytes(random.Random(1).randbytes(2**20 + 17))


class _Churn:
    """A thread rewriting (or removing and recreating) one file in a loop until stopped."""

    def __init__(self, path: Path, *, vanish: bool) -> None:
        self.path = path
        self.vanish = vanish
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for content in (VERSION_A, VERSION_B):
                if self.vanish:
                    self.path.unlink(missing_ok=True)
                    time.sleep(0.0002)
                with open(self.path, "wb") as f:  # truncates: readers see every state between
                    f.write(content)
                self.rounds += 1

    def __enter__(self) -> _Churn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _churning_tree(root: Path) -> Path:
    rng = random.Random(2)
    for i in range(300):
        (root / f"steady{i:03d}").parent.mkdir(parents=True, exist_ok=True)
        (root / f"steady{i:03d}").write_bytes(rng.randbytes(4000))
    (root / "moving").write_bytes(VERSION_A)
    return root


@pytest.mark.parametrize("attempt", range(3))
def test_a_file_rewritten_while_packing_is_stored_consistently_and_reported(tmp_path, attempt):
    source = _churning_tree(tmp_path / "src")
    dest = tmp_path / "b"
    with _Churn(source / "moving", vanish=False):
        summary = pack(str(source), str(dest), PackOptions(record_size=64 * 1024))
    report = verify(dest)
    assert report.ok, report.problems[:3]  # size and CRC agree with the bytes stored
    with Bundle(dest) as b:
        stored = b.read("moving")
        assert b.read("steady007") == (source / "steady007").read_bytes()
    assert _a_state_it_had(stored) or "moving" in summary.changed


def _a_state_it_had(stored: bytes) -> bool:
    # Rewriting truncates, then writes: the file is empty or a prefix of a version in between.
    return VERSION_A.startswith(stored) or VERSION_B.startswith(stored)


@pytest.mark.parametrize("attempt", range(3))
def test_a_file_that_vanishes_while_packing_is_stored_skipped_or_named(tmp_path, attempt):
    source = _churning_tree(tmp_path / "src")
    dest = tmp_path / "b"
    with _Churn(source / "moving", vanish=True):
        try:
            summary = pack(str(source), str(dest))
        except PackError as e:
            assert "moving" in str(e)
            assert not dest.exists()
            return
    assert verify(dest).ok
    with Bundle(dest) as b:
        # Absent is fine too: the file may not have existed when its directory was listed.
        if b.exists("moving"):
            assert _a_state_it_had(b.read("moving")) or "moving" in summary.changed


def test_with_skip_errors_a_vanishing_file_never_fails_the_pack(tmp_path):
    source = _churning_tree(tmp_path / "src")
    dest = tmp_path / "b"
    with _Churn(source / "moving", vanish=True):
        summary = pack(str(source), str(dest), PackOptions(skip_errors=True))
    assert verify(dest).ok
    with Bundle(dest) as b:
        if b.exists("moving"):
            assert _a_state_it_had(b.read("moving")) or "moving" in summary.changed


# --- unreadable files -----------------------------------------------------------------------------
# Root reads past permissions, so the unreadable source is a real mount of a bundle with a damaged
# record: reading that one file fails with EIO, as on a failing disk or a flaky network share.


@pytest.fixture
def flaky_source(sample_bundle_path: Path, copy_bundle, mount_bundle) -> Path:
    bundle = copy_bundle(sample_bundle_path)
    with Bundle(bundle) as b:
        entry = b.resolve("noise.bin")
        # Its second record holds nothing but noise.bin (the first is shared with lines.txt).
        record = b.content.record_at(entry.shard, entry.offset + b.config.record_size)
    with open(bundle / fmt.shard_filename(record.shard), "r+b") as f:
        f.seek(record.stored_offset + 10)
        f.write(b"\xff\x00\xff")
    m = mount_bundle(bundle, allowed_log=[r"damaged data, read failed with EIO.*noise\.bin"])
    with pytest.raises(OSError):
        (m.mountpoint / "noise.bin").read_bytes()
    return m.mountpoint


@pytest.mark.mount
def test_an_unreadable_file_fails_the_pack_with_one_line_naming_it(flaky_source, tmp_path):
    dest = tmp_path / "out.bundle"
    result = subprocess.run(
        [*BUNDLEFS, "pack", str(flaky_source), str(dest)], capture_output=True, text=True
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines == ["bundlefs: error: cannot read noise.bin: Input/output error"], result.stderr
    assert not dest.exists() and _leftovers(dest) == []


@pytest.mark.mount
def test_with_skip_errors_an_unreadable_file_is_skipped_and_listed(flaky_source, tmp_path):
    dest = tmp_path / "out.bundle"
    summary = pack(str(flaky_source), str(dest), PackOptions(skip_errors=True))
    assert summary.skipped == ["noise.bin"]
    assert verify(dest).ok
    with Bundle(dest) as b:
        assert not b.exists("noise.bin")
        assert b.read("big.bin") == (flaky_source / "big.bin").read_bytes()
