"""``make demo`` (``python -m bundlefs.demo``): pack a sample tree and show every CLI command on it.

It owns the demo transcript only. It builds a deterministic sample tree in ``./demo/src`` (a few
hundred small files over nested directories, text and random bytes, a symlink, a hard link and an
empty directory), then runs the real CLI as a user would (``python -m bundlefs …`` in a
subprocess), printing each command before its output. Re-running replaces ``./demo``.

``main()`` runs ``STEPS`` in order; each step is a function of the ``Demo`` paths. The demo
ends by mounting the bundle, comparing the mount with the source and unmounting it.

May import: anything below it (it runs the CLI as a user would).
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

# Fixed mtimes keep the sample tree — and so the bundle — identical from run to run.
_MTIME_NS = 1_700_000_000_000_000_000
_WORDS = (
    "bundle", "shard", "record", "index", "inode", "entry", "lz4", "crc", "lmdb", "fuse", "mount",
    "read", "seek", "file", "tree", "directory", "symlink", "hard", "link", "block", "byte",
    "offset", "cache", "verify", "extract", "pack",
)  # fmt: skip


@dataclass(frozen=True)
class Demo:
    root: str = "demo"

    @property
    def src(self) -> str:
        return os.path.join(self.root, "src")

    @property
    def bundle(self) -> str:
        return os.path.join(self.root, "sample.bundle")

    @property
    def out(self) -> str:
        return os.path.join(self.root, "out")

    @property
    def mountpoint(self) -> str:
        return os.path.join(self.root, "mnt")


def build_sample_tree(root: str, *, seed: int = 2024) -> int:
    """Create the sample tree under ``root`` (which must not exist); returns the file count."""
    rng = random.Random(seed)
    count = 0
    for split in ("train", "val"):
        for c in range(6 if split == "train" else 2):
            directory = os.path.join(root, split, f"class_{c:02d}")
            os.makedirs(directory)
            for i in range(40 if split == "train" else 20):
                name = os.path.join(directory, f"sample_{i:04d}")
                if i % 3 == 0:
                    text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(10, 400)))
                    _write(name + ".txt", text.encode() + b"\n")
                else:
                    _write(name + ".bin", rng.randbytes(rng.randint(0, 8192)))
                count += 1
    docs = os.path.join(root, "docs", "notes", "deep", "deeper")
    os.makedirs(docs)
    _write(os.path.join(root, "README.txt"), b"A sample tree packed by `make demo`.\n")
    _write(os.path.join(docs, "bottom.txt"), b"the deepest file\n")
    _write(os.path.join(root, "docs", "zeros.bin"), bytes(300_000))
    count += 3
    os.makedirs(os.path.join(root, "empty"))
    os.symlink("README.txt", os.path.join(root, "latest"))
    os.link(os.path.join(root, "README.txt"), os.path.join(root, "docs", "README-again.txt"))
    _fix_mtimes(root)
    return count


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _fix_mtimes(root: str) -> None:
    for top, dirs, files in os.walk(root, topdown=False):
        for name in files + dirs:
            os.utime(os.path.join(top, name), ns=(_MTIME_NS, _MTIME_NS), follow_symlinks=False)
    os.utime(root, ns=(_MTIME_NS, _MTIME_NS))


def run(*argv: str) -> subprocess.CompletedProcess:
    """Print a command as a transcript line, run it, and stop the demo if it fails."""
    print(f"\n$ {shlex.join(argv)}", flush=True)
    command = list(argv)
    if command[0] == "bundlefs":
        command[:1] = [sys.executable, "-m", "bundlefs"]
    result = subprocess.run(command)
    if result.returncode != 0:
        raise SystemExit(f"demo: `{shlex.join(argv)}` failed with status {result.returncode}")
    return result


# -- the steps ------------------------------------------------------------------------------------


def step_build(d: Demo) -> None:
    from bundlefs.mount.table import is_mountpoint

    if is_mountpoint(d.mountpoint):  # left by an interrupted earlier demo
        run("bundlefs", "umount", "--lazy", d.mountpoint)
    if os.path.lexists(d.root):
        shutil.rmtree(d.root)
    os.makedirs(d.root)
    files = build_sample_tree(d.src)
    print(f"built a sample tree of {files} files in {d.src}/")


def step_pack(d: Demo) -> None:
    run("bundlefs", "pack", d.src, d.bundle)


def step_info(d: Demo) -> None:
    run("bundlefs", "info", d.bundle)


def step_ls(d: Demo) -> None:
    run("bundlefs", "ls", "-l", d.bundle)
    run("bundlefs", "ls", "-l", d.bundle, "docs")


def step_cat(d: Demo) -> None:
    run("bundlefs", "cat", d.bundle, "README.txt")


def step_verify(d: Demo) -> None:
    run("bundlefs", "verify", d.bundle)


def step_extract(d: Demo) -> None:
    run("bundlefs", "extract", d.bundle, d.out)
    run("diff", "-r", "--no-dereference", d.src, d.out)
    print("(no differences: the extracted tree is identical to the source)")


def step_mount(d: Demo) -> None:
    """Serve the bundle as a read-only tree, look at it with ordinary tools, unmount."""
    os.makedirs(d.mountpoint, exist_ok=True)
    # The daemon's log stays in the demo directory (without --log-file, where no syslog
    # listens, it would go under the user's ~/.local/state).
    log_file = os.path.join(os.path.dirname(d.mountpoint), "daemon.log")
    run("bundlefs", "mount", "--log-file", log_file, d.bundle, d.mountpoint)
    try:
        run("ls", "-l", d.mountpoint)
        run("find", d.mountpoint, "-maxdepth", "2", "-type", "d")
        run("diff", "-r", "--no-dereference", d.src, d.mountpoint)
        print("(no differences: the mounted bundle is identical to the source)")
        # The daemon's side: its binding and open path, and the requests the reads above cost it.
        run("bundlefs", "info", d.mountpoint)
        print(
            "(daemon binding: 'patched' is pyfuse3 with our patches, which make install and "
            "pip install '.[mount]' both build; on 'stock' every open is a round trip to the "
            "daemon and warm reads are about 5x slower, and the daemon's first log line says how "
            "to fix it)"
        )
    finally:
        run("bundlefs", "umount", d.mountpoint)


STEPS: list[Callable[[Demo], None]] = [
    step_build,
    step_pack,
    step_info,
    step_ls,
    step_cat,
    step_verify,
    step_extract,
    step_mount,
]


def main() -> int:
    demo = Demo()
    for step in STEPS:
        step(demo)
    print(f"\ndemo done: the bundle is {demo.bundle}, its extracted copy {demo.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
