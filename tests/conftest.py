"""Shared fixtures for the bundlefs test suite.

Sections (keep new fixtures in the section they belong to):
1. Building source trees from a small declarative spec (``build_tree``).
2. Packing helpers (``pack_tree``) and a session-scoped sample bundle with its expected contents.
3. Bundle helpers: opening, comparing bundle directories, flipping bytes.
4. FUSE mount fixtures (added with the mount; see docs and /work/shared/notes/architecture.md).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bundlefs import Bundle, PackOptions, pack

# =================================================================================================
# 1. Source trees
# =================================================================================================

# A fixed, pre-1970-safe mtime for reproducible trees: 2023-11-14T22:13:20.123456789Z.
FIXED_MTIME_NS = 1_700_000_000_123_456_789


@dataclass(frozen=True)
class Symlink:
    """A symbolic link in a tree spec; the target is stored verbatim (never resolved)."""

    target: str | bytes


@dataclass(frozen=True)
class HardLink:
    """Another name for a regular file given earlier in the spec, by its path from the root."""

    to: str | bytes


# A tree spec maps names (str or bytes) to file content (bytes), a sub-spec (dict: a directory),
# a Symlink or a HardLink.
TreeSpec = dict


def _b(name: str | bytes) -> bytes:
    return os.fsencode(name)


def build_tree(root: str | os.PathLike, spec: TreeSpec, *, mtime_ns: int | None = None) -> Path:
    """Create ``spec`` under ``root`` (created if missing); hard links are made after the rest.

    With ``mtime_ns``, every entry (symlinks included, directories last) gets that mtime, so two
    builds of one spec look identical to the packer.
    """
    root_b = _b(os.fspath(root))
    os.makedirs(root_b, exist_ok=True)
    links: list[tuple[bytes, bytes]] = []
    created: list[bytes] = []

    def make(directory: bytes, sub: TreeSpec) -> None:
        for name, value in sub.items():
            path = os.path.join(directory, _b(name))
            if isinstance(value, dict):
                os.mkdir(path)
                make(path, value)
            elif isinstance(value, Symlink):
                os.symlink(_b(value.target), path)
            elif isinstance(value, HardLink):
                links.append((path, os.path.join(root_b, _b(value.to))))
                continue
            else:
                with open(path, "wb") as f:
                    f.write(value)
            created.append(path)

    make(root_b, spec)
    for path, target in links:
        os.link(target, path)
        created.append(path)
    if mtime_ns is not None:
        # Deepest paths first, so setting a child's mtime never disturbs its directory's afterwards.
        for path in sorted(created, key=lambda p: p.count(b"/"), reverse=True):
            os.utime(path, ns=(mtime_ns, mtime_ns), follow_symlinks=False)
        os.utime(root_b, ns=(mtime_ns, mtime_ns))
    return Path(os.fsdecode(root_b))


def pseudo_random_bytes(size: int, seed: int, *, compressible: bool = True) -> bytes:
    """Deterministic content; compressible content repeats words so lz4 has something to do."""
    rng = random.Random(seed)
    if not compressible:
        return rng.randbytes(size)
    words = [rng.randbytes(rng.randint(3, 12)) for _ in range(64)]
    base = bytearray()
    while len(base) < min(size, 65536):
        base += rng.choice(words)
    out = bytearray((bytes(base) * (size // max(1, len(base)) + 1))[:size])
    # Stamp every 256-byte stretch with its offset: no two stretches are alike, so a read from the
    # wrong place (say, the wrong record) cannot return the right bytes.
    for offset in range(0, size - 7, 256):
        out[offset : offset + 8] = offset.to_bytes(8, "big")
    return bytes(out)


def source_paths(root: str | os.PathLike) -> list[bytes]:
    """Every path below ``root`` (relative, bytes), as the packer sees the tree (no following)."""
    root_b = _b(os.fspath(root))
    out = []
    for top, dirs, files in os.walk(root_b):
        rel_top = os.path.relpath(top, root_b)
        for name in dirs + files:
            out.append(name if rel_top == b"." else os.path.join(rel_top, name))
    return sorted(out)


# =================================================================================================
# 2. Packing and the sample bundle
# =================================================================================================

# A small record size makes multi-record files, record boundaries and cache evictions cheap.
SAMPLE_RECORD_SIZE = 16 * 1024

SAMPLE_SPEC: TreeSpec = {
    "hello.txt": b"hello, bundle\n",
    "empty": b"",
    "data.json": b'{"name": "bundlefs", "numbers": [1, 2, 3], "nested": {"ok": true}}\n',
    "big.bin": pseudo_random_bytes(5 * SAMPLE_RECORD_SIZE + 123, seed=1),
    "noise.bin": pseudo_random_bytes(2 * SAMPLE_RECORD_SIZE + 7, seed=2, compressible=False),
    "zeros.bin": bytes(3 * SAMPLE_RECORD_SIZE),
    "lines.txt": b"".join(b"line %d\n" % i for i in range(2000)),
    "dir": {
        "a.txt": b"A" * 100,
        "b.txt": b"B" * 200,
        "sub": {"deep.txt": b"deep down\n", "deeper": {"deepest.txt": b"bottom\n"}},
        "hard2": HardLink("hard1"),
    },
    "emptydir": {},
    "hard1": b"shared content of two names\n",
    "link": Symlink("hello.txt"),
    "dirlink": Symlink("dir"),
    "dangling": Symlink("does/not/exist"),
    "through-a-file": Symlink("hello.txt/x"),
    "uni-ünï código.txt": "unicode ✓\n".encode(),
}


def expected_files(spec: TreeSpec) -> dict[str, bytes]:
    """path → content for every regular file name of a spec (hard links resolved)."""
    files: dict[str, bytes] = {}
    links: list[tuple[str, str]] = []

    def walk(sub: TreeSpec, prefix: str) -> None:
        for name, value in sub.items():
            path = prefix + os.fsdecode(name)
            if isinstance(value, dict):
                walk(value, path + "/")
            elif isinstance(value, HardLink):
                links.append((path, os.fsdecode(value.to)))
            elif isinstance(value, bytes):
                files[path] = value

    walk(spec, "")
    for path, to in links:
        files[path] = files[to]
    return files


SAMPLE_FILES: dict[str, bytes] = expected_files(SAMPLE_SPEC)


@pytest.fixture(scope="session")
def sample_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The source tree of SAMPLE_SPEC (fixed mtimes). Do not modify it."""
    return build_tree(
        tmp_path_factory.mktemp("sample") / "src", SAMPLE_SPEC, mtime_ns=FIXED_MTIME_NS
    )


