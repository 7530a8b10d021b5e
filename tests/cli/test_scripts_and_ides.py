"""Scripts and IDEs (issue 22): the public API is typed for type checkers, documented where
Python users look (``help``, ``dir``), and the command line completes in bash, zsh and fish.

mypy runs from the checkout (as an IDE does on a project) with a small configuration of its own:
imported packages are analysed silently, so only the snippets' own errors count.
"""

from __future__ import annotations

import inspect
import pydoc
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import bundlefs
from bundlefs.read.paths import BundleDirEntry
from tests.support.trees import run_cli

ROOT = Path(__file__).resolve().parents[2]

_MYPY_CONFIG = """\
[mypy]
python_version = 3.11
follow_imports = silent
# The README's snippets use names a reader supplies (a transform, an epoch count).
disable_error_code = name-defined
[mypy-torch.*,torchvision.*,pandas.*,pyarrow.*,numpy.*,fsspec.*,lmdb.*,lz4.*,crc32c.*]
follow_imports = skip
ignore_missing_imports = True
"""


def _mypy(tmp_path: Path, *files: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    config = tmp_path / "mypy.ini"
    config.write_text(_MYPY_CONFIG)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir",
         str(tmp_path / "mypy-cache"), "--python-executable", sys.executable, *map(str, files)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )  # fmt: skip


def test_the_readmes_python_examples_type_check(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert any("bundlefs.pack(" in block for block in blocks)
    files = []
    for i, block in enumerate(blocks):
        files.append(tmp_path / f"readme_{i}.py")
        files[-1].write_text(block)
    result = _mypy(tmp_path, *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_script_outside_the_checkout_finds_the_installed_bundlefs(tmp_path):
    # From anywhere but the checkout, a type checker finds bundlefs only through the install:
    # the dev install is path-based (Makefile: editable_mode=compat), which mypy and pyright
    # follow, not setuptools' default import hook, which neither can.
    assert ROOT not in tmp_path.resolve().parents
    script = tmp_path / "example.py"
    script.write_text(
        "import bundlefs\n"
        "summary = bundlefs.pack('tree', 'out.bundle', bundlefs.PackOptions())\n"
        "with bundlefs.Bundle('out.bundle') as bundle:\n"
        "    names: list[str] = bundle.listdir('/')\n"
    )
    result = _mypy(tmp_path, script, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_type_checkers_see_pack_packoptions_listdir_and_walk_as_they_are(tmp_path):
    snippet = tmp_path / "api_types.py"
    snippet.write_text(
        "import bundlefs\n"
        "reveal_type(bundlefs.pack)\n"
        "reveal_type(bundlefs.PackOptions(jobs=2))\n"
        "b = bundlefs.Bundle('x')\n"
        "reveal_type(b.listdir('d'))\n"
        "reveal_type(b.listdir(b'd'))\n"
        "for top, dirs, files in b.walk('d'):\n"
        "    reveal_type(top)\n"
        "    reveal_type(files)\n"
        "for entry in b.scandir(b'd'):\n"
        "    reveal_type(entry.name)\n"
        "reveal_type(b.readlink('l'))\n"
        "reveal_type(b.tree)\n"
    )
    result = _mypy(tmp_path, snippet)
    revealed = re.findall(r'Revealed type is "(.*)"', result.stdout)
    assert result.returncode == 0, result.stdout
    assert revealed[0].startswith("def (source: ") and "PackSummary" in revealed[0]
    assert revealed[1:] == [
        "bundlefs.packing.options.PackOptions",
        "list[str]",
        "list[bytes]",
        "str",
        "list[str]",
        "bytes",
        "str",
        "bundlefs.read.tree.TreeModel",
    ]


def test_every_public_method_of_the_api_has_a_docstring():
    missing = []
    for cls in (bundlefs.Bundle, bundlefs.BundleFile, bundlefs.BundleStat, BundleDirEntry):
        for name, member in vars(cls).items():
            if name.startswith("_") or not (callable(member) or isinstance(member, property)):
                continue
            if not inspect.getdoc(member):
                missing.append(f"{cls.__name__}.{name}")
    assert missing == []


def test_tree_and_content_are_visible_to_help_and_dir():
    names = dir(bundlefs.Bundle)
    assert {"tree", "content", "root"} <= set(names)
    text = pydoc.render_doc(bundlefs.Bundle, renderer=pydoc.plaintext)
    assert "tree\n" in text and "The tree by inode" in text
    assert "content\n" in text and "File bytes by entry" in text
    assert {"pack", "PackOptions"} <= set(dir(bundlefs))


# -- shell completion ---------------------------------------------------------------------------


def _bash_completes(script: str, *words: str) -> list[str]:
    """What ``_bundlefs`` offers for the command line ``words`` (the last is being typed)."""
    program = (
        f"{script}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        '_bundlefs; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_bash_completion_offers_commands_options_and_choices():
    script = run_cli("completion", "bash").stdout.decode()
    assert _bash_completes(script, "bundlefs", "me") == ["merge"]
    assert _bash_completes(script, "bundlefs", "pack", "--compr") == ["--compression"]
    assert "zstd" in _bash_completes(script, "bundlefs", "pack", "src", "--compression", "")
    assert _bash_completes(script, "bundlefs", "merge", "a", "--on-clash", "l") == ["last"]
    assert "-0" in _bash_completes(script, "bundlefs", "ls", "-")
    assert _bash_completes(script, "bundlefs", "completion", "") == ["bash", "zsh", "fish"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_completion_scripts_name_every_command(shell):
    result = run_cli("completion", shell)
    assert result.returncode == 0
    text = result.stdout.decode()
    for command in ("pack", "merge", "ls", "mount", "umount", "gc", "completion"):
        assert command in text
    if shutil.which(shell):
        check = subprocess.run([shell, "-n"], input=result.stdout, capture_output=True)
        assert check.returncode == 0, check.stderr


def test_an_unknown_shell_is_a_usage_error():
    assert run_cli("completion", "tcsh").returncode == 2
