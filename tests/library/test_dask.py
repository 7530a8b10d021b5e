"""Distributed packing (issue 13): the partition planner, the partition source and task, and
packs on a real ``LocalCluster`` of worker processes (a worker killed mid-pack included) that
must equal a single-machine pack of the same source, entry for entry.

One cluster (two single-threaded worker processes) serves the whole module and is closed at its
end; the CLI test starts its own ``local:2`` cluster in the ``bundlefs`` subprocess.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

from distributed import Client, LocalCluster, WorkerPlugin  # noqa: E402

from bundlefs import Bundle, PackError  # noqa: E402
from bundlefs.integrations import dask as on_dask  # noqa: E402
from bundlefs.integrations.dask import pack_with_dask  # noqa: E402
from bundlefs.packing.distributed.area import PackCancelled  # noqa: E402
from bundlefs.packing.distributed.plan import Partition, plan_archives, plan_directory  # noqa: E402
from bundlefs.packing.distributed.source import PartitionSource  # noqa: E402
from bundlefs.packing.distributed.task import PartTask, pack_partition  # noqa: E402
from bundlefs.packing.options import PackSummary  # noqa: E402
from bundlefs.packing.packer import PackOptions, pack  # noqa: E402
from bundlefs.packing.sources.base import SourceErrors  # noqa: E402
from bundlefs.read.verify import verify  # noqa: E402
from bundlefs.storage.index import IndexReader  # noqa: E402
from tests.conftest import (  # noqa: E402
    FIXED_MTIME_NS,
    HardLink,
    Symlink,
    build_tree,
    bundle_file_bytes,
    pseudo_random_bytes,
)
from tests.support.pausing import interrupted  # noqa: E402
from tests.support.s3server import S3Server, s3_server  # noqa: E402
from tests.support.trees import (  # noqa: E402
    MTIME_NS,
    assert_one_line_error,
    build_rich_tree,
    run_cli,
)

__all__ = ["s3_server"]  # a fixture, imported to be found

CREATED = 1_700_000_000 * 10**9
OPTIONS = PackOptions(created_ns=CREATED, record_size=16 * 1024)


# -- helpers ---------------------------------------------------------------------------------------


def bundle_tree(path: str | os.PathLike, **bundle_options: object) -> dict[str, tuple]:
    """path -> (mode, mtime, uid, gid, size, content or target, hard-link group, nlink, user
    data, content type) of every entry, the root included: what 'the same content' means."""
    out: dict[str, tuple] = {}
    first: dict[int, str] = {}
    with Bundle(path, **bundle_options) as b:
        pending = [""]
        while pending:
            top = pending.pop()
            st = b.lstat(top)
            if stat.S_ISLNK(st.st_mode):
                data: bytes | str | None = b.readlink(top)
            elif stat.S_ISREG(st.st_mode):
                data = b.read(top)
            elif stat.S_ISDIR(st.st_mode):
                data = None
                pending += [f"{top}/{n}" if top else n for n in b.listdir(top)]
            else:  # a FIFO, socket or device: its number is what it holds
                data = str(st.st_rdev)
            group = first.setdefault(st.st_ino, top) if stat.S_ISREG(st.st_mode) else top
            size = 0 if stat.S_ISDIR(st.st_mode) else st.st_size
            out[top] = (
                st.st_mode,
                st.st_mtime_ns,
                st.st_uid,
                st.st_gid,
                size,
                data,
                group,
                st.st_nlink,
                st.user_data,
                st.content_type,
            )
    return out


def index_entries(path: str | os.PathLike) -> list:
    """Every index entry in inode order, without where its content is stored (shard, offset)."""
    reader = IndexReader(os.fspath(path))
    try:
        count = reader.config.entry_count
        entries = [reader.entry(i) for i in range(1, count + 1)]
    finally:
        reader.close()
    return [dataclasses.replace(e, shard=0, offset=0) for e in entries]


def assert_same_as_single_machine(single: Path, distributed_pack: Path) -> None:
    assert bundle_tree(distributed_pack) == bundle_tree(single)
    # Numbered as a pack of the union tree: the same inode for every path, the same flags.
    assert index_entries(distributed_pack) == index_entries(single)
    assert verify(str(distributed_pack)).ok


def leftovers(directory: Path, *expected: str) -> list[str]:
    """What is in ``directory`` besides ``expected``: staging areas, partials, merged bundles."""
    return sorted(set(os.listdir(directory)) - set(expected))


def delivered(root: Path, part: Partition) -> set[bytes]:
    """The non-directory paths a partition's source delivers, walking it as the builder does."""
    source = PartitionSource(str(root), part, SourceErrors(False))
    found: set[bytes] = set()
    pending = [b""]
    while pending:
        rel = pending.pop()
        for item in source.children(rel):
            if stat.S_ISDIR(item.st.st_mode):
                pending.append(item.rel)
            else:
                found.add(item.rel)
    return found


