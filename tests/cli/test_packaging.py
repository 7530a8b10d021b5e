"""The package users install: ``pip install .`` and its extras (issue 11, "install and first
contact"). Built as a wheel from this checkout, without network access or the venv changing."""

from __future__ import annotations

import configparser
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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


# -- the patched pyfuse3 inside bundlefs's own build (setup.py, third_party/pyfuse3) ---------------

PYFUSE3_DIR = REPO / "third_party" / "pyfuse3"


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    code = f"from setuptools.build_meta import build_sdist; print(build_sdist({str(out)!r}))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return out / result.stdout.split()[-1]


def test_the_sdist_carries_the_pinned_pyfuse3_every_patch_and_the_build(sdist: Path) -> None:
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    wanted = ["setup.py", "third_party/pyfuse3/pyfuse3-3.5.0.tar.gz",
              "third_party/pyfuse3/prepare.py"]  # fmt: skip
    wanted += [f"third_party/pyfuse3/{p.name}" for p in PYFUSE3_DIR.glob("*.patch")]
    assert set(wanted) <= names


def test_every_patch_applies_to_the_pinned_sdist_in_name_order(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("prepare", PYFUSE3_DIR / "prepare.py")
    assert spec is not None and spec.loader is not None
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    assert [p.name for p in prepare.patches()] == sorted(
        p.name for p in PYFUSE3_DIR.glob("*.patch")
    )
    source = prepare.unpack(tmp_path)
    assert "enable_no_open: bool = False" in (source / "src/pyfuse3/_pyfuse3.py").read_text()
    # A patch that no longer matches its sources stops the build rather than building stock.
    broken = tmp_path / "broken.patch"
    broken.write_text("--- a/src/pyfuse3/_pyfuse3.py\n+++ b/src/pyfuse3/_pyfuse3.py\n"
                      "@@ -1,1 +1,1 @@\n-no such line\n+x\n")  # fmt: skip
    with pytest.raises(prepare.PatchError, match="does not apply"):
        prepare.apply(broken, source)


def test_without_libfuse3_the_install_skips_the_binding_and_still_succeeds(
    sdist: Path, tmp_path: Path
) -> None:
    # pkg-config searching an empty directory stands in for a machine without libfuse3-dev.
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    (clone,) = (tmp_path / "src").iterdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PKG_CONFIG_LIBDIR"] = str(tmp_path / "no-pkgconfig")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path), "."],
        cwd=clone, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "not building bundlefs._fuse3, the patched pyfuse3 (pkg-config finds no" in (
        result.stdout + result.stderr
    )
    (wheel,) = tmp_path.glob("bundlefs-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "bundlefs/mount/bindings.py" in names
    assert not [n for n in names if n.startswith("bundlefs/_fuse3/")]


def _has_libfuse3() -> bool:
    found = subprocess.run(["pkg-config", "--exists", "fuse3"], capture_output=True)
    return found.returncode == 0 and shutil.which("cc") is not None


@pytest.mark.slow
@pytest.mark.mount
@pytest.mark.skipif(not _has_libfuse3(), reason="needs libfuse3-dev, pkg-config and a compiler")
def test_pip_install_mount_in_a_fresh_venv_mounts_on_the_patched_binding(
    sdist: Path, tmp_path: Path
) -> None:
    from bundlefs import pack
    from tests.conftest import build_tree
    from tests.support.mounting import Mount, is_mounted, stop_mount, wait_until

    # A clone's tree, as the sdist carries it (built elsewhere: never in this checkout's build/).
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    (clone,) = (tmp_path / "src").iterdir()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", ".[mount]"],
        cwd=clone, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # One binding compiled, ours: the extra no longer builds PyPI's stock pyfuse3 beside it.
    python = str(venv / "bin/python")
    probe = "import importlib.util as u; print(u.find_spec('pyfuse3') is None)"
    assert subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True,
                          cwd=tmp_path, timeout=60).stdout.strip() == "True"  # fmt: skip

    bundle = tmp_path / "b.bundle"
    pack(str(build_tree(tmp_path / "tree", {"hello.txt": b"hello\n"})), str(bundle))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log_path = tmp_path / "daemon.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(venv / "bin/bundlefs"), "mount", "--foreground", str(bundle), str(mnt)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=tmp_path,
            start_new_session=True,
        )  # fmt: skip
    mount = Mount(bundle, mnt, process, log_path)
    try:
        assert wait_until(lambda: is_mounted(mnt) or process.poll() is not None, timeout=60)
        assert (mnt / "hello.txt").read_bytes() == b"hello\n", mount.log_text()
        info = subprocess.run(
            [str(venv / "bin/bundlefs"), "info", str(mnt)],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert info.returncode == 0, info.stderr
        lines = info.stdout.splitlines()
        (binding,) = [line for line in lines if line.split()[:2] == ["daemon", "binding"]]
        assert binding.split()[-1] == "patched", info.stdout
        assert re.search(r"^daemon open mode +no-open$", info.stdout, re.M), info.stdout
        print(binding)  # (-s shows the line)
    finally:
        stop_mount(mount)
    assert not is_mounted(mnt)
