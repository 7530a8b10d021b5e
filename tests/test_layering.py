"""Imports point one way, and the folder layout is the architecture (docs/architecture.md).

Layers, bottom first: ``errors`` → ``core`` → ``storage`` → ``read`` | ``packing`` → the public
face (``bundlefs/__init__.py``) → ``mount`` → ``cli`` → ``demo`` and ``__main__``. A module imports
only from its own package or from a lower layer; ``read`` and ``packing`` are siblings that never
import each other.
The library works where pyfuse3 and trio are not even installed.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import bundlefs

PACKAGE = Path(bundlefs.__file__).parent

# package (below bundlefs) -> layer; a module may import a package whose layer is lower, or its own.
LAYERS = {
    "errors": 0,
    "_fuse3": 0,  # the patched pyfuse3 setup.py compiles (no source here; imports nothing of ours)
    "core": 1,
    "storage": 2,
    "read": 3,
    "packing": 3,
    "__init__": 4,  # the library's public face: Bundle, pack, the errors
    "mount": 5,
    "integrations": 5,  # fsspec, torch: adapters over the public face, beside the FUSE adapter
    "cli": 6,
    "demo": 7,
    "__main__": 7,
}

_BLOCK_FUSE = """
import sys
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pyfuse3", "trio"):
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, _Blocker())
"""


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _package_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module name, at module level) for every import in ``path``."""
    tree = ast.parse(path.read_text())
    top_level = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: use absolute imports (from bundlefs.x import y)"
            found.append((node.module or "", id(node) in top_level))
    return found


def _bundlefs_package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "bundlefs":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_imports_only_its_own_layer_or_below(path):
    own = _package_of(path)
    assert own in LAYERS, f"{path}: add its package to LAYERS and docs/architecture.md"
    for module, _ in _imports(path):
        target = _bundlefs_package(module)
        if target is None or target == own:
            continue
        assert LAYERS[target] < LAYERS[own], f"{path.name} ({own}) imports {module}"


@pytest.mark.parametrize(
    "module",
    [
        "bundlefs",
        "bundlefs.read.bundle",
        "bundlefs.read.verify",
        "bundlefs.read.extract",
        "bundlefs.packing.packer",
        "bundlefs.cli",
        "bundlefs.mount.daemon",
        "bundlefs.mount.table",
    ],
)
def test_the_library_imports_without_pyfuse3_or_trio(module):
    code = _BLOCK_FUSE + f"import {module}\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_format_layer_imports_no_storage_or_compression_library():
    for path in (PACKAGE / "core").glob("*.py"):
        if path.name in ("checksum.py",):
            continue  # the CRC32C binding is what this module wraps
        names = {module.split(".")[0] for module, _ in _imports(path)}
        assert not names & {"lmdb", "lz4", "crc32c", "pyfuse3", "trio"}, path.name


def test_only_the_mount_package_imports_pyfuse3_or_trio():
    for path in _modules():
        if _package_of(path) == "mount":
            continue
        for module, _ in _imports(path):
            assert module.split(".")[0] not in ("pyfuse3", "trio"), f"{path} imports {module}"
            assert not module.startswith("bundlefs._fuse3"), f"{path} imports {module}"


def test_only_the_storage_layer_imports_lmdb():
    for path in _modules():
        if _package_of(path) == "storage":
            continue
        for module, _ in _imports(path):
            assert module.split(".")[0] != "lmdb", f"{path} imports lmdb"


def test_only_storage_and_integrations_import_fsspec_or_its_back_ends():
    # Object storage is the storage layer's business (and fsspec's own protocol, the
    # integration's): the read path above sees only a ShardStore.
    for path in _modules():
        if _package_of(path) in ("storage", "integrations"):
            continue
        for module, _ in _imports(path):
            top = module.split(".")[0]
            assert top not in ("fsspec", "s3fs", "botocore", "aiobotocore"), f"{path}: {module}"


def test_only_the_integrations_import_dask_or_distributed():
    # Distributed packing is an optional extra: the packer's partitions (packing/partition.py)
    # know nothing of Dask; integrations/dask.py runs them on a cluster.
    for path in _modules():
        if _package_of(path) == "integrations":
            continue
        for module, _ in _imports(path):
            assert module.split(".")[0] not in ("dask", "distributed"), f"{path}: {module}"


_BLOCK_DASK = """
import sys
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("dask", "distributed"):
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, _Blocker())
"""


@pytest.mark.parametrize(
    "module", ["bundlefs.packing.partition", "bundlefs.packing.merge", "bundlefs.cli"]
)
def test_the_packer_and_the_cli_import_without_dask(module):
    result = subprocess.run(
        [sys.executable, "-c", _BLOCK_DASK + f"import {module}\n"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_says_what_it_owns_and_what_it_may_import(path):
    docstring = ast.get_docstring(ast.parse(path.read_text()))
    assert docstring, f"{path}: a module docstring says what the module owns"
    if path.name != "__init__.py" or path.parent == PACKAGE:
        assert "May import:" in docstring, f"{path}: say what it may import"


_ORDER_HEADING = "Modules, bottom first"
_ORDER_ITEM = re.compile(r"^- ``(\w+)``", re.MULTILINE)


def _packages_with_an_order() -> list[Path]:
    return [
        p.parent
        for p in sorted(PACKAGE.glob("*/__init__.py"))
        if _ORDER_HEADING in (ast.get_docstring(ast.parse(p.read_text())) or "")
    ]


@pytest.mark.parametrize(
    "package", _packages_with_an_order(), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_modules_of_a_package_import_in_the_order_its_docstring_gives(package):
    # Inside a package too imports point one way: a module imports only modules listed before it
    # in the package's docstring, counting imports inside functions and under TYPE_CHECKING.
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    order = _ORDER_ITEM.findall(docstring.split(_ORDER_HEADING, 1)[1])
    modules = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    assert sorted(order) == modules, f"{package.name}/__init__.py lists every module, once"
    for position, name in enumerate(order):
        below = set(order[:position])
        for target in _siblings_imported(package / f"{name}.py"):
            assert target in below, f"{name} imports {target}, which is not below it"


def _siblings_imported(path: Path) -> set[str]:
    """The modules of ``path``'s own package it imports, wherever the import statement is."""
    package = f"bundlefs.{path.parent.name}"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == package:
            names = [f"{package}.{alias.name}" for alias in node.names]  # from pkg import module
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        found |= {
            n.removeprefix(f"{package}.").split(".")[0]
            for n in names
            if n.startswith(f"{package}.")
        }
    return found