def tree_leaves(root: Path) -> set[bytes]:
    """Every non-directory path below ``root`` and every empty directory."""
    base = os.fsencode(root)
    out = set()
    for top, dirs, files in os.walk(base):
        rel = os.path.relpath(top, base)
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            out.add(name if rel == b"." else os.path.join(rel, name))
    return out


def spread_tree(root: Path, dirs: int = 12, seed: int = 3) -> Path:
    """Directories of uneven sizes, nested ones, empty ones, symlinks and hard links across
    far-apart directories (so some partitions must take names from others' ranges)."""
    spec: dict = {}
    for d in range(dirs):
        files = {
            f"f{i:03d}.bin": pseudo_random_bytes(200 + (i * 997 + d * 131) % 9000, seed=d * 100 + i)
            for i in range(5 + (d * 7) % 30)
        }
        files["nested"] = {"deeper": {"x.txt": b"x" * d}, "empty": {}}
        spec[f"d{d:02d}"] = files
    spec["d00"]["link-to-far"] = Symlink("../d11/f000.bin")
    spec["d11"]["hard-from-first"] = HardLink("d00/f000.bin")
    spec["d06"]["hard-too"] = HardLink("d00/f000.bin")
    spec["empty-at-root"] = {}
    spec["zz-dangling"] = Symlink("no/such/thing")
    return build_tree(root, spec, mtime_ns=FIXED_MTIME_NS)


# -- the cluster -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Client]:
    """Two single-threaded worker processes, shared by the module's tests, closed at its end."""
    cluster = LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.CRITICAL,
    )
    client = Client(cluster, set_as_default=False)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture
def client(cluster: Client) -> Client:
    cluster.wait_for_workers(2, timeout=60)
    return cluster


# -- planning (pure, no cluster) -------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 40])
def test_partitions_cover_every_entry_exactly_once(tmp_path: Path, count: int) -> None:
    root = spread_tree(tmp_path / "src")
    plan = plan_directory(str(root), count)
    seen: dict[bytes, int] = {}
    for part in plan.partitions:
        for rel in delivered(root, part):
            assert rel not in seen, (rel, seen.get(rel), part.index)
            seen[rel] = part.index
    # Empty directories are delivered as directories: every leaf is someone's.
    files = {r for r in tree_leaves(root) if not os.path.isdir(os.path.join(root, os.fsdecode(r)))}
    assert set(seen) == files
    assert sum(p.entries for p in plan.partitions) == plan.entries
    assert sum(p.data_bytes for p in plan.partitions) == plan.data_bytes


def test_hard_linked_names_are_packed_by_one_partition(tmp_path: Path) -> None:
    root = spread_tree(tmp_path / "src")
    names = {b"d00/f000.bin", b"d11/hard-from-first", b"d06/hard-too"}
    for count in (2, 3, 5, 8):
        plan = plan_directory(str(root), count)
        holders = [p.index for p in plan.partitions if delivered(root, p) & names]
        assert len(holders) == 1, (count, holders)
        assert names <= delivered(root, plan.partitions[holders[0]])
    assert any(p.moved_in for p in plan_directory(str(root), 8).partitions)


def test_partitions_are_balanced_by_bytes_and_by_entries(tmp_path: Path) -> None:
    spec = {
        f"d{d:02d}": {f"f{i:03d}": bytes(1000 + (i * 37 + d) % 500) for i in range(50)}
        for d in range(40)
    }
    root = build_tree(tmp_path / "src", spec)
    for count in (2, 4, 7):
        plan = plan_directory(str(root), count)
        assert len(plan.partitions) == count
        for part in plan.partitions:
            assert 0.5 <= part.entries * count / plan.entries <= 1.5, (count, part)
            assert 0.5 <= part.data_bytes * count / plan.data_bytes <= 1.5, (count, part)


