"""The package users install: ``pip install .`` and its extras (issue 11, "install and first
contact"). Built as a wheel from this checkout, without network access or the venv changing."""

from __future__ import annotations

import configparser
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (path,) = out.glob("bundlefs-*.whl")
    return zipfile.ZipFile(path)


def _dist_file(wheel: zipfile.ZipFile, name: str) -> str:
    (member,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(member).decode()


def test_the_wheel_ships_py_typed_and_every_subpackage(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert "bundlefs/py.typed" in names
    for package in ("core", "storage", "read", "packing", "mount", "cli", "integrations"):
        assert f"bundlefs/{package}/__init__.py" in names


def test_the_core_install_needs_only_lmdb_lz4_and_crc32c(wheel: zipfile.ZipFile) -> None:
    metadata = _dist_file(wheel, "METADATA").splitlines()
    required = sorted(
        line.split(":", 1)[1].strip().split(">")[0].split("=")[0]
        for line in metadata
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    )
    assert required == ["crc32c", "lmdb", "lz4"]
    extras = {
        line.split(":", 1)[1].strip() for line in metadata if line.startswith("Provides-Extra")
    }
    assert {"mount", "fsspec", "torch", "zstd", "all"} <= extras


def test_the_wheel_registers_the_command_and_the_fsspec_protocol(wheel: zipfile.ZipFile) -> None:
    entry_points = configparser.ConfigParser()
    entry_points.read_string(_dist_file(wheel, "entry_points.txt"))
    assert entry_points["console_scripts"]["bundlefs"] == "bundlefs.cli:main"
    assert entry_points["fsspec.specs"]["bundle"] == "bundlefs.integrations.fsspec:BundleFileSystem"