@pytest.fixture(scope="session")
def sample_bundle_path(sample_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SAMPLE_SPEC packed with SAMPLE_RECORD_SIZE records. Read-only: copy it before damaging it."""
    dest = tmp_path_factory.mktemp("sample-bundle") / "sample.bundle"
    pack(str(sample_tree), str(dest), PackOptions(record_size=SAMPLE_RECORD_SIZE))
    return dest


@pytest.fixture(scope="session")
def grafted_bundle_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle of today's version of the committed bundles' tree whose shard table names shards
    of version-1 and version-2 bundles beside its own, as a merge links them in
    (``legacy_trees.graft_legacy_shards``). Read-only: copy it before damaging it."""
    from tests.support.legacy_trees import (
        SOURCE_DATE_EPOCH,
        V1_PACK_OPTIONS,
        build_v1_tree,
        graft_legacy_shards,
    )

    base = tmp_path_factory.mktemp("grafted")
    dest = base / "grafted.bundle"
    options = PackOptions(**V1_PACK_OPTIONS, created_ns=SOURCE_DATE_EPOCH * 10**9)
    pack(str(build_v1_tree(base / "src")), str(dest), options)
    graft_legacy_shards(dest)
    return dest


@pytest.fixture
def sample_bundle(sample_bundle_path: Path) -> Iterator[Bundle]:
    """A freshly opened Bundle on the sample bundle, closed after the test."""
    with Bundle(sample_bundle_path) as b:
        yield b


@pytest.fixture
def pack_tree(tmp_path: Path) -> Callable[..., Path]:
    """``pack_tree(spec_or_dir, name="b", **PackOptions fields) -> bundle path``.

    A spec is built under ``tmp_path/<name>.src`` first; an existing directory is packed as is.
    """

    def _pack(source: TreeSpec | str | os.PathLike, name: str = "b", **options) -> Path:
        if isinstance(source, dict):
            source = build_tree(tmp_path / f"{name}.src", source)
        dest = tmp_path / f"{name}.bundle"
        pack(str(source), str(dest), PackOptions(**options))
        return dest

    return _pack


# =================================================================================================
# 3. Bundle helpers
# =================================================================================================


def bundle_file_bytes(bundle_dir: str | os.PathLike) -> dict[str, bytes]:
    """relative path → bytes of every file in a bundle directory (for byte-identity checks)."""
    out = {}
    for top, _dirs, files in os.walk(bundle_dir):
        for name in files:
            path = os.path.join(top, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, bundle_dir)] = f.read()
    return out


