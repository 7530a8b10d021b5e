"""``diff`` of two bundles on a real S3 server (moto's, on the loopback): only the markers and
indexes are fetched, so bundles whose shard objects are gone still diff, from Python and from
the command line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from bundlefs import PackOptions, ReadOptions, RemoteOptions, diff, pack  # noqa: E402
from tests.conftest import FIXED_MTIME_NS, build_tree  # noqa: E402
from tests.support.s3server import S3Server, s3_server, upload_bundle  # noqa: E402
from tests.support.trees import run_cli  # noqa: E402

__all__ = ["s3_server"]  # a fixture, imported to be found

BEFORE = {"same": b"same\n", "edit": b"before\n", "gone": b"gone\n"}
AFTER = {"same": b"same\n", "edit": b"after!\n", "new": b"new\n"}


@pytest.fixture
def urls(s3_server: S3Server, tmp_path: Path) -> tuple[str, str]:
    """OLD and NEW uploaded to the server, then their shard objects deleted."""
    found = []
    for name, spec in (("old", BEFORE), ("new", AFTER)):
        src = build_tree(tmp_path / f"{name}.src", spec, mtime_ns=FIXED_MTIME_NS)
        local = tmp_path / f"{name}.bundle"
        pack(str(src), str(local), PackOptions(created_ns=0))
        url = upload_bundle(s3_server, local, f"s3://diff-test/{tmp_path.name}/{name}.bundle")
        for shard in local.glob("shard-*"):
            s3_server.delete(f"{url}/{shard.name}")
        found.append(url)
    return found[0], found[1]


def test_bundles_at_urls_diff_from_their_indexes_alone(s3_server, urls, tmp_path) -> None:
    remote = RemoteOptions(
        storage_options=s3_server.storage_options, disk_cache=str(tmp_path / "cache")
    )
    found = [(c.status, c.path) for c in diff(*urls, options=ReadOptions(remote=remote))]
    assert found == [("M", b"edit"), ("D", b"gone"), ("A", b"new")]


def test_the_cli_diffs_bundles_at_urls(s3_server, urls, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("BUNDLEFS_CACHE_DIR", os.fspath(tmp_path / "cache"))
    result = run_cli("diff", *urls, "--storage-option", f"endpoint_url={s3_server.endpoint}")
    assert result.returncode == 1, result.stderr
    assert result.stdout == b"M\tedit\nD\tgone\nA\tnew\n"