def test_directories_stay_whole_where_they_fit_and_a_big_one_is_cut_by_names(
    tmp_path: Path,
) -> None:
    spec = {f"d{d}": {f"f{i:02d}": bytes(100) for i in range(20)} for d in range(8)}
    spec["e-big"] = {f"g{i:04d}": bytes(100) for i in range(800)}
    root = build_tree(tmp_path / "src", spec)
    plan = plan_directory(str(root), 8)
    starts = [p.start for p in plan.partitions[1:]]
    assert starts[0] == (b"e-big", b"g0000") or starts[0][0].startswith(b"d")
    # The eight small directories (one partition's share together) are never split...
    assert all(s[0] == b"e-big" or len(s) == 1 for s in starts), starts
    # ...and the big one is split by name ranges.
    assert sum(1 for s in starts if s[0] == b"e-big" and len(s) == 2) >= 5, starts


def test_the_same_tree_gives_the_same_partitions(tmp_path: Path) -> None:
    one = spread_tree(tmp_path / "one")
    two = spread_tree(tmp_path / "two")  # other inode numbers, same names and sizes
    for count in (3, 8):
        a = plan_directory(str(one), count).partitions
        b = plan_directory(str(two), count).partitions
        assert [dataclasses.replace(p, moved_in=frozenset(), moved_out=frozenset()) for p in a] == [
            dataclasses.replace(p, moved_in=frozenset(), moved_out=frozenset()) for p in b
        ]
        assert [(p.moved_in, p.moved_out) for p in a] == [(p.moved_in, p.moved_out) for p in b]


def test_more_partitions_than_entries_gives_fewer_partitions(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "src", {"a": b"1", "b": b"2", "c": {}})
    plan = plan_directory(str(root), 50)
    assert 1 <= len(plan.partitions) <= 3
    empty = build_tree(tmp_path / "empty", {})
    assert len(plan_directory(str(empty), 4).partitions) == 1


def test_planning_honours_excludes_as_the_pack_does(tmp_path: Path) -> None:
    root = build_tree(
        tmp_path / "src", {"keep": b"k" * 100, "drop.tmp": b"d" * 10_000, "cache": {"x": b"x"}}
    )
    plan = plan_directory(str(root), 1, excludes=("*.tmp", "cache"))
    assert plan.entries == 1 and plan.data_bytes == 100


def test_archives_are_cut_into_runs_of_whole_shards_in_order(tmp_path: Path) -> None:
    paths = []
    for i, size in enumerate([100, 100, 100, 100, 400, 100, 100]):
        path = tmp_path / f"s{i}.tar"
        path.write_bytes(bytes(size))
        paths.append(str(path))
    plan = plan_archives(paths, 3)
    # Ideal cuts at 333 and 667 bytes: the shard boundaries nearest them are 300 and 800.
    assert [p.archives for p in plan.partitions] == [
        tuple(paths[:3]),
        tuple(paths[3:5]),
        tuple(paths[5:]),
    ]
    assert [p.archives for p in plan_archives(paths, 10).partitions] == [(p,) for p in paths]
    with pytest.raises(PackError, match="stdin"):
        plan_archives(["-"], 2)


def test_a_retried_task_removes_what_a_killed_attempt_left(tmp_path: Path) -> None:
    root = spread_tree(tmp_path / "src")
    area = tmp_path / "area"
    area.mkdir()
    (area / "TOKEN").write_text("t")
    # A killed attempt's partial: nobody holds its lock any more.
    dead = area / ".part-00000.partial-999999"
    (dead / "index").mkdir(parents=True)
    (dead / "shard-00000000").write_bytes(b"half a shard")
    part = plan_directory(str(root), 2).partitions[0]
    task = PartTask(part, str(root), str(area), "t")
    result = pack_partition(task, OPTIONS)
    assert sorted(os.listdir(area)) == ["TOKEN", "part-00000"]
    assert result.files > 50
    # An attempt killed after it published: the retry replaces its bundle.
    again = pack_partition(task, OPTIONS)
    assert again.files == result.files
    assert sorted(os.listdir(area)) == ["TOKEN", "part-00000"]
    with Bundle(area / "part-00000") as b:
        assert b.config.file_count == result.files


