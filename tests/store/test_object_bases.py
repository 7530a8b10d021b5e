"""Object-store bases (issue 26, format version 6), on the local S3 server
(tests/support/s3server.py): ``pack SRC s3://…/new --base s3://…/old`` references OLD's shards
where they are (none uploaded or copied), NEW reads as its source tree through the API, verify
and a real mount, a chain stays flat, a base missing or replaced is one sentence at open,
``--materialize`` makes NEW stand alone, and deleting a bundle others use is refused.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

pytest.importorskip("s3fs")

from bundlefs import Bundle, PackOptions, pack  # noqa: E402
from bundlefs.core import format as fmt  # noqa: E402
from bundlefs.errors import BaseBundleError, PackError  # noqa: E402
from bundlefs.read.extract import extract  # noqa: E402
from bundlefs.read.verify import verify  # noqa: E402
from bundlefs.storage.bases import resolve_base  # noqa: E402
from bundlefs.storage.index import IndexReader  # noqa: E402
from bundlefs.storage.location import parse_location  # noqa: E402
from bundlefs.storage.objectstore.index_fetch import open_index  # noqa: E402
from bundlefs.storage.objectstore.references import SharedShards  # noqa: E402
from bundlefs.storage.objectstore.upload import RemotePublisher  # noqa: E402
from bundlefs.storage.remove import remove_bundle  # noqa: E402
from tests.support.s3server import S3Server, s3_server, split_url  # noqa: E402
from tests.support.trees import (  # noqa: E402
    MTIME_NS,
    assert_one_line_error,
    run_cli,
    set_mtimes,
    snapshot,
)

__all__ = ["s3_server"]  # the fixture, imported to be found


@pytest.fixture
def bucket(s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; the default disk cache (fetched indexes) in the test's directory."""
    monkeypatch.setenv("BUNDLEFS_CACHE_DIR", str(tmp_path / "cache"))
    name = f"b{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return f"s3://{name}"


def _tree(root: Path, files: int = 30, seed: int = 1) -> Path:
    """``files`` files of 1 byte to 60 KB in 3 directories, old mtimes (no racy window)."""
    rng = random.Random(seed)
    for i in range(files):
        path = root / f"d{i % 3}" / f"f{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(1, 60_000)))
    set_mtimes(root, MTIME_NS)
    return root


def _change(src: Path, name: str, data: bytes) -> None:
    (src / name).write_bytes(data)
    os.utime(src / name, ns=(MTIME_NS + 10**9, MTIME_NS + 10**9))


def _options(server: S3Server, **more) -> PackOptions:
    return PackOptions(storage_options=server.storage_options, shard_size=64 * 1024, **more)


def _objects(server: S3Server, url: str) -> dict[str, int]:
    bucket, prefix = split_url(url)
    listed = server.client().list_objects_v2(Bucket=bucket, Prefix=prefix.rstrip("/") + "/")
    return {o["Key"][len(prefix) + 1 :]: o["Size"] for o in listed.get("Contents", [])}


def _reads_as(url: str, src: Path, server: S3Server, scratch: Path) -> bool:
    """Whether the bundle at ``url`` extracts to exactly ``src``."""
    out = scratch / f"x-{uuid.uuid4().hex[:8]}"
    with Bundle(url, storage_options=server.storage_options) as b:
        extract(b, out)
    same = snapshot(out) == snapshot(src)
    shutil.rmtree(out)
    return same


def _index(url: str, server: S3Server) -> contextlib.closing[IndexReader]:
    """The index of the bundle at ``url``, fetched; closed at the end of a ``with``."""
    location = parse_location(url, server.storage_options)
    return contextlib.closing(open_index(location))  # a sparse copy: its pages fetched


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """The objects each publish uploads (a PUT each, or a multipart upload) and has the store
    copy, by name, as the publisher sends them."""
    sent: dict[str, list[str]] = {"uploaded": [], "copied": []}
    upload, copy = RemotePublisher._upload, SharedShards.copy

    def counted_upload(self, work, name, uploaded, *, small=False):
        sent["uploaded"].append(name)
        return upload(self, work, name, uploaded, small=small)

    def counted_copy(self, fs, root, name):
        sent["copied"].append(name)
        return copy(self, fs, root, name)

    monkeypatch.setattr(RemotePublisher, "_upload", counted_upload)
    monkeypatch.setattr(SharedShards, "copy", counted_copy)
    return sent


