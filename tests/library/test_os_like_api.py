"""The Python API behaves like ``os`` (issue 22): its errors carry what the built-ins' carry,
``stat()`` says "none" with ``None``, and content types are decided by content where a name is
ambiguous.
"""

from __future__ import annotations

import errno
import os
import pickle
import shutil
from pathlib import Path

import pytest

from bundlefs import Bundle, BundleError, pack
from bundlefs.core.content_types import detect
from tests.conftest import build_tree


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Bundle]:
    """The same small tree on disk and as a bundle: every error is compared with os's."""
    root = build_tree(tmp_path / "src", {"f": b"file\n", "d": {"g": b"g"}})
    os.symlink("loop2", root / "loop1")
    os.symlink("loop1", root / "loop2")
    os.symlink("nowhere", root / "dangling")
    with Bundle(pack(str(root), str(tmp_path / "b")).dest) as bundle:
        yield root, bundle


def _raised(call) -> OSError:
    with pytest.raises(OSError) as caught:
        call()
    return caught.value


@pytest.mark.parametrize(
    ("calls", "path"),
    [
        (("stat", os.stat), "missing"),
        (("stat", os.stat), "dangling"),
        (("stat", os.stat), "f/below-a-file"),
        (("stat", os.stat), "f/"),  # a trailing slash names a directory
        (("stat", os.stat), "f/."),
        (("stat", os.stat), "loop1"),
        (("listdir", os.listdir), "f"),
        (("listdir", os.listdir), "missing"),
        (("readlink", os.readlink), "f"),
        (("read", lambda p: Path(p).read_bytes()), "d"),
        (("open", open), "d"),
    ],
)
def test_errors_carry_errno_strerror_and_filename_like_os(pair, calls, path):
    root, bundle = pair
    method, os_call = calls
    ours = _raised(lambda: getattr(bundle, method)(path))
    theirs = _raised(lambda: os_call(os.path.join(root, path)))
    assert ours.errno == theirs.errno and ours.errno is not None
    assert ours.strerror == theirs.strerror
    assert ours.filename == path  # the path as the caller gave it
    assert isinstance(ours, type(theirs))  # FileNotFoundError, IsADirectoryError, …
    assert isinstance(ours, BundleError)
    assert path in str(ours)  # still the one sentence the CLI prints


def test_a_bytes_path_is_the_filename_as_given(pair):
    _root, bundle = pair
    assert _raised(lambda: bundle.stat(b"missing")).filename == b"missing"


def test_errors_keep_errno_and_filename_through_pickling(pair):
    _root, bundle = pair
    error = _raised(lambda: bundle.stat("missing"))
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.errno, copy.filename, str(copy)) == (errno.ENOENT, "missing", str(error))


def test_stat_user_data_is_none_when_there_is_none(tmp_path):
    root = build_tree(tmp_path / "src", {"labelled": b"a", "plain": b"b"})

    def user_data(rel: bytes, _st: os.stat_result) -> bytes | None:
        return b'{"label":1}' if rel == b"labelled" else None

    from bundlefs import PackOptions

    pack(str(root), str(tmp_path / "b"), PackOptions(user_data=user_data))
    with Bundle(tmp_path / "b") as b:
        assert b.stat("labelled").user_data == b'{"label":1}'
        assert b.stat("plain").user_data is None
        assert b.stat("").user_data is None  # the root directory


# -- content types ---------------------------------------------------------------------------------


def test_a_text_pth_is_a_path_file_and_a_binary_one_a_checkpoint(tmp_path):
    root = build_tree(
        tmp_path / "src",
        {
            "site-packages": {"easy-install.pth": b"/opt/lib/python\nimport sitecustomize\n"},
            "model.pth": b"PK\x03\x04" + bytes(200),  # torch.save: a zip
            "legacy.pth": b"\x80\x02}q\x00" + bytes(200),  # torch.save before 1.6: a pickle
        },
    )
    pack(str(root), str(tmp_path / "b"))
    with Bundle(tmp_path / "b") as b:
        assert b.stat("site-packages/easy-install.pth").content_type == "text/plain"
        assert b.stat("model.pth").content_type == "application/x-pytorch"
        assert b.stat("legacy.pth").content_type == "application/x-pytorch"


def test_a_ts_file_is_typescript_or_an_mpeg_transport_stream_by_content():
    assert detect(b"app.ts", b"export const x: number = 1;\n") == "text/x-typescript"
    packet = b"\x47\x40\x00\x10" + bytes(184)  # MPEG-TS: 188-byte packets, sync byte 0x47
    assert detect(b"clip.ts", packet * 2) == "video/mp2t"


def _elf_head(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(264)  # what the packer reads of a file's start (sources.HEAD_SIZE)


def test_elf_libraries_and_programs_get_a_type():
    program = shutil.which("ls") or "/bin/ls"
    assert detect(b"ls", _elf_head(program)) == "application/x-executable"
    library = next(
        (
            os.path.join(d, name)
            for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib")
            if os.path.isdir(d)
            for name in sorted(os.listdir(d))
            if name.startswith("libz.so.")
        ),
        None,
    )
    if library is None:
        pytest.skip("no libz.so.* on this machine")
    assert detect(os.fsencode(os.path.basename(library)), _elf_head(library)) == (
        "application/x-sharedlib"
    )
    # A relocatable object (e_type 1), little-endian 64-bit.
    assert detect(b"x.o", b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x01\x00" + bytes(46)) == (
        "application/x-object"
    )
