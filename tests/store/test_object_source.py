"""An object-store prefix as SRC (issue 13): ``pack("s3://bucket/prefix/", DEST)``, on one machine,
from the command line, and in partitions on Dask, against a real moto S3 server on the loopback.

What the objects become: every object below the prefix a regular file at its key relative to the
prefix (mode 0644, the packing process's owner, mtime = LastModified, size = the listing's);
directories implied by the keys, or by zero-byte "directory markers" (keys ending in "/"), mode
0755 and mtime = the pack's creation time. A key that cannot be a path is refused in one sentence
or skipped with ``skip_errors``. A Dask pack of a prefix equals the single-machine pack.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from bundlefs import Bundle, PackError  # noqa: E402
from bundlefs.packing.packer import PackOptions, pack  # noqa: E402
from bundlefs.packing.sources.base import SourceErrors  # noqa: E402
from bundlefs.packing.sources.objects import ObjectSource  # noqa: E402
from bundlefs.storage.location import parse_location  # noqa: E402
from bundlefs.storage.objects import WINDOW, ObjectInfo  # noqa: E402
from tests.conftest import pseudo_random_bytes  # noqa: E402
from tests.support.s3server import REGION, S3Server, free_port, s3_server, split_url  # noqa: E402
from tests.support.trees import assert_one_line_error, run_cli  # noqa: E402

__all__ = ["s3_server"]  # a fixture, imported to be found

BUCKET = "objects"
CREATED = 1_700_000_000 * 10**9
FILE = stat.S_IFREG | 0o644
DIR = stat.S_IFDIR | 0o755


@pytest.fixture
def prefix(s3_server: S3Server) -> str:
    """A fresh prefix of the test's own in the shared bucket: ``s3://objects/<random>``."""
    s3_server.create_bucket(BUCKET)
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"


def put(server: S3Server, base: str, objects: dict[str, bytes]) -> None:
    for key, data in objects.items():
        server.put(f"{base}/{key}", data)


def last_modified(server: S3Server, base: str) -> dict[str, int]:
    """LastModified in ns of every object below ``base``, by key relative to it."""
    bucket, key_prefix = split_url(base)
    pages = server.client().get_paginator("list_objects_v2")
    out = {}
    for page in pages.paginate(Bucket=bucket, Prefix=key_prefix + "/"):
        for item in page.get("Contents", ()):
            moment = item["LastModified"]
            out[item["Key"][len(key_prefix) + 1 :]] = round(moment.timestamp() * 10**6) * 1000
    return out


def options(server: S3Server, **changes: Any) -> PackOptions:
    return PackOptions(created_ns=CREATED, storage_options=server.storage_options, **changes)


def entries(path: str | os.PathLike) -> dict[str, tuple]:
    """path -> (mode, mtime_ns, uid, gid, size, content) of every entry, the root included."""
    out: dict[str, tuple] = {}
    with Bundle(path) as b:
        pending = [""]
        while pending:
            top = pending.pop()
            st = b.lstat(top)
            data = b.read(top) if stat.S_ISREG(st.st_mode) else None
            if stat.S_ISDIR(st.st_mode):
                pending += [f"{top}/{n}" if top else n for n in b.listdir(top)]
            size = st.st_size if stat.S_ISREG(st.st_mode) else 0
            out[top] = (st.st_mode, st.st_mtime_ns, st.st_uid, st.st_gid, size, data)
    return out


def as_file(data: bytes, mtime_ns: int) -> tuple:
    return (FILE, mtime_ns, os.getuid(), os.getgid(), len(data), data)


AS_DIR = (DIR, CREATED, os.getuid(), os.getgid(), 0, None)


# -- one machine -----------------------------------------------------------------------------------


