"""Bundles on a web server (``http://``, and ``https://`` by the same code), read-only, against
a local server that answers range requests (tests/support/httpserver.py): open and read every
file byte-identical, verify, the command line, a real mount compared with ``diff -r``, a redirect
followed, a server that ignores ``Range`` refused in one sentence without downloading whole
shards, a missing bundle "not a bundle", a missing shard damage, a pack to a URL refused."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import ssl
import time
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

from bundlefs import Bundle, PackOptions, pack  # noqa: E402
from bundlefs.core import format as fmt  # noqa: E402
from bundlefs.errors import CorruptDataError, NotABundleError, StorageError  # noqa: E402
from tests.conftest import pseudo_random_bytes  # noqa: E402
from tests.support.httpserver import (  # noqa: E402
    HTTPServer,
    http_server,
    no_range_server,
    self_signed_certificate,
)
from tests.support.trees import assert_one_line_error, build_rich_tree, diff_r, run_cli  # noqa: E402

__all__ = ["http_server", "no_range_server"]  # fixtures, imported to be found


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every kind of entry, and enough data for several shards at a 64 KiB shard size."""
    src = build_rich_tree(tmp_path_factory.mktemp("http") / "src")
    (src / "data").mkdir()
    for i in range(6):
        (src / "data" / f"{i}.bin").write_bytes(pseudo_random_bytes(40_000, i, compressible=False))
    return src


@pytest.fixture(scope="module")
def packed(tree: Path) -> Path:
    bundle = tree.parent / "rich.bundle"
    pack(str(tree), str(bundle), options=PackOptions(shard_size=64 * 1024))
    return bundle


@pytest.fixture(scope="module")
def url(http_server: HTTPServer, packed: Path) -> str:
    """``packed`` served read-only for the module."""
    return http_server.publish(packed, "datasets/rich.bundle")


def _shard_names(bundle: Path) -> list[str]:
    return sorted(n for n in os.listdir(bundle) if n.startswith(fmt.SHARD_PREFIX))


def test_every_file_reads_byte_identical(url: str, packed: Path) -> None:
    with Bundle(packed) as local, Bundle(url) as remote:
        assert len(_shard_names(packed)) > 2
        assert dict(remote.iter_files()) == dict(local.iter_files())
        for path, data in local.iter_files():
            assert remote.read(path) == data
        assert remote.info().bundle_id == local.info().bundle_id


def test_verify_accepts_the_served_bundle(url: str) -> None:
    result = run_cli("verify", url)
    assert result.returncode == 0, result.stderr
    assert f"OK: {url} is intact" in result.stdout.decode()


def test_info_ls_cat_and_extract_read_the_url(url: str, tree: Path, tmp_path: Path) -> None:
    result = run_cli("info", url)
    assert result.returncode == 0, result.stderr
    assert url in result.stdout.decode()
    result = run_cli("ls", url)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == sorted(
        n for n in os.listdir(os.fsencode(tree)) if not n.startswith(b".")
    )
    result = run_cli("cat", url, "hello.txt", "data/3.bin")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (tree / "hello.txt").read_bytes() + (tree / "data/3.bin").read_bytes()
    cache = tmp_path / "cache"
    result = run_cli("extract", "-q", url, tmp_path / "out", "--disk-cache", cache)
    assert result.returncode == 0, result.stderr
    assert diff_r(tree, tmp_path / "out").returncode == 0
    assert any(p.is_file() for p in cache.rglob("*"))  # the disk cache was used


def test_a_redirect_is_followed(http_server: HTTPServer, url: str, tree: Path) -> None:
    moved = url.replace(http_server.endpoint, f"{http_server.endpoint}/moved")
    with Bundle(moved) as bundle:
        assert bundle.read("hello.txt") == (tree / "hello.txt").read_bytes()


def test_no_bundle_at_the_url_is_not_a_bundle(http_server: HTTPServer) -> None:
    missing = f"{http_server.endpoint}/nothing/here.bundle"
    with pytest.raises(NotABundleError, match="is not a bundle"):
        Bundle(missing)
    assert_one_line_error(run_cli("ls", missing))


def test_a_server_that_ignores_range_is_refused_in_one_sentence(
    no_range_server: HTTPServer, packed: Path
) -> None:
    served = no_range_server.publish(packed, "rich.bundle")
    with pytest.raises(StorageError, match="does not answer range requests"):
        Bundle(served)
    message = assert_one_line_error(run_cli("ls", served))
    assert "does not answer range requests" in message
    # Refused before the bodies were read: nothing near the shards' size was sent.
    shard_bytes = sum((packed / n).stat().st_size for n in _shard_names(packed))
    assert no_range_server.bytes_sent < shard_bytes


