"""A real S3-compatible server on the loopback for the object-store tests: moto's standalone server
(``python -m moto.server``) in a subprocess, started and stopped by fixtures; nothing is mocked
inside the test process.

Use from a test module::

    from tests.support.s3server import S3Server, s3_server, upload_bundle  # noqa: F401 (fixture)

    def test_x(s3_server: S3Server, sample_bundle_path):
        url = upload_bundle(s3_server, sample_bundle_path, "s3://bucket/x.bundle")
        Bundle(url, storage_options=s3_server.storage_options)

``s3_server`` is session-scoped (one server for the run; tests use their own bucket or prefix);
``S3Server`` itself can be started privately by a test that stops and restarts it. moto keeps
everything in memory, so a restarted server is empty: ``upload_bundle`` again to bring the same
objects back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REGION = "us-east-1"  # moto refuses s3fs's default location constraint elsewhere


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """One moto server process on 127.0.0.1; ``start``/``stop`` may be called repeatedly."""

    def __init__(self, log_dir: str | os.PathLike[str], port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._log_path = Path(log_dir) / f"moto-{self.port}.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def storage_options(self) -> dict[str, Any]:
        """What ``Bundle(url, storage_options=...)`` and s3fs need to reach this server."""
        return {
            "key": "test",
            "secret": "test",
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": REGION},
        }

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def command(self) -> list[str]:
        """The server's command line (the benchmark runs a request-counting moto instead)."""
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]

    def ready(self) -> None:
        """Returns once the server answers; raises OSError while it does not."""
        urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1).close()

    def start(self, timeout: float = 30.0, cwd: str | os.PathLike[str] | None = None) -> None:
        assert not self.running
        env = dict(os.environ, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")
        with open(self._log_path, "ab") as log:
            self._process = subprocess.Popen(
                self.command(),
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a ^C to pytest does not race the fixture's stop
            )
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"moto server exited: {self._log_path.read_text()[-2000:]}")
            try:
                self.ready()
                return
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto server not ready after {timeout} s") from None
                time.sleep(0.05)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections are accepted and never answered."""
        assert self._process is not None
        os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        os.kill(self._process.pid, signal.SIGCONT)

    # -- a client of our own (boto3, as a user's upload tool would be) ---------------------------

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )

    def create_bucket(self, bucket: str) -> None:
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=bucket)

    def put(self, url: str, data: bytes) -> None:
        bucket, key = split_url(url)
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def get(self, url: str) -> bytes:
        bucket, key = split_url(url)
        return bytes(self.client().get_object(Bucket=bucket, Key=key)["Body"].read())

    def delete(self, url: str) -> None:
        bucket, key = split_url(url)
        self.client().delete_object(Bucket=bucket, Key=key)


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` → (bucket, key)."""
    rest = url.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    return bucket, key


def upload_bundle(
    server: S3Server, bundle_dir: str | os.PathLike[str], url: str, *, marker: bool = True
) -> str:
    """Upload a locally packed bundle directory to ``url`` (bucket created if needed), the
    completion marker last (or not at all: ``marker=False``, an interrupted upload). Returns
    ``url``."""
    bucket, prefix = split_url(url)
    server.create_bucket(bucket)
    client = server.client()
    root = Path(bundle_dir)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != "lock.mdb")
    for path in files:
        if path.name == "COMPLETE":
            continue
        key = f"{prefix.rstrip('/')}/{path.relative_to(root).as_posix()}"
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    if marker:
        client.put_object(
            Bucket=bucket,
            Key=f"{prefix.rstrip('/')}/COMPLETE",
            Body=(root / "COMPLETE").read_bytes(),
        )
    return url


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A moto S3 server for the whole session; always stopped at the end."""
    server = S3Server(tmp_path_factory.mktemp("moto"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def private_s3_server(tmp_path: Path) -> Iterator[S3Server]:
    """A server of the test's own, which it may stop, pause and restart; always stopped."""
    server = S3Server(tmp_path)
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.resume()  # a paused process would not see SIGTERM
        server.stop()