def test_every_object_is_a_file_at_its_key_and_directories_are_implied(
    tmp_path: Path, s3_server: S3Server, prefix: str
) -> None:
    objects = {
        "a.txt": b"hello",
        "images/cat.jpg": pseudo_random_bytes(3000, seed=1),
        "images/deep/er/dog.jpg": pseudo_random_bytes(70_000, seed=2),
        # Larger than one ranged GET: streamed in windows, never whole in memory.
        "big/blob.bin": pseudo_random_bytes(WINDOW + 12_345, seed=3),
        "empty-file": b"",
        "ünïcode name.txt": "ü".encode(),
    }
    put(s3_server, prefix, objects)
    # Beside the prefix, not below it: never packed.
    s3_server.put(prefix + "-old/stale.txt", b"stale")
    s3_server.put(prefix + "x", b"a sibling key")
    dest = tmp_path / "objects.bundle"
    summary = pack(prefix + "/", str(dest), options(s3_server))
    mtimes = last_modified(s3_server, prefix)
    expected = {key: as_file(data, mtimes[key]) for key, data in objects.items()}
    for directory in ("", "images", "images/deep", "images/deep/er", "big"):
        expected[directory] = AS_DIR
    assert entries(dest) == expected
    assert summary.config.file_count == len(objects)
    assert summary.skipped == [] and summary.changed == []


def test_the_prefix_may_be_given_with_or_without_its_slash_and_nested_prefixes_are_subtrees(
    tmp_path: Path, s3_server: S3Server, prefix: str
) -> None:
    put(
        s3_server,
        prefix,
        {"top.txt": b"top", "train/0/a.bin": b"a", "train/1/b.bin": b"b", "test/c.bin": b"c"},
    )
    pack(prefix, str(tmp_path / "all.bundle"), options(s3_server))
    pack(prefix + "/", str(tmp_path / "all-slash.bundle"), options(s3_server))
    assert entries(tmp_path / "all.bundle") == entries(tmp_path / "all-slash.bundle")
    pack(prefix + "/train/", str(tmp_path / "train.bundle"), options(s3_server))
    with Bundle(tmp_path / "train.bundle") as b:
        assert b.listdir("") == ["0", "1"]
        assert b.read("1/b.bin") == b"b"
    whole = entries(tmp_path / "all.bundle")
    assert {k[len("train/") :]: v for k, v in whole.items() if k.startswith("train/")} == {
        k: v for k, v in entries(tmp_path / "train.bundle").items() if k
    }


def test_directory_markers_are_directories_not_files(
    tmp_path: Path, s3_server: S3Server, prefix: str
) -> None:
    # What the S3 console's "Create folder" makes: a zero-byte object whose key ends in "/".
    put(
        s3_server,
        prefix,
        {"empty/": b"", "full/": b"", "full/f.txt": b"f", "a/b/": b"", "": b""},
    )
    dest = tmp_path / "markers.bundle"
    pack(prefix + "/", str(dest), options(s3_server))
    tree = entries(dest)
    assert set(tree) == {"", "empty", "full", "full/f.txt", "a", "a/b"}
    for directory in ("", "empty", "full", "a", "a/b"):
        assert tree[directory] == AS_DIR
    with Bundle(dest) as b:
        assert b.listdir("empty") == []


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("x/../y.txt", "'..' component"),
        ("x//y.txt", "empty component"),
        ("x/./y.txt", "'.' component"),
        ("n" * 256 + ".txt", "longer than 255 bytes"),
    ],
)
def test_a_key_that_cannot_be_a_path_is_refused_in_one_sentence_or_skipped(
    tmp_path: Path, s3_server: S3Server, prefix: str, key: str, why: str
) -> None:
    put(s3_server, prefix, {"good.txt": b"good", key: b"bad"})
    dest = tmp_path / "refused.bundle"
    with pytest.raises(PackError, match=f"refusing the object '{key[:40]}") as raised:
        pack(prefix + "/", str(dest), options(s3_server))
    assert why in str(raised.value) and "\n" not in str(raised.value)
    assert os.listdir(tmp_path) == []  # nothing at DEST, no partial
    summary = pack(prefix + "/", str(dest), options(s3_server, skip_errors=True))
    assert summary.skipped == [key]
    with Bundle(dest) as b:
        assert b.listdir("") == ["good.txt"]


def test_a_file_and_a_directory_of_one_name_keep_the_directory(
    tmp_path: Path, s3_server: S3Server, prefix: str
) -> None:
    put(s3_server, prefix, {"a": b"a file", "a/b.txt": b"below"})
    with pytest.raises(PackError, match="refusing the object 'a' .*a directory of that name"):
        pack(prefix + "/", str(tmp_path / "x.bundle"), options(s3_server))
    summary = pack(prefix + "/", str(tmp_path / "x.bundle"), options(s3_server, skip_errors=True))
    assert summary.skipped == ["a"]
    with Bundle(tmp_path / "x.bundle") as b:
        assert b.read("a/b.txt") == b"below"