def _old_and_new(server: S3Server, bucket: str, tmp_path: Path) -> tuple[Path, str, str]:
    """OLD packed from a tree, one file changed, NEW packed on OLD by reference."""
    src = _tree(tmp_path / "src")
    pack(str(src), f"{bucket}/old", _options(server))
    _change(src, "d0/f000.bin", b"changed " * 1000)
    pack(str(src), f"{bucket}/new", _options(server), base=f"{bucket}/old")
    return src, f"{bucket}/old", f"{bucket}/new"


# -- by reference ----------------------------------------------------------------------------------


def test_a_pack_on_a_base_on_the_store_uploads_and_copies_none_of_its_shards(
    s3_server, bucket, tmp_path, requests
):
    src = _tree(tmp_path / "src")
    pack(str(src), f"{bucket}/old", _options(s3_server))
    old = _objects(s3_server, f"{bucket}/old")
    _change(src, "d0/f000.bin", b"changed " * 1000)
    requests["uploaded"].clear()
    summary = pack(str(src), f"{bucket}/new", _options(s3_server), base=f"{bucket}/old")
    assert summary.reuse is not None and summary.reuse.ways == {
        "reference": summary.reuse.shards_linked
    }
    new = _objects(s3_server, f"{bucket}/new")
    with _index(f"{bucket}/new", s3_server) as index:
        own = {
            fmt.shard_filename(s)
            for s in range(index.config.shard_count)
            if not index.shard_info(s).base
        }
        assert len(own) < index.config.shard_count
    # Only the index, the marker and NEW's own shards (its new file's, and one-block stand-ins
    # for OLD's shards no file uses) are under NEW: not one of OLD's shards.
    assert set(new) == {"COMPLETE", "index/data.mdb", "index/pages", *own}
    assert sorted(requests["uploaded"]) == sorted(new) and requests["copied"] == []
    assert summary.uploaded_bytes < sum(v for k, v in old.items() if k.startswith("shard-")) / 4
    # The marker that guards OLD's shards names NEW.
    markers = [k for k in _objects(s3_server, f"{bucket}/old") if k.startswith("referenced-by/")]
    assert len(markers) == 1
    assert s3_server.get(f"{bucket}/old/{markers[0]}").decode() == f"{bucket}/new"


def test_a_bundle_packed_on_a_base_reads_as_its_source_tree(s3_server, bucket, tmp_path):
    src, _old, new = _old_and_new(s3_server, bucket, tmp_path)
    assert _reads_as(new, src, s3_server, tmp_path)
    with Bundle(new, storage_options=s3_server.storage_options) as b:
        assert b.read("d0/f000.bin") == b"changed " * 1000


def test_a_base_is_named_relative_to_the_bundle(s3_server, bucket, tmp_path):
    _old_and_new(s3_server, bucket, tmp_path)
    with _index(f"{bucket}/new", s3_server) as index:
        assert [base.location for base in index.bases] == ["../old"]
        with _index(f"{bucket}/old", s3_server) as old:
            assert index.bases[0].bundle_id == old.marker.bundle_id
        assert index.marker.format_version == 6
    with Bundle(f"{bucket}/new", storage_options=s3_server.storage_options) as b:
        assert [base["location"] for base in b.info().to_dict()["bases"]] == ["../old"]


def test_verify_of_a_bundle_reads_the_shards_in_its_base(s3_server, bucket, tmp_path):
    _src, old, new = _old_and_new(s3_server, bucket, tmp_path)
    report = verify(new, storage_options=s3_server.storage_options)
    assert report.ok, report.problems
    with _index(old, s3_server) as index:
        stored = sum(index.shard_info(s).file_size for s in range(index.config.shard_count))
    assert report.bytes_checked >= stored // 2  # OLD's shards, read where they are


def test_damage_in_a_shared_shard_is_reported_by_verify_of_every_bundle_using_it(
    s3_server, bucket, tmp_path
):
    _src, old, new = _old_and_new(s3_server, bucket, tmp_path)
    shard = f"{old}/shard-00000001"
    data = bytearray(s3_server.get(shard))
    data[8192] ^= 0xFF  # a byte of the first record after the header block
    s3_server.put(shard, bytes(data))
    for url in (old, new):
        report = verify(url, storage_options=s3_server.storage_options)
        assert any(p.shard == 1 and p.kind == "record" for p in report.problems), url


