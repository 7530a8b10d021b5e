"""The packer never harms what it does not own, and fails as one PackError leaving nothing behind.

DEST may only be replaced when it is a bundle and does not overlap the source (through any
symlink); the packer never reads its own output; a forced replacement never leaves DEST missing;
cleaners delete only temporary directories no live packer holds; a full disk or a failed rename
is a PackError. Faults are injected by replacing the packer's collaborators, never by timing.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bundlefs import Bundle, PackOptions, pack
from bundlefs.core import format as fmt
from bundlefs.core import libc
from bundlefs.errors import PackError
from bundlefs.packing import content, packer
from bundlefs.storage import publish
from bundlefs.storage.index import IndexWriter
from bundlefs.storage.publish import partial_dir, remove_stale_partials
from bundlefs.storage.shards import ShardWriter
from tests.conftest import build_tree

FORCE = PackOptions(force=True)


def _names(path: Path) -> list[str]:
    return sorted(os.listdir(path))


def _listing(bundle: Path) -> list[str]:
    with Bundle(bundle) as b:
        return b.listdir("")


@pytest.fixture
def old_bundle(tmp_path: Path) -> Path:
    """A bundle at tmp_path/b.bundle holding one file ``old``; its source is removed."""
    src = build_tree(tmp_path / "old.src", {"old": b"old"})
    pack(str(src), str(tmp_path / "b.bundle"))
    shutil.rmtree(src)
    return tmp_path / "b.bundle"


@pytest.fixture
def new_src(tmp_path: Path) -> Path:
    return build_tree(tmp_path / "new.src", {"new": b"new"})


# --- bounded packs: a regression must not be able to fill the disk --------------------------------

_FILE_SIZE_LIMIT = 32 * 1024 * 1024


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (_FILE_SIZE_LIMIT, _FILE_SIZE_LIMIT))


def _bounded_pack(code: str, prefix: list[str] | None = None) -> dict:
    """Run ``code`` (which prints one JSON line) in a child that may write no file over 32 MiB."""
    program = (
        "import json, os\nfrom bundlefs import Bundle, PackOptions, pack\n"
        "from bundlefs.packing import destination\n"
    )
    result = subprocess.run(
        [*(prefix or []), sys.executable, "-c", program + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_file_size,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


# --- 1. DEST overlapping the source, or not a bundle ----------------------------------------------


def test_force_refuses_a_dest_that_contains_the_source(tmp_path: Path) -> None:
    home = tmp_path / "home"
    src = build_tree(home / "x", {"f": b"precious"})
    with pytest.raises(PackError, match="is inside .*which a pack would replace"):
        pack(str(src), str(home), FORCE)
    assert (src / "f").read_bytes() == b"precious"
    assert _names(home) == ["x"]


def test_force_refuses_a_dest_that_is_the_source(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", {"f": b"precious"})
    with pytest.raises(PackError):
        pack(str(src), str(src), FORCE)
    assert (src / "f").read_bytes() == b"precious"
    assert _names(tmp_path) == ["src"]


def test_force_refuses_a_bundle_dest_that_holds_the_source_behind_a_symlink(
    tmp_path: Path, old_bundle: Path
) -> None:
    src = build_tree(old_bundle / "sub", {"f": b"precious"})  # readers ignore other files
    (tmp_path / "s").symlink_to(src)
    with pytest.raises(PackError, match="is inside .*which a pack would replace"):
        pack(str(tmp_path / "s"), str(old_bundle), FORCE)
    assert (src / "f").read_bytes() == b"precious"
    assert _listing(old_bundle) == ["old"]


def test_force_refuses_a_directory_that_is_not_a_bundle(tmp_path: Path, new_src: Path) -> None:
    dest = build_tree(tmp_path / "dest", {"index": {"notes": b"mine"}, "COMPLETE.txt": b""})
    with pytest.raises(PackError, match="exists and is not a bundle; refusing to replace it"):
        pack(str(new_src), str(dest), FORCE)
    assert (dest / "index" / "notes").read_bytes() == b"mine"
    assert _names(tmp_path) == ["dest", "new.src"]


def test_force_refuses_a_file_at_dest(tmp_path: Path, new_src: Path) -> None:
    (tmp_path / "dest").write_bytes(b"precious")
    with pytest.raises(PackError, match="not a bundle"):
        pack(str(new_src), str(tmp_path / "dest"), FORCE)
    assert (tmp_path / "dest").read_bytes() == b"precious"


def test_force_refuses_a_symlink_at_dest_even_to_a_bundle(
    tmp_path: Path, old_bundle: Path, new_src: Path
) -> None:
    (tmp_path / "link").symlink_to(old_bundle)
    with pytest.raises(PackError, match="not a bundle"):
        pack(str(new_src), str(tmp_path / "link"), FORCE)
    assert (tmp_path / "link").is_symlink()
    assert _listing(old_bundle) == ["old"]


def test_force_replaces_an_incomplete_bundle(
    tmp_path: Path, old_bundle: Path, new_src: Path
) -> None:
    (old_bundle / fmt.MARKER_NAME).unlink()
    pack(str(new_src), str(old_bundle), FORCE)
    assert _listing(old_bundle) == ["new"]
    assert _names(tmp_path) == ["b.bundle", "new.src"]


# --- 2. the packer never reads its own output -----------------------------------------------------


def test_dest_inside_the_source_through_a_symlink_is_refused(tmp_path: Path) -> None:
    build_tree(tmp_path / "src", {"f": b"x"})
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "s").symlink_to(tmp_path / "src")
    outcome = _bounded_pack(
        f"""
        try:
            pack({str(tmp_path / "src")!r}, {str(tmp_path / "links" / "s" / "out")!r})
            print(json.dumps("packed"))
        except Exception as e:
            print(json.dumps(type(e).__name__))
        """
    )
    assert outcome == "PackError"
    assert _names(tmp_path / "src") == ["f"]


def test_the_walk_skips_the_work_directory_where_paths_cannot_tell(tmp_path: Path) -> None:
    # Stands in for a bind mount: the path checks are switched off, so only the walk's
    # (st_dev, st_ino) test keeps the packer from reading its own growing output.
    src = build_tree(tmp_path / "src", {"f": b"x"})
    outcome = _bounded_pack(
        f"""
        destination.check_places = lambda *args: None
        pack({str(src)!r}, {str(src / "out")!r})
        with Bundle({str(src / "out")!r}) as b:
            print(json.dumps(b.listdir("")))
        """
    )
    assert outcome == ["f"]


def _can_bind_mount(tmp_path: Path) -> bool:
    (tmp_path / "probe-a").mkdir()
    (tmp_path / "probe-b").mkdir()
    probe = f"mount --bind {tmp_path / 'probe-a'} {tmp_path / 'probe-b'}"
    try:
        result = subprocess.run(
            ["unshare", "-m", "sh", "-c", probe], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        (tmp_path / "probe-a").rmdir()
        (tmp_path / "probe-b").rmdir()
    return result.returncode == 0


def test_the_walk_skips_the_work_directory_seen_through_a_bind_mount(tmp_path: Path) -> None:
    if not _can_bind_mount(tmp_path):
        pytest.skip("needs unshare -m and mount --bind (root in a private mount namespace)")
    src = build_tree(tmp_path / "src", {"f": b"x", "m": {}})
    out = tmp_path / "out"
    out.mkdir()
    code = f"""
        pack({str(src)!r}, {str(out / "b.bundle")!r})
        with Bundle({str(out / "b.bundle")!r}) as b:
            print(json.dumps([b.listdir(""), b.listdir("m")]))
        """
    # Inside the child's private mount namespace src/m shows out/, where the work directory is.
    mount = [
        "unshare",
        "-m",
        "sh",
        "-c",
        'mount --bind "$0" "$1" && shift && exec "$@"',
        out,
        src / "m",
    ]
    outcome = _bounded_pack(code, [*map(str, mount)])
    assert outcome == [["f", "m"], []]


# --- 3. a forced replacement never leaves DEST missing --------------------------------------------


def test_force_swaps_the_bundles_in_one_exchange(
    tmp_path: Path, old_bundle: Path, new_src: Path, monkeypatch
) -> None:
    calls = []
    real = publish.renameat2

    def spy(src: str, dst: str, flags: int) -> None:
        real(src, dst, flags)
        calls.append(flags)

    monkeypatch.setattr(publish, "renameat2", spy)

    def no_plain_rename(src, dst) -> None:
        raise AssertionError("DEST was replaced with plain renames")

    monkeypatch.setattr(os, "rename", no_plain_rename)
    pack(str(new_src), str(old_bundle), FORCE)
    assert calls == [libc.RENAME_EXCHANGE]
    assert _listing(old_bundle) == ["new"]
    assert _names(tmp_path) == ["b.bundle", "new.src"]


def test_a_failed_exchange_leaves_the_old_bundle_in_place(
    tmp_path: Path, old_bundle: Path, new_src: Path, monkeypatch
) -> None:
    def fail(src: str, dst: str, flags: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO), src)

    monkeypatch.setattr(publish, "renameat2", fail)
    with pytest.raises(PackError, match="cannot replace"):
        pack(str(new_src), str(old_bundle), FORCE)
    assert _listing(old_bundle) == ["old"]
    assert _names(tmp_path) == ["b.bundle", "new.src"]


def _no_renameat2(monkeypatch) -> None:
    def missing(src: str, dst: str, flags: int) -> None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), src)

    monkeypatch.setattr(publish, "renameat2", missing)


def test_without_renameat2_force_replaces_with_two_renames(
    tmp_path: Path, old_bundle: Path, new_src: Path, monkeypatch
) -> None:
    _no_renameat2(monkeypatch)
    pack(str(new_src), str(old_bundle), FORCE)
    assert _listing(old_bundle) == ["new"]
    assert _names(tmp_path) == ["b.bundle", "new.src"]


def _failing_rename(monkeypatch, fails) -> None:
    """os.rename raises ENOSPC when ``fails(src, dst)``."""
    real = os.rename

    def rename(src, dst) -> None:
        if fails(os.fspath(src), os.fspath(dst)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), src)
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)


def test_without_renameat2_a_failed_move_puts_the_old_bundle_back(
    tmp_path: Path, old_bundle: Path, new_src: Path, monkeypatch
) -> None:
    _no_renameat2(monkeypatch)
    _failing_rename(monkeypatch, lambda src, dst: ".partial-" in src)
    with pytest.raises(PackError, match="No space left on device"):
        pack(str(new_src), str(old_bundle), FORCE)
    assert _listing(old_bundle) == ["old"]
    assert _names(tmp_path) == ["b.bundle", "new.src"]


def test_without_renameat2_an_old_bundle_that_cannot_go_back_is_kept_and_named(
    tmp_path: Path, old_bundle: Path, new_src: Path, monkeypatch
) -> None:
    _no_renameat2(monkeypatch)
    _failing_rename(monkeypatch, lambda src, dst: dst == str(old_bundle))
    with pytest.raises(PackError, match=r"\.b\.bundle\.previous-") as raised:
        pack(str(new_src), str(old_bundle), FORCE)
    aside = tmp_path / f".b.bundle.previous-{os.getpid()}"
    assert str(aside) in str(raised.value)
    monkeypatch.undo()
    assert remove_stale_partials(str(old_bundle)) == []  # cleaners never touch it
    assert _listing(aside) == ["old"]


# --- 4. cleaners delete only what no live packer holds --------------------------------------------

_HOLD_LOCK = """
import fcntl, os, sys
fds = [os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in sys.argv[1:]]
for fd in fds:
    fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