def test_excludes_match_keys_as_they_match_paths(
    tmp_path: Path, s3_server: S3Server, prefix: str
) -> None:
    put(s3_server, prefix, {"keep.txt": b"k", "tmp/x.txt": b"x", "d/skip.log": b"s"})
    dest = tmp_path / "x.bundle"
    pack(prefix, str(dest), options(s3_server, excludes=("tmp", "*.log")))
    # "d" was implied only by an excluded key: it implies nothing.
    assert set(entries(dest)) == {"", "keep.txt"}


def test_an_object_that_changed_since_it_was_listed_is_stored_as_read_and_reported(
    tmp_path: Path, s3_server: S3Server, prefix: str
) -> None:
    put(s3_server, prefix, {"grew.bin": b"x" * 100, "big.bin": b"y" * (2 * 1024 * 1024)})
    # The listing said otherwise (the objects were rewritten after it): small objects fetched
    # whole and large ones streamed both see it.
    listed = [ObjectInfo("big.bin", 1024 * 1024 + 1, 5), ObjectInfo("grew.bin", 10, 5)]
    for jobs in (1, 4):
        source = ObjectSource(
            parse_location(prefix, s3_server.storage_options),
            SourceErrors(False),
            created_ns=CREATED,
            objects=listed,
        )
        dest = tmp_path / f"changed-{jobs}.bundle"
        summary = pack(source, str(dest), PackOptions(created_ns=CREATED, jobs=jobs))
        assert sorted(summary.changed) == ["big.bin", "grew.bin"]
        with Bundle(dest) as b:
            assert b.read("grew.bin") == b"x" * 100


def test_an_empty_prefix_is_refused(tmp_path: Path, s3_server: S3Server, prefix: str) -> None:
    with pytest.raises(PackError, match="nothing to pack: there are no objects under"):
        pack(prefix + "/", str(tmp_path / "x.bundle"), options(s3_server))
    assert os.listdir(tmp_path) == []


def test_a_missing_bucket_and_an_unreachable_store_are_one_sentence_leaving_nothing(
    tmp_path: Path, s3_server: S3Server
) -> None:
    dest = tmp_path / "x.bundle"
    with pytest.raises(PackError, match="the bucket no-such-bucket does not exist"):
        pack("s3://no-such-bucket/p/", str(dest), options(s3_server))
    nowhere = {
        "key": "test",
        "secret": "test",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}", "region_name": REGION},
    }
    started = time.monotonic()
    with pytest.raises(PackError, match=r"cannot list s3://objects/p/ after 4 attempts") as e:
        pack("s3://objects/p/", str(dest), PackOptions(storage_options=nowhere))
    assert "\n" not in str(e.value)
    assert time.monotonic() - started < 20
    assert os.listdir(tmp_path) == []


def test_a_url_dest_inside_the_prefix_is_refused(s3_server: S3Server, prefix: str) -> None:
    put(s3_server, prefix, {"a.txt": b"a"})
    with pytest.raises(PackError, match="inside the prefix being packed"):
        pack(prefix + "/", prefix + "/out.bundle", options(s3_server))


def test_the_cli_packs_a_prefix_with_storage_options(
    tmp_path: Path, s3_server: S3Server, prefix: str
) -> None:
    objects = {f"shard-{i:02d}/{j}.txt": b"%d-%d" % (i, j) for i in range(3) for j in range(4)}
    put(s3_server, prefix, objects)
    single = tmp_path / "library.bundle"
    pack(prefix + "/", str(single), options(s3_server))
    dest = tmp_path / "cli.bundle"
    storage = [
        "--storage-option", f"endpoint_url={s3_server.endpoint}",
        "--storage-option", "key=test", "--storage-option", "secret=test",
        "--storage-option", f"client_kwargs.region_name={REGION}",
    ]  # fmt: skip
    result = run_cli("pack", prefix + "/", dest, *storage, "--created", "1700000000", "--json")
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout)["files"] == len(objects)
    assert entries(dest) == entries(single)
    # A bad key: one sentence, exit status 1, nothing at DEST.
    s3_server.put(f"{prefix}/bad//key", b"")
    again = tmp_path / "again.bundle"
    line = assert_one_line_error(run_cli("pack", prefix + "/", again, *storage))
    assert "refusing the object 'bad//key'" in line
    assert not again.exists()


