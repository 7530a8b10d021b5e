"""bundlefs's build: the package (declared in pyproject.toml) plus, where libfuse3 is found, the
patched pyfuse3 as the private extension ``bundlefs._fuse3``.

Why here: pyfuse3 has no wheels, so ``pip install 'bundlefs[mount]'`` compiles a binding anyway;
compiling ours (third_party/pyfuse3: the pinned 3.5.0 sdist, hash-checked, with every ``*.patch``
applied in name order) instead of PyPI's stock one gives pip users the fast no-open path at the
same cost, with no second distribution to publish and no name clash with a ``pyfuse3`` the user
may also have. The extension is optional: without libfuse3's headers, pkg-config, Cython or a C
compiler it is skipped and the core install (Bundle, pack, the CLI) still works.

Beside it, ``bundlefs.storage._native`` (bundlefs/storage/_native.pyx): the index steps every cold
FUSE request makes, in C. Also optional (without Cython or a compiler, the pure-Python path
serves, slower), and built in an editable install too (in place: its name is no ``.py`` file's,
and ``bundlefs.storage.native`` refuses a build whose source hash is not the ``.pyx``'s).
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _load_prepare() -> ModuleType:
    """third_party/pyfuse3/prepare.py, by path (its name must not meet another ``prepare``)."""
    spec = importlib.util.spec_from_file_location(
        "bundlefs_pyfuse3_prepare", HERE / "third_party" / "pyfuse3" / "prepare.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prepare = _load_prepare()

FUSE3 = "bundlefs._fuse3"
NATIVE = "bundlefs.storage._native"
NATIVE_SOURCE = "bundlefs/storage/_native.pyx"
# pyfuse3's pure-Python half and its type information, installed beside the compiled module.
_COMPANIONS = ("_pyfuse3.py", "__init__.pyi", "py.typed")


def _pkg_config(*flags: str) -> list[str] | None:
    try:
        out = subprocess.run(
            ["pkg-config", *flags, "fuse3"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.split()


class BuildExt(build_ext):
    """Builds ``bundlefs._fuse3`` from the patched sources, or says in one line why not."""

    def build_extension(self, ext: Extension) -> None:
        if ext.name == NATIVE:
            return self._build_native(ext)
        if ext.name != f"{FUSE3}.__init__":
            return super().build_extension(ext)
        reason = self._unbuildable()
        if reason:
            self.warn(
                f"not building {FUSE3}, the patched pyfuse3 ({reason}); `bundlefs mount` will "
                "need a stock pyfuse3 and serve every open itself (third_party/pyfuse3/README.md)"
            )
            return None
        work = Path(self.build_temp) / "fuse3"
        shutil.rmtree(work, ignore_errors=True)
        source = prepare.unpack(work / "sdist")
        # Cython resolves pyfuse3's relative cimports (".macros") through the package path, so
        # the sources sit where bundlefs._fuse3 would.
        package = work / "tree" / "bundlefs" / "_fuse3"
        shutil.copytree(source / "src" / "pyfuse3", package)
        (package.parent / "__init__.py").touch()
        from Cython.Build import cythonize

        (built,) = cythonize(
            [Extension(ext.name, [str(package / "__init__.pyx")])],
            include_path=[str(work / "tree"), str(source / "Include")],
            build_dir=str(work / "c"),
            quiet=True,
        )
        ext.sources = built.sources
        ext.include_dirs = [str(package), str(source / "Include")]
        ext.extra_compile_args = [*(_pkg_config("--cflags") or []), "-DFUSE_USE_VERSION=32"]
        ext.extra_link_args = [*(_pkg_config("--libs") or []), "-lpthread", "-lrt"]
        super().build_extension(ext)
        # Only after a successful compile: a skipped or failed one leaves no half package.
        target = Path(self.get_ext_fullpath(ext.name)).parent
        for name in _COMPANIONS:
            shutil.copy2(package / name, target / name)
        shutil.copy2(source / "LICENSE", target / "LICENSE")
        return None

    def _build_native(self, ext: Extension) -> None:
        try:
            from Cython.Build import cythonize
        except ImportError:
            self.warn(
                f"not building {NATIVE} (Cython is not installed): the pure-Python path serves"
            )
            return None
        digest = hashlib.sha256((HERE / NATIVE_SOURCE).read_bytes()).hexdigest()
        try:
            (built,) = cythonize(
                [Extension(NATIVE, [NATIVE_SOURCE])],
                build_dir=str(Path(self.build_temp) / "native"),
                quiet=True,
            )
        except Exception as e:  # a Cython that cannot compile it: the Python path serves
            self.warn(f"not building {NATIVE} ({e}): the pure-Python path serves")
            return None
        ext.sources = built.sources
        ext.define_macros = [("BUNDLEFS_NATIVE_SHA256", f'"{digest}"')]
        ext.extra_compile_args = ["-O2"]
        return super().build_extension(ext)

    def _unbuildable(self) -> str | None:
        if self.inplace or getattr(self, "editable_mode", False):
            return "an editable install: make install builds pyfuse3 itself"
        if _pkg_config("--exists", "--atleast-version=3.2.0") is None:
            return "pkg-config finds no libfuse3 3.2 or later: install libfuse3-dev and pkg-config"
        try:
            import Cython  # noqa: F401
        except ImportError:
            return "Cython is not installed (a build with --no-build-isolation needs it)"
        return None


setup(
    ext_modules=[
        Extension(f"{FUSE3}.__init__", ["third_party/pyfuse3/pyfuse3-3.5.0.tar.gz"], optional=True),
        Extension(NATIVE, [NATIVE_SOURCE], optional=True),
    ],
    cmdclass={"build_ext": BuildExt},
)
