"""``pack("s3://bucket/prefix/", NEW, base=OLD)``: an object-store prefix packed on a local base,
against the moto S3 server on the loopback.

An object is unchanged when its size and LastModified match OLD's entry, trusted to the second
(LastModified's precision) and outside OLD's racy window; it is then not fetched at all. The
others are fetched and compared with OLD's digest: the same bytes store nothing. NEW reads as a
plain pack of the same prefix made at the same time.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from bundlefs import Bundle, PackOptions, pack  # noqa: E402
from bundlefs.packing.options import PackSummary  # noqa: E402
from bundlefs.packing.sources.objects import ObjectSource  # noqa: E402
from bundlefs.read.verify import verify  # noqa: E402
from tests.conftest import bundle_entries, pseudo_random_bytes  # noqa: E402
from tests.support.s3server import S3Server, s3_server  # noqa: E402

__all__ = ["s3_server"]  # a fixture, imported to be found

BUCKET = "deltas"
OBJECTS = {
    **{f"train/{i:02d}.bin": pseudo_random_bytes(5_000 + i, seed=i) for i in range(12)},
    "labels/all.json": b'{"cat": 1}',
    "empty": b"",
    "large.bin": pseudo_random_bytes(3 * 2**20, seed=99),  # fetched in ranges, not ahead
}


@pytest.fixture
def prefix(s3_server: S3Server) -> str:
    """A fresh prefix holding OBJECTS."""
    s3_server.create_bucket(BUCKET)
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
    for key, data in OBJECTS.items():
        s3_server.put(f"{url}/{key}", data)
    return url


def _options(server: S3Server, created_ns: int) -> PackOptions:
    return PackOptions(created_ns=created_ns, storage_options=server.storage_options)


# OLD made "later" than now: the objects just put lie outside its racy window (2 s, and the tick).
SETTLED = 10 * 10**9


def _new(tmp_path: Path, server: S3Server, url: str, fetched: list[str]) -> PackSummary:
    """NEW packed from ``url`` on ``tmp_path/old``, counting the objects it reads into
    ``fetched``; a plain pack made at the same time must read the same."""
    created = time.time_ns()
    fetch, open_ = ObjectSource._fetch, ObjectSource.open

    def counted_fetch(self, item):
        fetched.append(item.rel.decode())
        return fetch(self, item)

    def counted_open(self, item):
        fetched.append(item.rel.decode())
        return open_(self, item)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ObjectSource, "_fetch", counted_fetch)
        patch.setattr(ObjectSource, "open", counted_open)
        summary = pack(
            url + "/", str(tmp_path / "new"), _options(server, created), base=tmp_path / "old"
        )
    pack(url + "/", str(tmp_path / "plain"), _options(server, created))
    assert bundle_entries(tmp_path / "new") == bundle_entries(tmp_path / "plain")
    assert verify(tmp_path / "new").ok
    return summary


def _old(tmp_path: Path, server: S3Server, url: str, later: int = SETTLED) -> None:
    pack(url + "/", str(tmp_path / "old"), _options(server, time.time_ns() + later))


def test_nothing_changed_fetches_no_object_and_writes_no_data_byte(
    tmp_path: Path, s3_server: S3Server, prefix: str
) -> None:
    _old(tmp_path, s3_server, prefix)
    fetched: list[str] = []
    summary = _new(tmp_path, s3_server, prefix, fetched)
    assert summary.reuse is not None
    assert summary.stored_bytes == 0
    assert summary.reuse.reused_files == len(OBJECTS) - 1  # the empty one needs no bytes
    assert fetched == []


def test_a_changed_a_deleted_and_an_added_object_store_only_the_new_bytes(
    tmp_path: Path, s3_server: S3Server, prefix: str
) -> None:
    _old(tmp_path, s3_server, prefix)
    s3_server.put(f"{prefix}/labels/all.json", b'{"cat": 1, "dog": 2}')
    s3_server.delete(f"{prefix}/train/03.bin")
    s3_server.put(f"{prefix}/train/new.bin", b"added")
    fetched: list[str] = []
    summary = _new(tmp_path, s3_server, prefix, fetched)
    assert summary.reuse is not None
    assert (summary.reuse.stored_files, summary.reuse.reused_files) == (2, len(OBJECTS) - 3)
    assert sorted(fetched) == ["labels/all.json", "train/new.bin"]
    with Bundle(tmp_path / "new") as b:
        assert b.read("labels/all.json") == b'{"cat": 1, "dog": 2}'
        assert not b.exists("train/03.bin")


def test_objects_in_the_racy_window_are_compared_and_a_same_size_rewrite_is_found(
    tmp_path: Path, s3_server: S3Server, prefix: str
) -> None:
    _old(tmp_path, s3_server, prefix, later=0)  # just put: every object is racy
    rewritten = bytes(reversed(OBJECTS["train/05.bin"]))
    s3_server.put(f"{prefix}/train/05.bin", rewritten)  # the same size, maybe the same second
    fetched: list[str] = []
    summary = _new(tmp_path, s3_server, prefix, fetched)
    assert summary.reuse is not None
    assert summary.reuse.reused_files == 0
    assert (summary.reuse.same_files, summary.reuse.stored_files) == (len(OBJECTS) - 2, 1)
    assert summary.reuse.digest_compared == len(OBJECTS) - 2  # the rewrite's CRC differs already
    with Bundle(tmp_path / "new") as b:
        assert b.read("train/05.bin") == rewritten
