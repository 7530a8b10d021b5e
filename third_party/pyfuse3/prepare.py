"""Unpack the vendored pyfuse3 sdist, check it, and apply every patch beside this file.

The one place that turns ``pyfuse3-3.5.0.tar.gz`` (pristine, SHA-256 pinned) plus ``*.patch`` (in
sorted order) into patched pyfuse3 sources. Both builds use it: bundlefs's own ``setup.py`` (the
private extension ``bundlefs._fuse3`` that ``pip install 'bundlefs[mount]'`` builds) and
``install.sh`` (``make install``'s top-level ``pyfuse3``). Standard library only, no network, and
no ``patch`` program: a pip user may have a compiler but not ``patch``, so hunks are applied here,
strictly (every context and removed line must match; only the position may shift).

    python3 prepare.py DEST               # prints the patched source directory, DEST/pyfuse3-3.5.0
    python3 prepare.py --local-version    # 3.5.0+bundlefs.ID, ID naming the patch set

May import: the standard library.
"""

from __future__ import annotations

import hashlib
import re
import sys
import tarfile
from pathlib import Path

VERSION = "3.5.0"
SDIST_SHA256 = "88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24"
HERE = Path(__file__).resolve().parent
SDIST = HERE / f"pyfuse3-{VERSION}.tar.gz"


class PatchError(Exception):
    """The sdist or a patch is not what this directory promises (a bug here, never the user's)."""


def patches() -> list[Path]:
    """Every patch, in the order applied: file name order (``10-….patch`` before ``20-….patch``)."""
    return sorted(HERE.glob("*.patch"))


def patch_set_id() -> str:
    """Eight hex digits naming the patch set: the build's local version is ``3.5.0+bundlefs.ID``."""
    digest = hashlib.sha256()
    for path in patches():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:8]


def local_version() -> str:
    return f"{VERSION}+bundlefs.{patch_set_id()}"


def unpack(dest: Path) -> Path:
    """Check the sdist's hash, unpack it under ``dest``, patch it; returns the source directory."""
    data = SDIST.read_bytes()
    if hashlib.sha256(data).hexdigest() != SDIST_SHA256:
        raise PatchError(f"{SDIST.name} does not match its pinned SHA-256: refusing to build it")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(SDIST) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later: refuse links out of dest
            tar.extractall(dest, filter="data")
        else:
            tar.extractall(dest)  # noqa: S202 - our own pinned, hash-checked archive
    root = dest / f"pyfuse3-{VERSION}"
    for path in patches():
        apply(path, root)
    return root


_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def apply(patch: Path, root: Path) -> None:
    """Apply a unified diff (``patch -p1`` style) to the tree at ``root``, strictly."""
    lines = patch.read_text().splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if not (
            lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
        ):
            i += 1
            continue
        target = lines[i + 1][4:].split("\t")[0].strip()
        name = target.split("/", 1)[1] if "/" in target else target  # -p1
        i += 2
        hunks: list[tuple[int, list[str], list[str]]] = []
        while i < len(lines) and (m := _HUNK.match(lines[i])):
            old_len = int(m.group(2) or "1")
            new_len = int(m.group(4) or "1")
            old: list[str] = []
            new: list[str] = []
            i += 1
            while (len(old) < old_len or len(new) < new_len) and i < len(lines):
                line = lines[i]
                tag, text = line[:1], line[1:]
                if tag == "\\":  # "\ No newline at end of file": the previous line has none
                    i += 1
                    continue
                if line == "\n":  # an empty context line whose space an editor stripped
                    tag, text = " ", "\n"
                if tag == " ":
                    old.append(text)
                    new.append(text)
                elif tag == "-":
                    old.append(text)
                elif tag == "+":
                    new.append(text)
                else:
                    raise PatchError(f"{patch.name}: unexpected line in a hunk: {line!r}")
                i += 1
            while i < len(lines) and lines[i].startswith("\\"):
                i += 1
            hunks.append((int(m.group(1)), old, new))
        _apply_hunks(patch.name, root / name, hunks)


def _apply_hunks(patch: str, path: Path, hunks: list[tuple[int, list[str], list[str]]]) -> None:
    text = path.read_text().splitlines(keepends=True) if path.exists() else []
    shift = 0  # lines added so far by earlier hunks of this file
    for start, old, new in hunks:
        expected = max(start - 1, 0) + shift
        at = _find(text, old, expected)
        if at is None:
            raise PatchError(f"{patch} does not apply to {path.name} near line {start}")
        text[at : at + len(old)] = new
        shift += len(new) - len(old)
    path.write_text("".join(text))


def _find(text: list[str], block: list[str], expected: int) -> int | None:
    """Where ``block`` occurs exactly, nearest to ``expected`` (a shifted hunk still applies)."""
    for offset in range(len(text) + 1):
        for at in (expected - offset, expected + offset):
            if 0 <= at <= len(text) - len(block) and text[at : at + len(block)] == block:
                return at
    return None


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: prepare.py DEST | --local-version")
    if sys.argv[1] == "--local-version":
        print(local_version())
        sys.exit(0)
    try:
        print(unpack(Path(sys.argv[1])))
    except PatchError as e:
        sys.exit(str(e))
