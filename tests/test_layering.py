"""Imports point one way: the library works where pyfuse3 and trio are not even installed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

_BLOCK_FUSE = """
import sys
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pyfuse3", "trio"):
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, _Blocker())
"""


@pytest.mark.parametrize(
    "module",
    [
        "bundlefs",
        "bundlefs.bundle",
        "bundlefs.packer",
        "bundlefs.verify",
        "bundlefs.extract",
        "bundlefs.cli",
        "bundlefs.mount",
    ],
)
def test_the_library_imports_without_pyfuse3_or_trio(module):
    code = _BLOCK_FUSE + f"import {module}\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _imported_modules(module) -> set[str]:
    tree = ast.parse(Path(module.__file__).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_format_module_imports_no_storage_or_compression_library():
    import bundlefs.format

    assert not _imported_modules(bundlefs.format) & {"lmdb", "lz4", "crc32c", "pyfuse3", "trio"}


def test_the_reader_core_never_imports_the_fuse_layer():
    import bundlefs.bundle
    import bundlefs.index
    import bundlefs.libc
    import bundlefs.packer
    import bundlefs.shards

    modules = (bundlefs.bundle, bundlefs.index, bundlefs.libc, bundlefs.packer, bundlefs.shards)
    for module in modules:
        assert not _imported_modules(module) & {"pyfuse3", "trio"}, module.__name__