def test_a_task_refuses_a_staging_area_it_does_not_see(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "src", {"a": b"a"})
    part = plan_directory(str(root), 1).partitions[0]
    with pytest.raises(PackError, match="not visible on worker host .*--staging"):
        pack_partition(PartTask(part, str(root), str(tmp_path / "nowhere"), "t"), OPTIONS)
    area = tmp_path / "area"
    area.mkdir()
    (area / "TOKEN").write_text("t")
    (area / "ABORT").touch()
    with pytest.raises(PackCancelled):
        pack_partition(PartTask(part, str(root), str(area), "t"), OPTIONS)
    assert sorted(os.listdir(area)) == ["ABORT", "TOKEN"]


# -- packs on the cluster --------------------------------------------------------------------------


def test_a_dask_pack_equals_a_single_machine_pack(tmp_path: Path, client: Client) -> None:
    root = build_rich_tree(tmp_path / "src")
    spread_tree(root / "spread")
    # A file with a second name outside the tree: stored once, flagged as multiply linked.
    os.link(root / "hello.txt", tmp_path / "outside-name")
    os.mkfifo(root / "spread" / "fifo")  # special files (format version 4) in some partition
    if os.geteuid() == 0:
        os.mknod(root / "spread" / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    single = tmp_path / "single.bundle"
    pack(str(root), str(single), OPTIONS)
    for count in (1, 3, 8):
        dest = tmp_path / f"dask{count}.bundle"
        summary = pack_with_dask(str(root), str(dest), client, OPTIONS, partitions=count)
        assert summary.dest == str(dest)
        assert set(summary.phases) == {"listing", "packing", "merge", "publish"}
        assert_same_as_single_machine(single, dest)
    assert (
        leftovers(
            tmp_path,
            "src",
            "single.bundle",
            "outside-name",
            *(f"dask{c}.bundle" for c in (1, 3, 8)),
        )
        == []
    )


def test_dask_packs_of_one_tree_are_byte_identical(tmp_path: Path, client: Client) -> None:
    root = spread_tree(tmp_path / "src")
    one, two = tmp_path / "one.bundle", tmp_path / "two.bundle"
    pack_with_dask(str(root), str(one), client, OPTIONS, partitions=4)
    pack_with_dask(str(root), str(two), client, OPTIONS, partitions=4)
    assert bundle_file_bytes(one) == bundle_file_bytes(two)


def test_default_partitions_user_data_and_metadata(tmp_path: Path, client: Client) -> None:
    from bundlefs.packing.user_data import UserDataFile

    root = spread_tree(tmp_path / "src")
    jsonl = tmp_path / "meta.jsonl"
    jsonl.write_text(
        '{"file_name": "d03/f001.bin", "label": 3}\n{"file_name": "d09/f000.bin", "label": 9}\n'
        '{"file_name": "not/there", "label": 0}\n'
    )
    options = dataclasses.replace(
        OPTIONS, meta=(("source", "test"),), user_data=UserDataFile(str(jsonl))
    )
    single = tmp_path / "single.bundle"
    pack(str(root), str(single), dataclasses.replace(options, user_data=UserDataFile(str(jsonl))))
    dest = tmp_path / "dask.bundle"
    pack_with_dask(str(root), str(dest), client, options)  # 4 partitions per worker
    assert_same_as_single_machine(single, dest)
    with Bundle(dest) as b:
        assert b.info().meta == {"source": "test"}
        assert json.loads(b.stat("d09/f000.bin").user_data) == {"label": 9}
    assert options.user_data.unused() == ["not/there"]  # type: ignore[union-attr]


def test_tar_shards_pack_as_on_one_machine(tmp_path: Path, client: Client) -> None:
    shards = []
    for s in range(5):
        path = tmp_path / f"shard-{s}.tar"
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
            for i in range(20):
                data = pseudo_random_bytes(500 + 97 * i, seed=s * 100 + i)
                info = tarfile.TarInfo(f"train/{s:02d}{i:03d}.bin")
                info.size, info.mtime, info.uid = len(data), 1_600_000_000 + s * 1000 + i, s
                import io

                tar.addfile(info, io.BytesIO(data))
        shards.append(str(path))
    single = tmp_path / "single.bundle"
    pack(shards, str(single), OPTIONS)
    dest = tmp_path / "dask.bundle"
    pack_with_dask(shards, str(dest), client, OPTIONS, partitions=3)
    # The root and "train" are implicit: a single-machine pack gives them the first member's
    # owner and mtime, which the first partition's partial bundle has too.
    assert_same_as_single_machine(single, dest)


def test_a_member_in_shards_of_two_partitions_is_refused(tmp_path: Path, client: Client) -> None:
    import io

    shards = []
    for s in range(2):
        path = tmp_path / f"shard-{s}.tar"
        with tarfile.open(path, "w") as tar:
            data = b"shard %d" % s
            info = tarfile.TarInfo("same.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        shards.append(str(path))
    with pytest.raises(PackError, match="same.txt is in tar shards of different partitions"):
        pack_with_dask(shards, str(tmp_path / "dask.bundle"), client, OPTIONS, partitions=2)
    assert leftovers(tmp_path, "shard-0.tar", "shard-1.tar") == []
    # In one partition, the last member wins, as on one machine.
    pack_with_dask(shards, str(tmp_path / "one.bundle"), client, OPTIONS, partitions=1)
    with Bundle(tmp_path / "one.bundle") as b:
        assert b.read("same.txt") == b"shard 1"


def test_a_dask_pack_to_a_url(tmp_path: Path, client: Client, s3_server: S3Server) -> None:
    root = spread_tree(tmp_path / "src")
    single = tmp_path / "single.bundle"
    pack(str(root), str(single), OPTIONS)
    s3_server.create_bucket("dask")
    staging = tmp_path / "staging"
    staging.mkdir()
    options = dataclasses.replace(
        OPTIONS, storage_options=s3_server.storage_options, staging=str(staging)
    )
    url = "s3://dask/packed/x.bundle"
    summary = pack_with_dask(str(root), url, client, options, partitions=3)
    assert summary.dest == url
    remote = bundle_tree(
        url, storage_options=s3_server.storage_options, disk_cache=str(tmp_path / "cache")
    )
    assert remote == bundle_tree(single)
    assert os.listdir(staging) == []


class FailToOpen(WorkerPlugin):
    """Makes ``os.open`` of files named ``name`` fail with EACCES in the worker (what a user
    who may not read a file gets; the tests run as root, who may read anything)."""

    def __init__(self, name: str) -> None:
        self.name = os.fsencode(name)

    def setup(self, worker) -> None:
        import os as os_module

        real = os_module.open
        suffix = b"/" + self.name

        def failing(path, *args, **kwargs):
            if os_module.fsencode(path).endswith(suffix):
                raise PermissionError(errno.EACCES, "Permission denied", path)
            return real(path, *args, **kwargs)

        self._real = real
        os_module.open = failing

    def teardown(self, worker) -> None:
        os.open = self._real


def test_a_failing_task_fails_the_pack_and_leaves_nothing(tmp_path: Path, client: Client) -> None:
    root = spread_tree(tmp_path / "src")
    (root / "d05" / "unreadable").write_bytes(b"secret")
    client.register_plugin(FailToOpen("unreadable"), name="fail-to-open")
    try:
        with pytest.raises(PackError, match="cannot read d05/unreadable: Permission denied"):
            pack_with_dask(str(root), str(tmp_path / "b.bundle"), client, OPTIONS, partitions=6)
        assert leftovers(tmp_path, "src") == []
        # With skip_errors the file is left out and listed.
        options = dataclasses.replace(OPTIONS, skip_errors=True)
        summary = pack_with_dask(
            str(root), str(tmp_path / "b.bundle"), client, options, partitions=6
        )
        assert summary.skipped == ["d05/unreadable"]
        with Bundle(tmp_path / "b.bundle") as b:
            assert not b.exists("d05/unreadable") and b.exists("d05/f000.bin")
    finally:
        client.unregister_worker_plugin("fail-to-open")
    assert leftovers(tmp_path, "src", "b.bundle") == []


def test_a_dest_in_the_way_fails_before_any_task_runs(tmp_path: Path, client: Client) -> None:
    root = build_tree(tmp_path / "src", {"a": b"a"})
    (tmp_path / "taken").mkdir()
    with pytest.raises(PackError, match="already exists"):
        pack_with_dask(str(root), str(tmp_path / "taken"), client, OPTIONS)
    with pytest.raises(PackError, match="inside the tree"):
        pack_with_dask(str(root), str(root / "b.bundle"), client, OPTIONS)
    with pytest.raises(PackError, match="at least 1"):
        pack_with_dask(str(root), str(tmp_path / "b.bundle"), client, OPTIONS, partitions=0)
    assert leftovers(tmp_path, "src", "taken") == []


class KillOnce(WorkerPlugin):
    """SIGKILLs its own worker process once, when the partial bundle it is packing for
    partition ``index`` has ``min_bytes`` of shards on disk (a marker file makes it once)."""

    def __init__(self, directory: str, index: int, marker: str, min_bytes: int) -> None:
        self.directory = directory
        self.index = index
        self.marker = marker
        self.min_bytes = min_bytes

    def setup(self, worker) -> None:
        if not os.path.exists(self.marker):
            threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        pid = os.getpid()
        pattern = os.path.join(
            self.directory, ".*.dask.partial-*", f".part-{self.index:05d}.partial-{pid}", "shard-*"
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not os.path.exists(self.marker):
            written = 0
            for shard in glob.glob(pattern):
                with contextlib.suppress(OSError):  # a partial removed meanwhile
                    written += os.path.getsize(shard)
            if written >= self.min_bytes:
                try:
                    os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    return
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)


def test_a_worker_killed_mid_pack_is_retried_and_leaves_nothing(
    tmp_path: Path, client: Client
) -> None:
    spec = {
        f"d{d}": {
            f"f{i:03d}": pseudo_random_bytes(256 * 1024, seed=d * 1000 + i, compressible=False)
            for i in range(60)
        }
        for d in range(2)
    }
    root = build_tree(tmp_path / "src", spec, mtime_ns=FIXED_MTIME_NS)
    single = tmp_path / "single.bundle"
    pack(str(root), str(single), OPTIONS)
    marker = tmp_path / "killed"
    client.register_plugin(
        KillOnce(str(tmp_path), 1, str(marker), min_bytes=2 * 1024 * 1024), name="kill-once"
    )
    try:
        dest = tmp_path / "dask.bundle"
        pack_with_dask(str(root), str(dest), client, dataclasses.replace(OPTIONS, jobs=1), 2)
    finally:
        client.unregister_worker_plugin("kill-once")
    assert marker.exists(), "the worker packing partition 1 was never killed"
    assert_same_as_single_machine(single, dest)
    assert leftovers(tmp_path, "src", "single.bundle", "killed", "dask.bundle") == []


# -- packs on a base bundle -----------------------------------------------------------------------


def _versioned(root: Path) -> tuple[Path, Path]:
    """(SRC, OLD): a spread tree with old mtimes (outside the racy window), packed as OLD in
    several shards."""
    src = spread_tree(root / "src")
    for top, dirs, files in os.walk(src):
        for name in dirs + files:
            os.utime(os.path.join(top, name), ns=(MTIME_NS, MTIME_NS), follow_symlinks=False)
    old = root / "old.bundle"
    pack(str(src), str(old), dataclasses.replace(OPTIONS, shard_size=64 * 1024))
    return src, old


def _new_shards(bundle: Path, old: Path) -> list[int]:
    """The shards of ``bundle`` holding records that are not ``old``'s."""
    with Bundle(old) as b:
        old_id = b.info().bundle_id
    reader = IndexReader(str(bundle))
    try:
        return [
            s
            for s in range(reader.config.shard_count)
            if reader.shard_info(s).header_id != old_id and reader.shard_info(s).record_count
        ]
    finally:
        reader.close()


def _counts(summary: PackSummary) -> tuple[int, ...]:
    reuse = summary.reuse
    assert reuse is not None
    return (
        reuse.reused_files,
        reuse.same_files,
        reuse.stored_files,
        reuse.stored_bytes,
        reuse.shards_linked,
        reuse.shards_left,
    )


def test_a_dask_pack_on_an_unchanged_base_writes_no_data_bytes(
    tmp_path: Path, client: Client
) -> None:
    src, old = _versioned(tmp_path)
    new = tmp_path / "new.bundle"
    summary = pack_with_dask(str(src), str(new), client, OPTIONS, partitions=3, base=old)
    assert summary.stored_bytes == 0 and _new_shards(new, old) == []
    serial = pack(str(src), str(tmp_path / "serial.bundle"), OPTIONS, base=old)
    assert _counts(summary) == _counts(serial)
    assert summary.reuse is not None and summary.reuse.stored_files == 0
    old_inodes = {p.stat().st_ino for p in old.glob("shard-*")}
    assert {p.stat().st_ino for p in new.glob("shard-*")} == old_inodes
    assert_same_as_single_machine(old, new)


def test_a_dask_pack_on_a_base_stores_only_the_changed_file(tmp_path: Path, client: Client) -> None:
    src, old = _versioned(tmp_path)
    changed = src / "d05" / "f002.bin"
    changed.write_bytes(b"changed " * 1000)
    new = tmp_path / "new.bundle"
    summary = pack_with_dask(str(src), str(new), client, OPTIONS, partitions=3, base=old)
    assert summary.reuse is not None
    assert (summary.reuse.stored_files, summary.reuse.stored_bytes) == (1, 8000)
    reader = IndexReader(str(new))
    try:  # the one own shard holds that file's bytes and nothing else
        new_shards = _new_shards(new, old)
        assert sum(reader.shard_info(s).uncompressed_size for s in new_shards) == 8000
    finally:
        reader.close()
    with Bundle(new) as b:
        assert b.read("d05/f002.bin") == b"changed " * 1000


def test_a_touched_file_is_compared_with_the_base_on_its_worker_and_stores_nothing(
    tmp_path: Path, client: Client
) -> None:
    src, old = _versioned(tmp_path)
    os.utime(src / "d03" / "f001.bin", ns=(MTIME_NS + 1, MTIME_NS + 1))
    summary = pack_with_dask(
        str(src), str(tmp_path / "new.bundle"), client, OPTIONS, partitions=3, base=old
    )
    assert summary.reuse is not None
    assert (summary.reuse.same_files, summary.reuse.stored_files) == (1, 0)
    assert summary.stored_bytes == 0


def test_a_dask_pack_on_a_base_reads_as_a_plain_pack(tmp_path: Path, client: Client) -> None:
    src, old = _versioned(tmp_path)
    (src / "d01" / "f000.bin").write_bytes(b"rewritten")
    (src / "d07" / "f003.bin").unlink()
    os.rename(src / "d02" / "f001.bin", src / "d09" / "moved.bin")
    (src / "d11" / "added.txt").write_bytes(b"added\n")
    before = bundle_file_bytes(old)
    plain, serial = tmp_path / "plain.bundle", tmp_path / "serial.bundle"
    pack(str(src), str(plain), OPTIONS)
    pack(str(src), str(serial), OPTIONS, base=old)
    for count in (1, 4):
        new = tmp_path / f"dask{count}.bundle"
        pack_with_dask(str(src), str(new), client, OPTIONS, partitions=count, base=old)
        assert_same_as_single_machine(plain, new)
        assert index_entries(new) == index_entries(serial)
    assert bundle_file_bytes(old) == before  # the base is never modified
    assert (
        leftovers(
            tmp_path,
            "src",
            "old.bundle",
            "plain.bundle",
            "serial.bundle",
            "dask1.bundle",
            "dask4.bundle",
        )
        == []
    )


def test_a_chain_of_dask_packs_on_bases_reads_as_a_plain_pack(
    tmp_path: Path, client: Client
) -> None:
    src, base = _versioned(tmp_path)
    for generation in range(1, 4):
        for d in range(generation, 12, 3):
            (src / f"d{d:02d}" / "f000.bin").write_bytes(b"generation %d" % generation * 99)
        new = tmp_path / f"gen{generation}.bundle"
        pack_with_dask(str(src), str(new), client, OPTIONS, partitions=3, base=base)
        base = new
    plain = tmp_path / "plain.bundle"
    pack(str(src), str(plain), OPTIONS)
    assert_same_as_single_machine(plain, base)


def test_a_dask_pack_on_a_base_refuses_archives(tmp_path: Path, client: Client) -> None:
    _src, old = _versioned(tmp_path)
    shard = tmp_path / "a.tar"
    with tarfile.open(shard, "w") as tar:
        tar.add(__file__, arcname="x.py")
    with pytest.raises(PackError, match="packs one directory SRC"):
        pack_with_dask([str(shard)], str(tmp_path / "new.bundle"), client, OPTIONS, base=old)


# -- the command line ------------------------------------------------------------------------------


def test_cli_packs_on_a_local_cluster(tmp_path: Path) -> None:
    root = spread_tree(tmp_path / "src")
    single = tmp_path / "single.bundle"
    pack(str(root), str(single), PackOptions(created_ns=CREATED))
    dest = tmp_path / "dask.bundle"
    result = run_cli(
        "pack", root, dest, "--dask", "local:2", "--partitions", "5", "--created", "1700000000",
        "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    facts = json.loads(result.stdout)
    assert facts["files"] == bundle_tree_files(single)
    assert set(facts["phases"]) == {"listing", "packing", "merge", "publish"}
    assert_same_as_single_machine(single, dest)
    assert leftovers(tmp_path, "src", "single.bundle", "dask.bundle") == []


def test_cli_local_cluster_leaves_no_scratch_space_in_the_temporary_directory(
    tmp_path: Path,
) -> None:
    root = build_tree(tmp_path / "src", {"a": b"a", "d": {"b": b"b"}})
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "bundlefs", "pack", str(root), str(tmp_path / "b.bundle"),
         "--dask", "local:1", "-q"],
        capture_output=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    assert os.listdir(scratch) == []  # no dask-scratch-space, no bundlefs-dask-*


def test_a_signal_during_a_dask_pack_removes_its_staging_area_and_says_so(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "src", {"a": b"a", "d": {"b": b"b"}})
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # Paused as the merge of the partial bundles seals the result.
    status, err = interrupted(
        tmp_path, "bundlefs.storage.publish:seal", 1, signal.SIGTERM,
        "pack", root, tmp_path / "b.bundle", "--dask", "local:1", "-q",
        env={"TMPDIR": str(scratch)},
    )  # fmt: skip
    assert status == 143
    assert len(err) == 1, err
    assert err[0].startswith(
        f"bundlefs: error: interrupted by SIGTERM; removed the partial bundle "
        f"{tmp_path}/.b.bundle.dask.partial-"
    )
    assert sorted(os.listdir(tmp_path)) == ["src", "tmp"]
    assert os.listdir(scratch) == []


def bundle_tree_files(path: Path) -> int:
    with Bundle(path) as b:
        return b.config.file_count


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dask", "local:0"], "local:N takes a whole number of workers"),
        (["--dask", "local:two"], "local:N takes a whole number of workers"),
        (["--partitions", "3"], "--partitions splits a pack for --dask"),
        (["--dask", "local:1", "--partitions", "0"], "--partitions 0: at least 1"),
    ],
)
def test_cli_refuses_bad_dask_options_in_one_sentence(
    tmp_path: Path, args: list[str], message: str
) -> None:
    root = build_tree(tmp_path / "src", {"a": b"a"})
    # malformed values and a missing companion option: usage errors (docs/cli.md)
    line = assert_one_line_error(run_cli("pack", root, tmp_path / "b.bundle", *args), status=2)
    assert message in line
    assert leftovers(tmp_path, "src") == []


def test_cli_without_dask_installed_names_the_extra(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "src", {"a": b"a"})
    block = (
        "import sys\n"
        "class B:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('dask', 'distributed'):\n"
        "            raise ImportError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, B())\n"
        "from bundlefs.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", block, "pack", str(root), str(tmp_path / "b"), "--dask", "local:2"],
        capture_output=True,
        timeout=60,
    )
    line = assert_one_line_error(result)
    assert "pip install 'bundlefs[dask]'" in line


def test_an_unreachable_scheduler_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    monkeypatch.setattr(on_dask, "CONNECT_TIMEOUT", "1s")
    with (
        pytest.raises(
            PackError, match=f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}"
        ),
        on_dask.connect(f"tcp://127.0.0.1:{port}"),
    ):
        pass