def test_partials_locked_by_another_process_are_left_and_unlocked_ones_removed(
    tmp_path: Path,
) -> None:
    dest = tmp_path / "b.bundle"
    held = [tmp_path / ".b.bundle.partial-1", tmp_path / ".b.bundle.partial-2.old"]
    stale = [tmp_path / ".b.bundle.partial-3", tmp_path / ".b.bundle.partial-x.old"]
    for d in held + stale:
        build_tree(d, {"index": {"data.mdb": b""}})
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, *map(str, held)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        removed = remove_stale_partials(str(dest))
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()
    assert sorted(removed) == sorted(d.name for d in stale)
    assert _names(tmp_path) == sorted(d.name for d in held)


def test_a_live_pack_keeps_its_work_directory_from_cleaners(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", {"a": b"1", "b": b"2"})
    dest = tmp_path / "b.bundle"
    removed = []

    def clean_while_packing(rel: bytes, st: os.stat_result) -> None:
        removed.extend(remove_stale_partials(str(dest)))

    pack(str(src), str(dest), PackOptions(user_data=clean_while_packing))
    assert removed == []
    assert _listing(dest) == ["a", "b"]


# --- 5. every failure is a PackError, and leaves nothing behind -----------------------------------


def test_a_file_in_the_way_of_the_work_directory_is_a_pack_error(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", {"f": b"x"})
    dest = tmp_path / "b.bundle"
    Path(partial_dir(str(dest))).write_bytes(b"not ours")
    with pytest.raises(PackError, match="cannot create the temporary directory"):
        pack(str(src), str(dest))
    assert Path(partial_dir(str(dest))).read_bytes() == b"not ours"
    assert not dest.exists()


def test_a_full_index_is_a_pack_error_and_the_index_is_closed(tmp_path: Path, monkeypatch) -> None:
    src = build_tree(tmp_path / "src", {f"f{i:04d}": b"x" for i in range(2000)})
    writers = []

    class TinyIndex(IndexWriter):
        def __init__(self, index_dir: str) -> None:
            super().__init__(index_dir, map_size=64 * 1024)
            self.aborted = False
            writers.append(self)

        def abort(self) -> None:
            self.aborted = True
            super().abort()

    monkeypatch.setattr(packer, "IndexWriter", TinyIndex)
    with pytest.raises(PackError, match="cannot write the index"):
        pack(str(src), str(tmp_path / "b.bundle"))
    assert [w.aborted for w in writers] == [True]
    assert _names(tmp_path) == ["src"]


def test_a_full_disk_while_writing_shards_is_a_pack_error(tmp_path: Path, monkeypatch) -> None:
    src = build_tree(tmp_path / "src", {f"f{i}": os.urandom(1) * 300_000 for i in range(8)})

    class FullDisk(ShardWriter):
        def write(self, data) -> None:
            if self.stream_size > 1_000_000:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            super().write(data)

    monkeypatch.setattr(content, "ShardWriter", FullDisk)
    with pytest.raises(PackError, match="No space left on device"):
        pack(str(src), str(tmp_path / "b.bundle"))
    assert _names(tmp_path) == ["src"]


def test_a_failed_final_rename_is_a_pack_error(tmp_path: Path, monkeypatch) -> None:
    src = build_tree(tmp_path / "src", {"f": b"x"})

    def full(src: str, dst: str, flags: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), src)

    monkeypatch.setattr(publish, "renameat2", full)
    with pytest.raises(PackError, match="No space left on device"):
        pack(str(src), str(tmp_path / "b.bundle"))
    assert _names(tmp_path) == ["src"]


def test_a_failed_plain_rename_is_a_pack_error(tmp_path: Path, monkeypatch) -> None:
    src = build_tree(tmp_path / "src", {"f": b"x"})
    _no_renameat2(monkeypatch)
    _failing_rename(monkeypatch, lambda src, dst: True)
    with pytest.raises(PackError, match="No space left on device"):
        pack(str(src), str(tmp_path / "b.bundle"))
    assert _names(tmp_path) == ["src"]


def test_an_interrupt_propagates_and_leaves_nothing_behind(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", {"f": b"x"})

    def interrupt(rel: bytes, st: os.stat_result) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack(str(src), str(tmp_path / "b.bundle"), PackOptions(user_data=interrupt))
    assert _names(tmp_path) == ["src"]