# -- Dask ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two single-threaded worker processes for the module's Dask tests, closed at its end."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.CRITICAL,
    )
    client = distributed.Client(cluster, set_as_default=False)
    try:
        client.wait_for_workers(2, timeout=60)
        yield client
    finally:
        client.close()
        cluster.close()


def spread_objects() -> dict[str, bytes]:
    """Prefixes of uneven sizes, nested ones, markers, a large object."""
    objects: dict[str, bytes] = {}
    for d in range(8):
        for i in range(3 + (d * 5) % 11):
            objects[f"d{d}/f{i:02d}.bin"] = pseudo_random_bytes(100 + (i * 997 + d) % 5000, seed=d)
        objects[f"d{d}/nested/x.txt"] = b"x" * d
    objects["d3/empty/"] = b""
    objects["top.txt"] = b"top"
    objects["zz/big.bin"] = pseudo_random_bytes(300_000, seed=9)
    return objects


def test_plans_cover_every_object_once_in_key_ranges(s3_server: S3Server, prefix: str) -> None:
    from bundlefs.packing.distributed.plan import plan_objects

    objects = spread_objects()
    put(s3_server, prefix, objects)
    location = parse_location(prefix, s3_server.storage_options)
    for count in (1, 3, 40):
        plan = plan_objects(location, count, created_ns=CREATED)
        keys = [o.key for p in plan.partitions for o in p.objects]
        assert sorted(keys) == sorted(objects)  # every object (and marker) exactly once
        assert len(plan.partitions) <= count
        assert plan.data_bytes == sum(map(len, objects.values()))
        for p in plan.partitions:  # each holds the keys of its range of the tree, in order
            for o in p.objects:
                path = tuple(o.key.rstrip("/").encode().split(b"/"))
                assert (p.start is None or p.start <= path) and (p.end is None or path < p.end)
    again = plan_objects(location, 3, created_ns=CREATED)
    assert again.partitions == plan_objects(location, 3, created_ns=CREATED).partitions


def test_a_dask_pack_of_a_prefix_equals_a_single_machine_pack(
    tmp_path: Path, s3_server: S3Server, prefix: str, cluster: Any
) -> None:
    from bundlefs.integrations.dask import pack_with_dask
    from tests.library.test_dask import assert_same_as_single_machine

    put(s3_server, prefix, spread_objects())
    single = tmp_path / "single.bundle"
    pack(prefix + "/", str(single), options(s3_server))
    for count in (1, 4):
        dest = tmp_path / f"dask{count}.bundle"
        summary = pack_with_dask(prefix + "/", str(dest), cluster, options(s3_server), count)
        assert set(summary.phases) == {"listing", "packing", "merge", "publish"}
        assert_same_as_single_machine(single, dest)
    assert sorted(os.listdir(tmp_path)) == ["dask1.bundle", "dask4.bundle", "single.bundle"]


def test_a_dask_pack_refuses_a_bad_key_before_any_task_runs_or_skips_it(
    tmp_path: Path, s3_server: S3Server, prefix: str, cluster: Any
) -> None:
    from bundlefs.integrations.dask import pack_with_dask

    put(s3_server, prefix, {"ok/a.txt": b"a", "ok/b.txt": b"b", "x/../y": b"bad"})
    dest = tmp_path / "dask.bundle"
    with pytest.raises(PackError, match="refusing the object 'x/../y'"):
        pack_with_dask(prefix, str(dest), cluster, options(s3_server), 2)
    assert os.listdir(tmp_path) == []
    summary = pack_with_dask(prefix, str(dest), cluster, options(s3_server, skip_errors=True), 2)
    assert summary.skipped == ["x/../y"]
    single = tmp_path / "single.bundle"
    pack(prefix, str(single), options(s3_server, skip_errors=True))
    assert entries(dest) == entries(single)


def test_a_partitions_repr_leaves_out_its_share_of_the_listing(
    s3_server: S3Server, prefix: str
) -> None:
    from bundlefs.packing.distributed.plan import plan_objects

    put(s3_server, prefix, {"secret-looking-key.txt": b"s"})
    plan = plan_objects(parse_location(prefix, s3_server.storage_options), 1, created_ns=CREATED)
    assert "secret-looking-key" not in repr(plan.partitions[0])  # a task's repr stays short