def test_a_chain_of_three_generations_stays_flat(s3_server, bucket, tmp_path):
    src, _old, new = _old_and_new(s3_server, bucket, tmp_path)
    _change(src, "d1/f001.bin", b"third " * 2000)
    pack(str(src), f"{bucket}/third", _options(s3_server), base=new)
    third = f"{bucket}/third"
    assert _reads_as(third, src, s3_server, tmp_path)
    with _index(third, s3_server) as index:
        location = parse_location(third, s3_server.storage_options)
        places = [resolve_base(location, b.location).url for b in index.bases]
        assert sorted(places) == sorted([f"{bucket}/old", new])  # OLD named directly
        for shard in range(index.config.shard_count):
            info = index.shard_info(shard)
            if info.base:  # one hop: the base holds that file itself
                with _index(places[info.base - 1], s3_server) as holder:
                    assert holder.shard_info(info.base_shard).base == 0
    assert verify(third, storage_options=s3_server.storage_options).ok


# -- a base that is gone or another bundle ---------------------------------------------------------


def test_a_missing_base_is_one_sentence_at_open(s3_server, bucket, tmp_path):
    _src, old, new = _old_and_new(s3_server, bucket, tmp_path)
    s3_server.delete(f"{old}/COMPLETE")
    with pytest.raises(BaseBundleError, match="keeps shards in its base .*old, which is missing"):
        Bundle(new, storage_options=s3_server.storage_options)


def test_a_replaced_base_is_one_sentence_at_open(s3_server, bucket, tmp_path):
    _src, old, new = _old_and_new(s3_server, bucket, tmp_path)
    other = _tree(tmp_path / "other", seed=9)
    pack(str(other), f"{bucket}/other", _options(s3_server))
    s3_server.put(f"{old}/COMPLETE", s3_server.get(f"{bucket}/other/COMPLETE"))
    with pytest.raises(BaseBundleError, match="has been replaced by another bundle"):
        Bundle(new, storage_options=s3_server.storage_options)


def test_the_cli_says_a_missing_base_in_one_line(s3_server, bucket, tmp_path, monkeypatch):
    _src, old, new = _old_and_new(s3_server, bucket, tmp_path)
    s3_server.delete(f"{old}/COMPLETE")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    result = run_cli("ls", new, "--storage-option", f"endpoint_url={s3_server.endpoint}")
    assert "which is missing" in assert_one_line_error(result)


# -- materialized ----------------------------------------------------------------------------------


def test_materialize_copies_the_base_shards_and_makes_the_bundle_stand_alone(
    s3_server, bucket, tmp_path, requests
):
    src = _tree(tmp_path / "src")
    pack(str(src), f"{bucket}/old", _options(s3_server))
    _change(src, "d0/f000.bin", b"changed " * 1000)
    requests["uploaded"].clear()
    summary = pack(
        str(src), f"{bucket}/new", _options(s3_server, materialize=True), base=f"{bucket}/old"
    )
    assert summary.reuse is not None and set(summary.reuse.ways) == {"server-side copy"}
    assert len(requests["copied"]) == summary.reuse.shards_linked > 0
    assert not set(requests["copied"]) & set(requests["uploaded"])
    old_shards = {k: v for k, v in _objects(s3_server, f"{bucket}/old").items() if "shard" in k}
    assert summary.uploaded_bytes < sum(old_shards.values()) / 4  # copied on the store, not sent
    with _index(f"{bucket}/new", s3_server) as index:
        assert index.bases == []
    remove_bundle(parse_location(f"{bucket}/old", s3_server.storage_options))  # not refused
    assert _objects(s3_server, f"{bucket}/old") == {}
    assert _reads_as(f"{bucket}/new", src, s3_server, tmp_path)
    assert verify(f"{bucket}/new", storage_options=s3_server.storage_options).ok


# -- deletion --------------------------------------------------------------------------------------


def test_removing_a_base_is_refused_while_a_bundle_uses_its_shards(s3_server, bucket, tmp_path):
    _src, old, new = _old_and_new(s3_server, bucket, tmp_path)
    with pytest.raises(PackError, match=f"holds shards that {new} use, so it is not removed"):
        remove_bundle(parse_location(old, s3_server.storage_options))
    assert "COMPLETE" in _objects(s3_server, old)


