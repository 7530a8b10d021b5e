"""``bundlefs.Writer`` to an ``s3://`` DEST (issue 25): built in a local staging directory and
uploaded as ``pack`` uploads (its marker last) when the block ends; nothing uploaded after an
exception. Against a real moto S3 server on the loopback."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from bundlefs import Bundle, Writer  # noqa: E402
from tests.conftest import pseudo_random_bytes  # noqa: E402
from tests.support.s3server import S3Server, s3_server  # noqa: E402

__all__ = ["s3_server"]  # a fixture, imported to be found

BUCKET = "written"


@pytest.fixture
def url(s3_server: S3Server) -> str:
    s3_server.create_bucket(BUCKET)
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}.bundle"


def test_a_writer_uploads_a_bundle_that_opens_at_the_url(
    s3_server: S3Server, url: str, tmp_path: Path
) -> None:
    data = pseudo_random_bytes(300_000, seed=7)
    with Writer(url, storage_options=s3_server.storage_options, staging=str(tmp_path)) as w:
        w.add("train/a.bin", data)
        w.add_symlink("latest", "train")
    assert w.summary is not None and w.summary.dest == url
    assert list(tmp_path.iterdir()) == []  # the staging directory is gone
    with Bundle(url, storage_options=s3_server.storage_options) as b:
        assert b["train/a.bin"] == data
        assert b.readlink("latest") == "train"


def test_an_exception_uploads_nothing(s3_server: S3Server, url: str, tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError),
        Writer(url, storage_options=s3_server.storage_options, staging=str(tmp_path)) as w,
    ):
        w.add("a", b"a")
        raise RuntimeError("the caller's own failure")
    listed = s3_server.client().list_objects_v2(Bucket=BUCKET, Prefix=url.split("/", 3)[3])
    assert listed.get("KeyCount", 0) == 0
    assert list(tmp_path.iterdir()) == []