def bundle_entries(path: str | os.PathLike) -> dict[str, tuple]:
    """path -> (mode, mtime_ns, uid, gid, nlink, size, content or link target) of every entry of
    a bundle, the root ("") included: what two bundles that must read the same are compared by
    (two packs of one source, a delta pack and a plain one)."""
    out: dict[str, tuple] = {}
    with Bundle(path) as b:
        for top, dirs, files in b.walk(""):
            for name in ([""] if not top else []) + dirs + files:
                rel = f"{top}/{name}" if top and name else top or name
                st = b.lstat(rel)
                data = b""
                if stat.S_ISREG(st.st_mode):
                    data = b.read(rel)
                elif stat.S_ISLNK(st.st_mode):
                    data = os.fsencode(b.readlink(rel))
                size = 0 if stat.S_ISDIR(st.st_mode) else st.st_size
                out[rel] = (
                    st.st_mode,
                    st.st_mtime_ns,
                    st.st_uid,
                    st.st_gid,
                    st.st_nlink,
                    size,
                    data,
                )
    return out


def flip_byte(path: str | os.PathLike, offset: int) -> None:
    """Invert every bit of one byte of a file in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        (byte,) = f.read(1)
        f.seek(offset)
        f.write(bytes([byte ^ 0xFF]))


@pytest.fixture
def copy_bundle(tmp_path: Path) -> Callable[[Path], Path]:
    """``copy_bundle(path) -> a private copy`` that a test may damage."""

    def _copy(path: Path) -> Path:
        dest = tmp_path / ("copy-" + path.name)
        shutil.copytree(path, dest, symlinks=True)
        return dest

    return _copy


# =================================================================================================
# 4. FUSE mount fixtures
# =================================================================================================
# Each mount is a daemon subprocess (see tests/support/mounting.py); every one is unmounted in
# ``finally`` and its log must be free of unexpected warnings.

from tests.support.mounting import Mount, mounted, sweep_stale_mounts  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _caches_and_logs_stay_in_the_temp_dir(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """Where bundlefs keeps things by default — remote bundles' index and record caches
    (``~/.cache/bundlefs``) and a detached daemon's log without syslog (``~/.local/state``) —
    is a temp directory for the whole run (subprocesses inherit it): tests change nothing in
    the user's home. So is Dask's ``dask-scratch-space`` (otherwise left in the system's
    temporary directory by every cluster a test starts)."""
    base = tmp_path_factory.mktemp("home-dirs")
    keys = ("BUNDLEFS_CACHE_DIR", "XDG_STATE_HOME", "DASK_TEMPORARY_DIRECTORY")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ["BUNDLEFS_CACHE_DIR"] = str(base / "cache")
    os.environ["XDG_STATE_HOME"] = str(base / "state")
    os.environ["DASK_TEMPORARY_DIRECTORY"] = str(base / "dask")
    if "dask" in sys.modules:  # imported while collecting: it read its environment then
        sys.modules["dask"].config.refresh()
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session", autouse=True)
def _sweep_stale_mounts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Clear mounts a crashed earlier run left below the pytest temp root, before and after."""
    sweep_stale_mounts(tmp_path_factory.getbasetemp().parent)
    yield
    sweep_stale_mounts(tmp_path_factory.getbasetemp(), live_too=True)


@pytest.fixture
def mount_bundle(tmp_path: Path) -> Iterator[Callable[..., Mount]]:
    """``mount_bundle(bundle, *daemon_args, allowed_log=[regex...], python_path=(dir,...))``:
    a ``Mount`` for one test."""
    with contextlib.ExitStack() as stack:
        counter = iter(range(1000))

        def _mount(
            bundle: Path,
            *args: str,
            allowed_log: list[str] = (),
            python_path: tuple[str, ...] = (),
        ) -> Mount:
            n = next(counter)
            return stack.enter_context(
                mounted(
                    bundle,
                    tmp_path / f"mnt{n}",
                    *args,
                    log_path=tmp_path / f"daemon{n}.log",
                    allowed_log=allowed_log,
                    python_path=python_path,
                )
            )

        yield _mount


@pytest.fixture(scope="module", params=["1", "4"], ids=["1-worker", "4-workers"])
def sample_mount(
    request: pytest.FixtureRequest,
    sample_bundle_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Mount]:
    """The sample bundle mounted once per test module, served by one process and by four worker
    processes (each test runs on both). Tests must not damage it."""
    work = tmp_path_factory.mktemp("sample-mount")
    with mounted(
        sample_bundle_path,
        work / "mnt",
        "--workers",
        request.param,
        log_path=work / "daemon.log",
    ) as m:
        yield m
