"""The tree contract (tests/support/tree_contract.py) for every way of reading a bundle.

One rich source tree is packed once; ``TestBundleApi`` reads it through ``Bundle``'s path API and
``TestMount`` through a real FUSE mount with ``os`` calls, on each open path. Both must report the
source tree's facts exactly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bundlefs import Bundle, PackOptions, pack
from bundlefs.mount.kernel import no_open_unavailable
from tests.conftest import FIXED_MTIME_NS, SAMPLE_SPEC, build_tree, pseudo_random_bytes
from tests.support.mounting import mounted
from tests.support.tree_contract import RECORD_SIZE, TreeContract, dir_entry_kinds
from tests.support.trees import MTIME_NS, build_rich_tree

# =================================================================================================
# The source tree and its bundle
# =================================================================================================

ODD_NAMES = {
    b"with space": b"space\n",
    b"new\nline": b"a newline in the name\n",
    b"tab\there": b"tab\n",
    b"-starts-with-dash": b"dash\n",
    b".hidden": b"hidden\n",
    b"latin1-\xe9t\xe9": b"not UTF-8\n",
    b"n" * 255: b"the longest name\n",
}
DEEP_LEVELS = 24
WIDE_COUNT = 300  # enough names that a listing takes several READDIR requests through the kernel


def build_contract_tree(root: Path) -> Path:
    """build_rich_tree, SAMPLE_SPEC below ``sample/``, odd names, a deep path, a wide directory."""
    build_rich_tree(root)
    build_tree(root / "sample", SAMPLE_SPEC, mtime_ns=FIXED_MTIME_NS)
    build_tree(root / "odd names", ODD_NAMES)
    deep = root.joinpath("deep", *(f"level{i:02d}" for i in range(DEEP_LEVELS)))
    deep.mkdir(parents=True)
    (deep / "leaf.bin").write_bytes(pseudo_random_bytes(3 * RECORD_SIZE + 5, seed=7))
    wide = root / "wide"
    wide.mkdir()
    for i in range(WIDE_COUNT):
        (wide / f"entry-{i:04d}-{'w' * 40}.dat").write_bytes(b"%d\n" % i)
    os.utime(root, ns=(MTIME_NS, MTIME_NS))
    return root


@pytest.fixture(scope="module")
def tree_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The contract's source tree (the contract's ``tree_source``). Do not modify it."""
    return build_contract_tree(tmp_path_factory.mktemp("contract") / "src")


@pytest.fixture(scope="module")
def contract_bundle(tree_source: Path) -> Path:
    dest = tree_source.parent / "contract.bundle"
    pack(str(tree_source), str(dest), PackOptions(record_size=RECORD_SIZE))
    return dest


# =================================================================================================
# The Bundle path API
# =================================================================================================


class BundleView:
    """The contract's view through ``Bundle``: stat, lstat, listdir, scandir, readlink, read,
    open (seek + read) and walk, all given bytes paths."""

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle

    def listdir(self, rel):
        return self.bundle.listdir(rel)

    def scandir(self, rel):
        return {e.name: dir_entry_kinds(e) for e in self.bundle.scandir(rel)}

    def stat(self, rel):
        return self.bundle.stat(rel)

    def lstat(self, rel):
        return self.bundle.lstat(rel)

    def readlink(self, rel):
        return self.bundle.readlink(rel)

    def read(self, rel):
        return self.bundle.read(rel)

    def read_at(self, rel, offset, size):
        with self.bundle.open(rel) as f:
            f.seek(offset)
            return f.read(size)

    def walk(self):
        return list(self.bundle.walk(b""))


class TestBundleApi(TreeContract):
    @pytest.fixture(scope="class")
    @classmethod
    def tree_view(cls, contract_bundle: Path) -> Iterator[BundleView]:
        with Bundle(contract_bundle) as bundle:
            yield BundleView(bundle)


# =================================================================================================
# A FUSE mount, read with os calls
# =================================================================================================


class MountView:
    """The contract's view through a mount point, with the functions any program would call."""

    def __init__(self, mountpoint: Path) -> None:
        self.root = os.fsencode(mountpoint)

    def _path(self, rel: bytes) -> bytes:
        return os.path.join(self.root, rel) if rel else self.root

    def listdir(self, rel):
        return os.listdir(self._path(rel))

    def scandir(self, rel):
        with os.scandir(self._path(rel)) as it:
            return {e.name: dir_entry_kinds(e) for e in it}

    def stat(self, rel):
        return os.stat(self._path(rel))

    def lstat(self, rel):
        return os.lstat(self._path(rel))

    def readlink(self, rel):
        return os.readlink(self._path(rel))

    def read(self, rel):
        with open(self._path(rel), "rb") as f:
            return f.read()

    def read_at(self, rel, offset, size):
        with open(self._path(rel), "rb") as f:
            f.seek(offset)
            return f.read(size)

    def walk(self):
        out = []
        for top, dirs, files in os.walk(self.root):
            rel = os.path.relpath(top, self.root)
            out.append((b"" if rel == b"." else rel, dirs, files))
        return out


_NO_OPEN = pytest.mark.skipif(
    no_open_unavailable() is not None, reason="pyfuse3 lacks the no-open patch"
)
# Each open path, and the no-open path served by one process and by four worker processes.
SERVING = [
    pytest.param(("no-open", "1"), marks=_NO_OPEN, id="no-open-1-worker"),
    pytest.param(("no-open", "4"), marks=_NO_OPEN, id="no-open-4-workers"),
    pytest.param(("open", "1"), id="open"),
]


@pytest.mark.mount
class TestMount(TreeContract):
    @pytest.fixture(scope="class", params=SERVING)
    @classmethod
    def tree_view(
        cls, request, contract_bundle: Path, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[MountView]:
        # One mount per way of serving, unmounted (and its log checked) after the class's tests.
        open_mode, workers = request.param
        work = tmp_path_factory.mktemp(f"contract-mount-{open_mode}-{workers}")
        with mounted(
            contract_bundle,
            work / "mnt",
            "--open-mode",
            open_mode,
            "--workers",
            workers,
            log_path=work / "daemon.log",
        ) as m:
            yield MountView(m.mountpoint)
