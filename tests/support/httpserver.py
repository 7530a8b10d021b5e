"""A web server on the loopback that answers range requests, for the ``https://``/``http://``
bundle tests: the standard library's ``http.server`` serving one directory from a thread of the
test process (a mount's own processes reach it over the loopback like any client).

What it does, as a plain static file server does: ``GET``/``HEAD`` of a file, ``Range:
bytes=A-B`` (and ``A-``) answered ``206`` with ``Content-Range``, a range past the end ``416``,
no directory listings (a directory is ``404``), and ``/moved/PATH`` redirected (``302``) to
``/PATH``. ``ranges=False`` makes it a server that ignores ``Range`` (``200``, the whole file).
``tls=(CERT, KEY)`` serves https (``self_signed_certificate`` makes a pair for 127.0.0.1).
``token=`` makes every request need ``Authorization: Bearer TOKEN`` (``401`` without).
It counts requests and body bytes sent, so a test can tell a ranged read from a full download.

Use from a test module::

    from tests.support.httpserver import HTTPServer, http_server  # noqa: F401 (fixture)

    def test_x(http_server: HTTPServer, sample_bundle_path):
        Bundle(http_server.publish(sample_bundle_path, "x.bundle"))
"""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers and aiohttp's pool expect

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: pytest shows stderr of failing tests

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        owner = self.server.owner
        with owner.lock:
            owner.requests += 1
        path = self.path.split("?", 1)[0]
        if owner.token and self.headers.get("Authorization") != f"Bearer {owner.token}":
            self._reply(HTTPStatus.UNAUTHORIZED)
            return
        if path.startswith("/moved/"):
            self._reply(HTTPStatus.FOUND, {"Location": path[len("/moved") :]})
            return
        local = owner.root / path.lstrip("/")
        if ".." in Path(path).parts or not local.is_file():
            self._reply(HTTPStatus.NOT_FOUND)
            return
        size = local.stat().st_size
        start, stop = 0, size
        wanted = _RANGE.match(self.headers.get("Range", ""))
        status = HTTPStatus.OK
        if wanted and owner.ranges:
            start = int(wanted.group(1))
            stop = min(size, int(wanted.group(2)) + 1) if wanted.group(2) else size
            if start >= size:
                self._reply(
                    HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, {"Content-Range": f"bytes */{size}"}
                )
                return
            status = HTTPStatus.PARTIAL_CONTENT
        headers = {"Content-Length": str(stop - start), "Accept-Ranges": "bytes"}
        if status == HTTPStatus.PARTIAL_CONTENT:
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        self._reply(status, headers, end=not body)
        if body:
            self._send_file(local, start, stop)

    def _send_file(self, local: Path, start: int, stop: int) -> None:
        with open(local, "rb") as f:
            f.seek(start)
            left = stop - start
            try:
                while left > 0:
                    chunk = f.read(min(left, 1 << 16))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)
                    with self.server.owner.lock:
                        self.server.owner.bytes_sent += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client stopped reading (a refused 200)

    def _reply(self, status: int, headers: dict[str, str] | None = None, end: bool = True) -> None:
        self.send_response(status)
        headers = dict(headers or {})
        if end and "Content-Length" not in headers:
            headers["Content-Length"] = "0"
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: HTTPServer


class HTTPServer:
    """A range-answering static file server over ``root`` on 127.0.0.1 (``start``/``stop``)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        ranges: bool = True,
        token: str = "",
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self.root = Path(root)
        self.ranges = ranges
        self.token = token  # when set, every request needs "Authorization: Bearer TOKEN"
        self.lock = threading.Lock()
        self.requests = 0
        self.bytes_sent = 0
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        scheme = "http"
        if tls is not None:  # (certificate, key): serve https
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            scheme = "https"
        self.endpoint = f"{scheme}://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def publish(self, bundle: str | os.PathLike[str], name: str | None = None) -> str:
        """Copy a packed bundle directory under the served root; its URL."""
        name = name or Path(bundle).name
        shutil.copytree(bundle, self.root / name, dirs_exist_ok=True)
        return f"{self.endpoint}/{name}"

    def put(self, url: str, data: bytes) -> None:
        """Write one served file, by its URL (what an upload would do on a real server)."""
        assert url.startswith(self.endpoint + "/"), url
        local = self.root / url[len(self.endpoint) + 1 :]
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(local.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(local)  # a reader sees the old bytes or the new, never a mix


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by ``openssl`` (the client trusts the
    certificate itself: ``ssl.create_default_context(cafile=CERT)`` or ``SSL_CERT_FILE``)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", key, "-out", cert, "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="session")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPServer]:
    """One range-answering server for the run; tests publish bundles under their own names."""
    server = HTTPServer(tmp_path_factory.mktemp("www"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def no_range_server(tmp_path: Path) -> Iterator[HTTPServer]:
    """A server that ignores ``Range`` and sends whole files."""
    server = HTTPServer(tmp_path / "www-no-range", ranges=False)
    server.root.mkdir()
    server.start()
    yield server
    server.stop()
