"""Which FUSE binding a mount runs on, chosen once per process, and what to say about it.

In order of preference: ``bundlefs._fuse3``, the patched pyfuse3 that bundlefs's own build
compiles where libfuse3 is found (setup.py, third_party/pyfuse3); else an installed ``pyfuse3``
(the patched build ``make install`` puts there, or a stock one from PyPI); else a ``MountError``
naming the command that installs one. A binding is "patched" when it carries our opt-in no-open
patch (``Operations.enable_no_open``), whichever module it is, else "stock": a stock binding
serves every open itself, a request round trip each, so warm reads are about 5 times slower
(docs/mount.md, "The two open paths"). Every module of the mount takes pyfuse3 from here
(``from bundlefs.mount.bindings import pyfuse3``); importing this module imports no binding.

May import: ``bundlefs.errors``, and the bindings themselves (``bundlefs._fuse3``, ``pyfuse3``).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from bundlefs.errors import MountError

if TYPE_CHECKING:
    import pyfuse3  # the interface both bindings share, for the type checker  # noqa: F401

PATCHED = "patched"
STOCK = "stock"
# Where a FUSE binding is out of reach, a user can still read a bundle: every such error says so.
WITHOUT_FUSE = "the Python API (bundlefs.Bundle) reads bundles without FUSE"
_BUILD_NEEDS = "libfuse3-dev, pkg-config and a C compiler"


@functools.cache
def load() -> ModuleType:
    """The binding this process uses, or a ``MountError`` saying how to get one."""
    found = _binding()
    # The patched binding imports trio on first use (third_party/pyfuse3/trio-lazily.patch),
    # and a mount that runs without it may still need it later (one process, load threads, the
    # open path): a missing trio is said here, before mounting, as a stock binding's own import
    # says it. find_spec looks for it without importing it.
    try:
        trio_found = importlib.util.find_spec("trio") is not None
    except (ImportError, ValueError):
        trio_found = False
    if not trio_found:
        raise _unloadable(ImportError(name="trio"))
    return found


def _binding() -> ModuleType:
    try:
        import bundlefs._fuse3 as patched

        return patched
    except ImportError as e:
        if e.name != "bundlefs._fuse3":
            # Built, but it cannot load (libfuse3 removed since): a stock pyfuse3 would fail
            # the same way, so say this.
            raise _unloadable(e) from None
    try:
        import pyfuse3 as installed
    except ImportError as e:
        if e.name != "pyfuse3":
            raise _unloadable(e) from None
        raise MountError(
            "bundlefs mount needs the FUSE bindings and pyfuse3 is not installed: "
            f"pip install 'bundlefs[mount]' builds them where {_BUILD_NEEDS} are installed "
            f"(an installed bundlefs: {fix_command()}; {WITHOUT_FUSE})"
        ) from None
    return installed


def _unloadable(e: ImportError) -> MountError:
    missing = f"{e.name} is not installed" if e.name else f"they cannot be loaded ({e})"
    return MountError(
        f"bundlefs mount needs the FUSE bindings and {missing}: "
        f"pip install 'bundlefs[mount]' ({WITHOUT_FUSE})"
    )


def __getattr__(name: str) -> ModuleType:
    # ``from bundlefs.mount.bindings import pyfuse3``: the binding, loaded on first use.
    if name == "pyfuse3":
        return load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def binding() -> str:
    """``PATCHED`` or ``STOCK``: what the stats xattr and ``info MNT`` report."""
    return PATCHED if hasattr(load().Operations, "enable_no_open") else STOCK


def stock_reason() -> str | None:
    """Why this binding cannot serve the no-open path (what it costs, the fix), or None."""
    if binding() == PATCHED:
        return None
    return (
        "stock pyfuse3, which lacks the no-open patch: every open is a round trip to this "
        "daemon, so warm reads are about 5 times slower; with "
        f"{_BUILD_NEEDS} installed, {fix_command()} builds the patched one"
    )


def fix_command() -> str:
    """The one command that rebuilds this bundlefs with the patched binding, as installed.

    A checkout installed with ``pip install DIR`` is rebuilt from DIR, an editable one (a
    developer's) by ``make install``, any other from the index; ``--no-cache-dir`` because pip
    would otherwise reuse the wheel it built when libfuse3 was missing.
    """
    pip = f"{sys.executable} -m pip install"
    source = _installed_from()
    if source is None:
        return f"{pip} --force-reinstall --no-cache-dir 'bundlefs[mount]'"
    directory, editable = source
    if editable:
        return f"make -C {directory} install"
    return f"{pip} '{directory}[mount]'"


def _installed_from() -> tuple[str, bool] | None:
    """(directory, editable) when bundlefs was installed from a local directory (PEP 610)."""
    # (The first with a record: a checkout's own bundlefs.egg-info, found first from the
    # checkout, has none.)
    from importlib import metadata  # here only: importing it costs ~40 ms of every mount's start

    texts = (d.read_text("direct_url.json") for d in metadata.distributions(name="bundlefs"))
    try:
        found = json.loads(next((t for t in texts if t), "null"))
    except ValueError:
        return None
    if not isinstance(found, dict) or "dir_info" not in found:
        return None
    from urllib.parse import unquote, urlparse  # here: only a message needs it

    url = urlparse(str(found.get("url", "")))
    if url.scheme != "file":
        return None
    return unquote(url.path), bool(found["dir_info"].get("editable"))
