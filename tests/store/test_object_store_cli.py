"""Publishing to and serving from an object store through the command line, against a real server.

moto's standalone S3 server runs on the loopback (a subprocess: no mocking inside any process);
every command is a real ``python -m bundlefs`` subprocess given the endpoint with
``--storage-option``, and the mount is a real FUSE mount of the URL. Covered: pack to ``s3://``
(marker last, staging removed), verify, info, ls, cat, extract and a mount compared with
``diff -r``; a killed upload leaves nothing that opens and a later pack succeeds; ``--force``
leaves no stale shards; a prefix of other objects is refused; bad credentials, a missing bucket and
an unreachable endpoint are one sentence, quickly; a mount whose store goes away answers EIO, stays
up and serves the right bytes once the store is back.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from bundlefs import Bundle, PackError, pack  # noqa: E402
from bundlefs.core import format as fmt  # noqa: E402
from bundlefs.storage.location import parse_location  # noqa: E402
from bundlefs.storage.objectstore import upload as upload_module  # noqa: E402
from bundlefs.storage.objectstore.upload import (  # noqa: E402
    ATTEMPTS,
    READ_TIMEOUT,
    UPLOAD_READ_TIMEOUT,
    RemotePublisher,
)
from tests.conftest import pseudo_random_bytes  # noqa: E402
from tests.support.mounting import wait_until  # noqa: E402
from tests.support.s3server import S3Server, free_port, s3_server  # noqa: E402
from tests.support.trees import assert_one_line_error, build_rich_tree, diff_r, run_cli  # noqa: E402

__all__ = ["s3_server"]  # a fixture, imported to be found

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}


# -- the server ------------------------------------------------------------------------------------


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


class Switch:
    """A TCP relay in front of the server that can be cut and restored, the server's state intact
    (moto keeps its objects in memory: restarting it would lose them)."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.port = free_port()
        self.up = True
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()  # connection reset: the store is down
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.up = False
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self._listener.close()