def test_a_missing_shard_is_damage(http_server: HTTPServer, packed: Path, tmp_path: Path) -> None:
    served = http_server.publish(packed, "damaged/rich.bundle")
    lost = http_server.root / "damaged/rich.bundle" / _shard_names(packed)[1]
    lost.unlink()
    with Bundle(served, disk_cache=tmp_path / "cache") as bundle, pytest.raises(CorruptDataError):
        dict(bundle.iter_files())
    result = run_cli("verify", served)
    assert result.returncode != 0
    assert lost.name in result.stdout.decode() + result.stderr.decode()


def test_headers_in_the_storage_options_reach_the_server(packed: Path, tmp_path: Path) -> None:
    server = HTTPServer(tmp_path / "www", token="s3cret")
    server.root.mkdir()
    server.start()
    try:
        served = server.publish(packed, "rich.bundle")
        with pytest.raises(StorageError, match="access denied"):
            Bundle(served)
        headers = {"headers": {"Authorization": "Bearer s3cret"}}
        with Bundle(served, storage_options=headers) as bundle:
            assert bundle.read("hello.txt") == (packed.parent / "src/hello.txt").read_bytes()
        result = run_cli(
            "cat", served, "hello.txt", "--storage-option=headers.Authorization=Bearer s3cret"
        )
        assert result.returncode == 0, result.stderr
    finally:
        server.stop()


def test_https_reads_with_the_certificate_checked(
    packed: Path, tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a certificate")
    cert, key = self_signed_certificate(tmp_path)
    server = HTTPServer(tmp_path / "www", tls=(cert, key))
    server.root.mkdir()
    server.start()
    try:
        served = server.publish(packed, "rich.bundle")
        assert served.startswith("https://")
        with pytest.raises(StorageError, match="certificate"):
            Bundle(served)  # not trusted: refused, not read
        trusted = {"ssl": ssl.create_default_context(cafile=str(cert))}
        with Bundle(served, storage_options=trusted) as bundle:
            assert bundle.read("data/4.bin") == (tree / "data/4.bin").read_bytes()
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        result = run_cli("verify", served)
        assert result.returncode == 0, result.stderr
    finally:
        server.stop()


def test_a_server_that_never_answers_fails_within_the_store_timeout() -> None:
    with socket.socket() as listening:  # accepts connections (the kernel's backlog), answers none
        listening.bind(("127.0.0.1", 0))
        listening.listen(16)
        hung = f"http://127.0.0.1:{listening.getsockname()[1]}/x.bundle"
        began = time.monotonic()
        result = run_cli("ls", hung, "--store-timeout", "2")
        assert time.monotonic() - began < 15  # the timeout, plus starting Python twice over
    assert f"cannot read {hung}" in assert_one_line_error(result)


def test_a_range_past_the_end_is_a_short_read(url: str) -> None:
    from bundlefs.storage.location import parse_location
    from bundlefs.storage.objectstore.client import remote_filesystem

    marker = f"{url}/{fmt.MARKER_NAME}"
    fs = remote_filesystem(parse_location(url))
    assert fs.cat_file(marker, start=10_000, end=10_100) == b""  # the server answers 416
    assert len(fs.cat_file(marker, start=0, end=10_000)) == fmt.MARKER_SIZE


def test_fsspec_reads_a_bundle_url(url: str, tree: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("bundle", fo=url)
    assert fs.cat("data/2.bin") == (tree / "data/2.bin").read_bytes()
    with fsspec.open(f"bundle://hello.txt::{url}") as f:
        assert f.read() == (tree / "hello.txt").read_bytes()


def test_a_pack_to_a_web_server_is_refused(http_server: HTTPServer, tree: Path) -> None:
    result = run_cli("pack", tree, f"{http_server.endpoint}/new.bundle")
    assert "read-only" in assert_one_line_error(result)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_mount_of_the_url_matches_the_source(
    url: str, tree: Path, mount_bundle, tmp_path: Path, workers: str
) -> None:
    pytest.importorskip("pyfuse3")
    # Two workers: each forked process makes its own HTTP session.
    m = mount_bundle(url, "--disk-cache", str(tmp_path / "cache"), "--workers", workers)
    result = diff_r(tree, m.mountpoint)
    assert result.returncode == 0, result.stdout.decode(errors="replace")
    info = run_cli("info", m.mountpoint)
    assert info.returncode == 0, info.stderr
    assert url in info.stdout.decode()


def test_a_mount_answers_eio_for_a_missing_shard(
    http_server: HTTPServer, packed: Path, mount_bundle, tmp_path: Path
) -> None:
    pytest.importorskip("pyfuse3")
    served = http_server.publish(packed, "mount-damaged/rich.bundle")
    for name in _shard_names(packed)[1:]:
        (http_server.root / "mount-damaged/rich.bundle" / name).unlink()
    m = mount_bundle(served, "--disk-cache", str(tmp_path / "cache"), allowed_log=[r".*"])
    errors = []
    for i in range(6):
        try:
            (m.mountpoint / "data" / f"{i}.bin").read_bytes()
        except OSError as e:
            errors.append(e.errno)
    assert errors and set(errors) == {errno.EIO}  # the first shard's files may still read