def test_removing_the_bundle_that_used_a_base_frees_the_base(s3_server, bucket, tmp_path):
    _src, old, new = _old_and_new(s3_server, bucket, tmp_path)
    remove_bundle(parse_location(new, s3_server.storage_options))
    assert _objects(s3_server, new) == {}
    assert not any(k.startswith("referenced-by/") for k in _objects(s3_server, old))
    remove_bundle(parse_location(old, s3_server.storage_options))
    assert _objects(s3_server, old) == {}


def test_a_stale_marker_does_not_keep_a_base(s3_server, bucket, tmp_path):
    _src, old, new = _old_and_new(s3_server, bucket, tmp_path)
    s3_server.delete(f"{new}/COMPLETE")  # NEW gone, its marker in OLD left behind
    remove_bundle(parse_location(old, s3_server.storage_options))
    assert _objects(s3_server, old) == {}


def test_rm_force_removes_a_base_in_use(s3_server, bucket, tmp_path):
    _src, old, new = _old_and_new(s3_server, bucket, tmp_path)
    remove_bundle(parse_location(old, s3_server.storage_options), force=True)
    with pytest.raises(BaseBundleError, match="missing"):
        Bundle(new, storage_options=s3_server.storage_options)


def test_pack_force_over_a_base_in_use_is_refused(s3_server, bucket, tmp_path):
    src, old, _new = _old_and_new(s3_server, bucket, tmp_path)
    with pytest.raises(PackError, match="so it is not replaced"):
        pack(str(src), old, _options(s3_server, force=True))


def test_the_rm_command_refuses_a_base_in_use_in_one_line(s3_server, bucket, tmp_path, monkeypatch):
    _src, old, new = _old_and_new(s3_server, bucket, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    endpoint = ("--storage-option", f"endpoint_url={s3_server.endpoint}")
    refused = run_cli("rm", old, *endpoint)
    assert new in assert_one_line_error(refused)
    assert run_cli("rm", new, *endpoint).returncode == 0
    assert run_cli("rm", old, *endpoint).returncode == 0


# -- mixed places ----------------------------------------------------------------------------------


def test_a_local_bundle_on_a_base_on_the_store_is_refused_in_one_sentence(
    s3_server, bucket, tmp_path
):
    src = _tree(tmp_path / "src")
    pack(str(src), f"{bucket}/old", _options(s3_server))
    with pytest.raises(PackError, match="a local bundle cannot be packed on .*pack to the store"):
        pack(str(src), str(tmp_path / "new"), _options(s3_server), base=f"{bucket}/old")
    assert not (tmp_path / "new").exists()


def test_a_bundle_on_the_store_on_a_local_base_uploads_the_shards_it_needs(
    s3_server, bucket, tmp_path
):
    src = _tree(tmp_path / "src")
    pack(str(src), str(tmp_path / "old"), PackOptions(shard_size=64 * 1024))
    _change(src, "d0/f000.bin", b"changed " * 1000)
    summary = pack(str(src), f"{bucket}/new", _options(s3_server), base=str(tmp_path / "old"))
    assert summary.reuse is not None and summary.reuse.shards_linked > 0
    with _index(f"{bucket}/new", s3_server) as index:
        assert index.bases == []  # a stand-alone bundle: the shards were uploaded
    shutil.rmtree(tmp_path / "old")
    assert _reads_as(f"{bucket}/new", src, s3_server, tmp_path)


# -- a real mount ----------------------------------------------------------------------------------


def test_a_mount_of_a_bundle_on_a_base_matches_its_source_tree(
    s3_server, bucket, tmp_path, mount_bundle
):
    pytest.importorskip("pyfuse3")
    src, _old, new = _old_and_new(s3_server, bucket, tmp_path)
    m = mount_bundle(
        new,
        "--storage-option=key=test",
        "--storage-option=secret=test",
        f"--storage-option=client_kwargs.endpoint_url={s3_server.endpoint}",
        "--storage-option=client_kwargs.region_name=us-east-1",
        "--disk-cache",
        str(tmp_path / "mount-cache"),
    )
    diff = subprocess.run(
        ["diff", "-r", "--no-dereference", str(src), str(m.mountpoint)],
        capture_output=True,
        timeout=120,
    )
    assert diff.returncode == 0, diff.stdout.decode()[-2000:]