@pytest.fixture(scope="module")
def endpoint(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's moto server, for subprocesses that find the credentials where s3fs looks
    and keep their default disk cache (the fetched index, records) out of the user's ~/.cache;
    each command is given the endpoint with ``--storage-option``."""
    env = {**CREDENTIALS, "BUNDLEFS_CACHE_DIR": str(tmp_path_factory.mktemp("default-cache"))}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield s3_server.endpoint
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _fs(endpoint: str):
    import fsspec

    return fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True)


@pytest.fixture
def bucket(endpoint: str) -> str:
    """A fresh bucket for one test."""
    name = f"b{uuid.uuid4().hex[:12]}"
    _fs(endpoint).mkdir(name)
    return name


def cli(endpoint: str, *args: str | os.PathLike) -> subprocess.CompletedProcess:
    """``bundlefs ARGS --storage-option endpoint_url=ENDPOINT``."""
    return run_cli(*args, "--storage-option", f"endpoint_url={endpoint}")


def objects(endpoint: str, url: str) -> dict[str, int]:
    """The objects under ``url`` (relative names) and their sizes."""
    root = url.removeprefix("s3://")
    found = _fs(endpoint).find(root, detail=True)
    return {name[len(root) + 1 :]: info["size"] for name, info in found.items()}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every kind of entry, and enough data for several shards at --shard-size 64K."""
    base = tmp_path_factory.mktemp("store-cli")
    src = build_rich_tree(base / "src")
    (src / "data").mkdir()
    for i in range(6):
        (src / "data" / f"{i}.bin").write_bytes(pseudo_random_bytes(40_000, i, compressible=False))
    return src


@pytest.fixture(scope="module")
def published(endpoint: str, tree: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """``tree`` packed to a URL by the CLI, once for the module. Read-only."""
    import fsspec

    name = f"b{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True).mkdir(name)
    url = f"s3://{name}/datasets/rich.bundle"
    staging = tmp_path_factory.mktemp("staging")
    result = cli(endpoint, "pack", "--shard-size", "64K", "--staging", staging, tree, url)
    assert result.returncode == 0, result.stderr
    assert url in result.stdout.decode()
    assert list(staging.iterdir()) == []  # the local build is gone once uploaded
    return url


# -- publishing ------------------------------------------------------------------------------------


def test_pack_uploads_a_bundle_that_opens_where_it_is_downloaded(
    endpoint, published, tree, tmp_path
):
    found = objects(endpoint, published)
    shards = sorted(n for n in found if n.startswith("shard-"))
    assert len(shards) > 1
    assert set(found) == {"COMPLETE", "index/data.mdb", "index/pages", *shards}
    assert found["COMPLETE"] == 52
    # The objects are exactly a bundle: a plain download opens and extracts to the source.
    local = tmp_path / "copy.bundle"
    _fs(endpoint).get(published.removeprefix("s3://"), str(local), recursive=True)
    with Bundle(local) as b:
        assert b.config.shard_count == len(shards)
    assert run_cli("extract", "-q", local, tmp_path / "out").returncode == 0
    assert diff_r(tree, tmp_path / "out").returncode == 0


def test_compact_uploads_a_bundle_that_verifies_and_has_no_dead_bytes(
    endpoint, bucket, tree, tmp_path
):
    local = tmp_path / "b.bundle"
    assert run_cli("pack", "-q", "--shard-size", "64K", tree, local).returncode == 0
    url = f"s3://{bucket}/compacted.bundle"
    result = cli(endpoint, "compact", "--shard-size", "1M", "--staging", tmp_path, local, url)
    assert result.returncode == 0, result.stderr
    assert cli(endpoint, "verify", url).returncode == 0
    facts = json.loads(cli(endpoint, "info", "--dead", "--json", url).stdout)
    with Bundle(local) as b:
        assert facts["dead_bytes"] == 0 and facts["shards"] < b.config.shard_count


def test_pack_refuses_an_existing_url_without_force(endpoint, published, tree):
    before = objects(endpoint, published)
    line = assert_one_line_error(cli(endpoint, "pack", tree, published))
    assert "already exists (use --force" in line
    assert objects(endpoint, published) == before


def test_force_replaces_the_bundle_and_leaves_no_stale_shards(endpoint, bucket, tree, tmp_path):
    url = f"s3://{bucket}/x.bundle"
    assert cli(endpoint, "pack", "-q", "--shard-size", "64K", tree, url).returncode == 0
    old = objects(endpoint, url)
    small = tmp_path / "small"
    small.mkdir()
    (small / "only.txt").write_bytes(b"the new bundle\n")
    assert cli(endpoint, "pack", "-q", "--force", small, url).returncode == 0
    assert set(objects(endpoint, url)) == {
        "COMPLETE",
        "index/data.mdb",
        "index/pages",
        "shard-00000000",
    }
    assert len(old) > 3  # there were stale shards to remove
    result = cli(endpoint, "cat", url, "only.txt")
    assert (result.returncode, result.stdout) == (0, b"the new bundle\n"), result.stderr


def test_a_prefix_holding_other_objects_is_refused_even_with_force(endpoint, bucket, tree):
    fs = _fs(endpoint)
    fs.pipe(f"{bucket}/photos/cat.jpg", b"not a bundle")
    for extra in ((), ("--force",)):
        line = assert_one_line_error(cli(endpoint, "pack", *extra, tree, f"s3://{bucket}/photos"))
        assert "exists and is not a bundle" in line
    assert fs.cat(f"{bucket}/photos/cat.jpg") == b"not a bundle"
    assert set(objects(endpoint, f"s3://{bucket}/photos")) == {"cat.jpg"}


# A pack that stops for good once its first object is in the store: what SIGKILL interrupts.
_STALLING_PACK = """
import os, sys, time
from bundlefs.storage.objectstore import upload
real_upload = upload.RemotePublisher._upload
def stalling(self, work, name, uploaded):
    real_upload(self, work, name, uploaded)
    open(os.environ["STALL_FLAG"], "w").close()
    time.sleep(600)
upload.RemotePublisher._upload = stalling
from bundlefs.cli.app import main
sys.exit(main(sys.argv[1:]))
"""


def _killed_pack(endpoint: str, tmp_path: Path, *args: str | os.PathLike) -> None:
    flag = tmp_path / f"stalled-{uuid.uuid4().hex}"
    env = {**os.environ, "STALL_FLAG": str(flag)}
    command = [sys.executable, "-c", _STALLING_PACK, "pack", "-q", *map(str, args)]
    command += ["--storage-option", f"endpoint_url={endpoint}"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not flag.exists():
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "the upload never started"
            time.sleep(0.02)
    finally:
        process.kill()
        process.wait()
        if process.stderr:
            process.stderr.close()


def _does_not_open(endpoint: str, url: str) -> None:
    line = assert_one_line_error(cli(endpoint, "info", url))
    assert "incomplete bundle" in line, line


def test_a_killed_upload_leaves_nothing_that_opens_and_a_later_pack_succeeds(
    endpoint, bucket, tree, tmp_path
):
    url = f"s3://{bucket}/killed.bundle"
    staging = tmp_path / "staging"
    staging.mkdir()
    _killed_pack(endpoint, tmp_path, "--shard-size", "64K", "--staging", staging, tree, url)
    left = objects(endpoint, url)
    assert left and "COMPLETE" not in left  # something was uploaded, never the marker
    _does_not_open(endpoint, url)
    # No --force needed: what a killed upload left is not a bundle anyone had.
    result = cli(endpoint, "pack", "-q", "--shard-size", "64K", "--staging", staging, tree, url)
    assert result.returncode == 0, result.stderr
    assert list(staging.iterdir()) == []  # the killed pack's staging was swept too
    assert cli(endpoint, "verify", "-q", url).returncode == 0


def test_a_killed_forced_replacement_leaves_nothing_that_opens(endpoint, bucket, tree, tmp_path):
    url = f"s3://{bucket}/replaced.bundle"
    small = tmp_path / "small"
    small.mkdir()
    (small / "f").write_bytes(b"old\n")
    assert cli(endpoint, "pack", "-q", small, url).returncode == 0
    _killed_pack(endpoint, tmp_path, "--force", "--shard-size", "64K", tree, url)
    assert "COMPLETE" not in objects(endpoint, url)  # the old marker went first
    _does_not_open(endpoint, url)
    assert cli(endpoint, "pack", "-q", "--shard-size", "64K", tree, url).returncode == 0
    result = cli(endpoint, "cat", url, "hello.txt")
    assert (result.returncode, result.stdout) == (0, b"hello\n"), result.stderr


# -- failures of the store -------------------------------------------------------------------------


def test_a_missing_bucket_is_one_sentence(endpoint, tree, tmp_path):
    started = time.monotonic()
    line = assert_one_line_error(cli(endpoint, "pack", tree, "s3://no-such-bucket-here/x.bundle"))
    assert "bucket does not exist" in line
    line = assert_one_line_error(cli(endpoint, "info", "s3://no-such-bucket-here/x.bundle"))
    assert time.monotonic() - started < 30


def test_bad_credentials_are_one_sentence(tree, tmp_path, monkeypatch):
    # A server of its own that checks credentials: it issued none, so every request is refused
    # as a wrong key would be.
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "0")
    strict = S3Server(tmp_path)
    strict.start()
    try:
        for command in (("pack", tree, "s3://bucket/x.bundle"), ("info", "s3://bucket/x.bundle")):
            started = time.monotonic()
            result = run_cli(
                *command,
                "--storage-option", f"endpoint_url={strict.endpoint}",
                "--storage-option", "key=wrong",
                "--storage-option", "secret=wrong",
            )  # fmt: skip
            line = assert_one_line_error(result)
            assert "denied" in line and "credentials" in line, line
            assert time.monotonic() - started < 30
    finally:
        strict.stop()


def test_an_unreachable_endpoint_is_one_sentence(tree):
    dead = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    line = assert_one_line_error(cli(dead, "pack", tree, "s3://bucket/x.bundle"))
    assert "cannot publish to s3://bucket/x.bundle" in line
    assert time.monotonic() - started < 20  # a few retries with backoff, then the sentence


def test_a_stalled_endpoint_fails_a_pack_after_the_bounded_attempts():
    # A store that accepts connections and never answers: botocore's attempts are the only
    # ones (s3fs's own loop once made 5 of them, 20 requests of a read timeout each).
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    options = {
        "key": "test",
        "secret": "test",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{listener.getsockname()[1]}"},
        "config_kwargs": {"read_timeout": 1, "connect_timeout": 1},  # the test's, to be quick
    }
    try:
        publisher = RemotePublisher(parse_location("s3://bucket/x.bundle", options))
        with pytest.raises(PackError, match="cannot publish to s3://bucket/x.bundle while listing"):
            publisher.check(force=False)
        assert len(accepted) == ATTEMPTS
    finally:
        listener.close()
        for conn in accepted:
            conn.close()


def test_the_packer_waits_longer_for_uploads_than_for_other_requests():
    publisher = RemotePublisher(parse_location("s3://bucket/x.bundle", {"anon": True}))
    assert publisher.fs.config_kwargs["read_timeout"] == READ_TIMEOUT
    assert publisher.upload_fs.config_kwargs["read_timeout"] == UPLOAD_READ_TIMEOUT
    assert publisher.fs.retries == publisher.upload_fs.retries == 1


def test_the_root_listed_as_a_directory_is_not_a_foreign_object():
    # s3fs answers a listing that finds nothing with the root's own info: a "directory" when
    # another pack's objects appear under it meanwhile. Only an object of that name is foreign.
    publisher = RemotePublisher(parse_location("s3://bucket/x.bundle", {"anon": True}))

    class Listing:
        def __init__(self, kind: str) -> None:
            self.kind = kind

        def invalidate_cache(self, path: str) -> None:
            pass

        def find(self, path: str, detail: bool) -> dict[str, dict[str, object]]:
            return {path: {"name": path, "type": self.kind, "size": 0}}

    publisher.fs = Listing("directory")
    assert publisher.scan().objects == {}
    publisher.fs = Listing("file")
    assert publisher.scan().foreign == [""]


def test_an_interrupted_upload_does_not_wait_for_the_objects_queued(monkeypatch):
    publisher = RemotePublisher(parse_location("s3://bucket/x.bundle", {"anon": True}), jobs=2)
    started: list[str] = []
    finished: list[str] = []
    release, waiting, interrupted = threading.Event(), threading.Event(), threading.Event()
    wait = upload_module.wait

    def watched_wait(*args: Any, **kwargs: Any) -> Any:
        waiting.set()  # every upload is queued: the publisher waits for them
        return wait(*args, **kwargs)

    def upload(name: str) -> None:
        started.append(name)
        if len(started) == 1:  # ^C once the upload is under way
            assert waiting.wait(5)
            # Again until it is taken: one that lands just before the main thread blocks is
            # only seen once it wakes (Python checks for signals between bytecodes).
            while not interrupted.wait(0.05):
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        release.wait(10)
        finished.append(name)

    def sigint(signum: int, frame: object) -> None:
        if not interrupted.is_set():
            interrupted.set()
            raise KeyboardInterrupt

    monkeypatch.setattr(upload_module, "wait", watched_wait)
    previous = signal.signal(signal.SIGINT, sigint)
    try:
        with pytest.raises(KeyboardInterrupt):
            publisher._parallel([f"shard-{i:08}" for i in range(8)], upload, "uploading")
        assert finished == []  # back at once, not after every upload queued
    finally:
        interrupted.set()
        signal.signal(signal.SIGINT, previous)
        release.set()
    time.sleep(0.2)
    assert len(started) <= 2  # the queued ones never started


def test_a_marker_of_the_wrong_size_says_the_marker_is_there(endpoint, bucket, tree, tmp_path):
    # The size check after COMPLETE: the marker is on the store already, so "the bundle was not
    # published" would be false.
    local = tmp_path / "local.bundle"
    pack(str(tree), str(local))
    url = f"s3://{bucket}/x.bundle"
    publisher = RemotePublisher(parse_location(url, {"endpoint_url": endpoint}))
    info = publisher.fs.info

    def lying_info(path: str, **kwargs: object) -> dict[str, object]:
        answer = dict(info(path, **kwargs))
        if path.endswith(f"/{fmt.MARKER_NAME}"):
            answer["size"] = fmt.MARKER_SIZE - 1  # as if another pack's marker were there
        return answer

    publisher.fs.info = lying_info
    with pytest.raises(PackError) as caught:
        publisher.publish(str(local), force=False)
    message = str(caught.value)
    assert "not published" not in message
    assert "the completion marker is on the store" in message
    assert fmt.MARKER_NAME in objects(endpoint, url)


# -- reading through the command line --------------------------------------------------------------


def test_verify_accepts_the_published_bundle(endpoint, published):
    result = cli(endpoint, "verify", published)
    assert result.returncode == 0, result.stderr
    assert f"OK: {published} is intact" in result.stdout.decode()


def test_info_shows_where_the_bundle_lives(endpoint, published, tmp_path):
    result = cli(endpoint, "info", "--json", published, "--disk-cache", tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert published in json.dumps(facts.get("location", facts["path"]))
    text = cli(endpoint, "info", published).stdout.decode()
    assert published in text
    assert "storage" in facts and any(line.startswith("storage ") for line in text.splitlines())


def test_ls_cat_and_extract_read_the_url(endpoint, published, tree, tmp_path):
    result = cli(endpoint, "ls", published)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == sorted(
        n for n in os.listdir(os.fsencode(tree)) if not n.startswith(b".")
    )
    result = cli(endpoint, "cat", published, "hello.txt", "data/3.bin")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (tree / "hello.txt").read_bytes() + (tree / "data/3.bin").read_bytes()
    cache = tmp_path / "cache"
    result = cli(endpoint, "extract", "-q", published, tmp_path / "out", "--disk-cache", cache)
    assert result.returncode == 0, result.stderr
    assert diff_r(tree, tmp_path / "out").returncode == 0
    assert any(p.is_file() for p in cache.rglob("*"))  # the disk cache was used


# -- mounting a URL --------------------------------------------------------------------------------


def test_a_mount_of_the_url_matches_the_source(endpoint, published, tree, mount_bundle, tmp_path):
    m = mount_bundle(
        published,
        "--storage-option", f"endpoint_url={endpoint}",
        "--disk-cache", str(tmp_path / "cache"),
    )  # fmt: skip
    result = diff_r(tree, m.mountpoint)
    assert result.returncode == 0, result.stdout.decode(errors="replace")
    facts = json.loads(os.getxattr(m.mountpoint, "user.bundlefs.bundle"))
    assert published in json.dumps(facts.get("location", facts["path"]))
    info = run_cli("info", m.mountpoint)
    assert info.returncode == 0, info.stderr
    assert published in info.stdout.decode()


def test_a_mount_answers_eio_while_the_store_is_away_and_recovers(
    endpoint, published, tree, mount_bundle, tmp_path
):
    switch = Switch(int(endpoint.rsplit(":", 1)[1]))
    try:
        m = mount_bundle(
            published,
            "--storage-option", f"endpoint_url={switch.endpoint}",
            # Nothing cached but the index: every record read goes to the store.
            "--disk-cache", str(tmp_path / "cache"), "--disk-cache-size", "0",
            "--no-prefetch",
            allowed_log=[r"object store is unreachable", r"read failed with EIO \(object store"],
        )  # fmt: skip
        switch.cut()
        started = time.monotonic()
        with pytest.raises(OSError) as raised:
            (m.mountpoint / "data" / "4.bin").read_bytes()
        assert raised.value.errno == errno.EIO
        assert time.monotonic() - started < 30  # retries are bounded: no hang
        assert m.process.poll() is None  # the daemon is still serving
        switch.restore()

        def reads() -> bool:  # once the background probe (every 2 s) has seen the store
            try:
                return (m.mountpoint / "data" / "4.bin").read_bytes() == (
                    tree / "data/4.bin"
                ).read_bytes()
            except OSError:
                return False

        assert wait_until(reads, timeout=10)
        assert diff_r(tree, m.mountpoint).returncode == 0
        stats = json.loads(os.getxattr(m.mountpoint, "user.bundlefs.stats"))
        assert stats["outage_eio_count"] >= 1 and stats["eio_count"] == 0, stats
        # Logged once, when the store went away (and once when it came back); never as damage.
        log = m.log_text()
        assert log.count("object store is unreachable") == 1, log
        assert "damaged data" not in log
    finally:
        switch.close()


def test_a_detached_mount_takes_its_options_from_the_environment(endpoint, published, tmp_path):
    """As a systemd unit would: BUNDLEFS_STORAGE_OPTIONS, and the daemon forked after the
    handshake still reaches the store."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**os.environ, "BUNDLEFS_STORAGE_OPTIONS": json.dumps({"endpoint_url": endpoint})}
    command = [sys.executable, "-m", "bundlefs", "mount", published, str(mnt)]
    command += ["--log-file", str(tmp_path / "daemon.log"), "--disk-cache", str(tmp_path / "c")]
    result = subprocess.run(command, env=env, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    try:
        assert (mnt / "hello.txt").read_bytes() == b"hello\n"
        assert (mnt / "data" / "5.bin").stat().st_size == 40_000
        assert len((mnt / "data" / "5.bin").read_bytes()) == 40_000
    finally:
        assert run_cli("umount", mnt).returncode == 0
    assert "Traceback" not in (tmp_path / "daemon.log").read_text()


def test_fstab_options_carry_storage_options_and_the_disk_cache(tmp_path):
    """``mount -t fuse.bundlefs URL MNT -o ...`` (mount.fuse3's form) reaches MountOptions; the
    URL is kept as a URL and the disk cache made absolute (the daemon changes to /)."""
    from bundlefs.cli.app import _mount_helper_form, build_parser
    from bundlefs.cli.mount import options_from_args

    argv = _mount_helper_form(
        [
            "s3://bucket/x.bundle",
            str(tmp_path),
            "-o",
            "ro,storage_option=endpoint_url=http://h:9000,storage_option=anon=true",
            "-o",
            "disk_cache=rel/cache,disk_cache_size=2GiB,store_timeout=7.5",
        ]
    )
    options = options_from_args(build_parser().parse_args(argv))
    assert options.bundle == "s3://bucket/x.bundle"
    remote = options.read.remote
    assert remote.storage_options == {"endpoint_url": "http://h:9000", "anon": True}
    assert remote.disk_cache == os.path.abspath("rel/cache")
    assert remote.disk_cache_size == 2 * 1024**3
    assert remote.store_timeout == 7.5
