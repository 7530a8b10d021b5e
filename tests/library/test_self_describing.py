"""Self-describing data: content types, per-file user metadata, bundle metadata, creation time
and zstd records — set by ``pack``, shown by ``info``, ``ls -l``, ``stat()`` and mount xattrs."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from bundlefs import Bundle, PackError, PackOptions, pack
from bundlefs.core import content_types
from bundlefs.core import format as fmt
from bundlefs.read.verify import verify
from tests.conftest import build_tree, pseudo_random_bytes
from tests.support.trees import assert_one_line_error, run_cli

PNG = b"\x89PNG\r\n\x1a\n" + bytes(40)
JPEG = b"\xff\xd8\xff\xe0" + bytes(40)
SPEC = {
    "notes.txt": b"plain text\n",
    "img": {"a.png": PNG, "no-extension": JPEG, "labels.csv": b"x,y\n1,2\n"},
    "blob.dat": bytes(range(256)),
    "empty": b"",
}


@pytest.fixture
def described(tmp_path: Path) -> Path:
    src = build_tree(tmp_path / "src", SPEC)
    (tmp_path / "meta.jsonl").write_text(
        json.dumps({"file_name": "img/a.png", "label": 3, "split": "train"})
        + "\n"
        + json.dumps({"path": "notes.txt", "author": "Zoë"})
        + "\n"
    )
    result = run_cli(
        "pack",
        src,
        tmp_path / "b.bundle",
        "--user-data",
        tmp_path / "meta.jsonl",
        "--meta",
        "dataset=demo",
        "--meta",
        "licence=CC-BY 4.0",
        "--content-type",
        "*.dat=application/x-blob",
        "--created",
        "2026-01-02T03:04:05Z",
    )
    assert result.returncode == 0, result.stderr
    return tmp_path / "b.bundle"


# --- detection -----------------------------------------------------------------------------------


def test_content_type_comes_from_the_extension_case_insensitively() -> None:
    assert content_types.detect(b"photo.JPG", b"") == "image/jpeg"
    assert content_types.detect(b"t.parquet", b"") == "application/vnd.apache.parquet"


def test_content_type_comes_from_magic_bytes_when_the_extension_says_nothing() -> None:
    assert content_types.detect(b"no-extension", JPEG) == "image/jpeg"
    assert content_types.detect(b"x.unknownext", PNG) == "image/png"
    assert content_types.detect(b"x", b"RIFF\0\0\0\0WEBPVP8 ") == "image/webp"
    assert content_types.detect(b"x", bytes(300)) is None  # never a guess


def test_the_last_matching_rule_overrides_detection() -> None:
    rules = content_types.ContentTypeRules([("*.txt", "text/x-a"), ("d/*.txt", "text/x-b")])
    assert rules.choose(b"d/n.txt", b"") == "text/x-b"
    assert rules.choose(b"n.txt", b"") == "text/x-a"
    assert content_types.ContentTypeRules([("*.png", "")]).choose(b"a.png", PNG) is None


# --- what pack stores, and what readers show ---------------------------------------------------


def test_stat_shows_content_types_and_user_data(described: Path) -> None:
    with Bundle(described) as b:
        assert b.stat("notes.txt").content_type == "text/plain"
        assert b.stat("img/a.png").content_type == "image/png"
        assert b.stat("img/no-extension").content_type == "image/jpeg"
        assert b.stat("img/labels.csv").content_type == "text/csv"
        assert b.stat("blob.dat").content_type == "application/x-blob"
        assert b.stat("empty").content_type is None
        assert b.stat("img").content_type is None
        assert json.loads(b.stat("img/a.png").user_data) == {"label": 3, "split": "train"}
        assert json.loads(b.stat("notes.txt").user_data) == {"author": "Zoë"}
        assert b.stat("blob.dat").user_data is None


def test_bundle_metadata_and_creation_time_are_in_info(described: Path) -> None:
    with Bundle(described) as b:
        info = b.info().to_dict()
    assert info["meta"] == {"dataset": "demo", "licence": "CC-BY 4.0"}
    assert info["created_ns"] == 1_767_323_045 * 10**9
    assert info["format_version"] == 6 and info["digests"] == "sha256-128"
    text = run_cli("info", described).stdout.decode()
    assert "meta dataset" in text and "CC-BY 4.0" in text
    assert re.search(r"^created +2026-01-02 03:04:05 UTC$", text, re.M)
    as_json = json.loads(run_cli("info", "--json", described).stdout)
    assert as_json["meta"]["dataset"] == "demo" and as_json["content_types"] >= 5


def test_ls_long_shows_the_content_type_column(described: Path) -> None:
    lines = run_cli("ls", "-l", described, "img").stdout.decode().splitlines()
    by_name = {line.rsplit(" ", 1)[-1]: line for line in lines}
    assert " image/png " in by_name["a.png"]
    assert " text/csv " in by_name["labels.csv"]


@pytest.mark.mount
def test_the_mount_serves_content_type_and_user_data_as_xattrs(mount_bundle, described) -> None:
    m = mount_bundle(described)
    png = m.mountpoint / "img" / "a.png"
    assert os.getxattr(png, fmt.XATTR_CONTENT_TYPE) == b"image/png"
    assert json.loads(os.getxattr(png, fmt.XATTR_USER_DATA)) == {"label": 3, "split": "train"}
    listed = subprocess.run(["getfattr", "-d", "-m", "-", png], capture_output=True, text=True)
    assert "user.bundlefs.content_type" in listed.stdout
    served = json.loads(os.getxattr(m.mountpoint, fmt.XATTR_BUNDLE))
    assert served["meta"] == {"dataset": "demo", "licence": "CC-BY 4.0"}


def test_user_data_naming_a_missing_path_is_warned_about(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", {"a": b"a"})
    (tmp_path / "m.jsonl").write_text('{"file_name": "nope", "x": 1}\n')
    result = run_cli("pack", src, tmp_path / "b", "--user-data", tmp_path / "m.jsonl")
    assert result.returncode == 0
    assert b"warning: 1 path in" in result.stderr and b"'nope'" in result.stderr
    assert b"is not a file of the bundle" in result.stderr


@pytest.mark.parametrize(
    "line, why",
    [
        ("not json", b"is not JSON"),
        ('["a"]', b"is not a JSON object"),
        ('{"x": 1}', b"exactly one of: file_name, path"),
        ('{"file_name": "b", "big": "' + "x" * 5000 + '"}', b"over the 4096"),
    ],
)
def test_a_bad_user_data_line_is_one_sentence_naming_the_line(
    tmp_path: Path, line: str, why: bytes
) -> None:
    src = build_tree(tmp_path / "src", {"a": b"a"})
    (tmp_path / "m.jsonl").write_text('{"file_name": "a", "ok": 1}\n' + line + "\n")
    result = run_cli("pack", src, tmp_path / "b", "--user-data", tmp_path / "m.jsonl")
    message = assert_one_line_error(result)
    assert "line 2" in message and why.decode() in message
    assert not (tmp_path / "b").exists()


def test_bad_meta_and_content_type_options_are_refused(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", {"a": b"a"})
    for args in (["--meta", "novalue"], ["--content-type", "*.a=not a type"], ["--created", "x"]):
        # a malformed value: a usage error, exit 2 (docs/cli.md)
        assert_one_line_error(run_cli("pack", src, tmp_path / "b", *args), status=2)
        assert not (tmp_path / "b").exists()


def test_no_content_types_stores_none(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", SPEC)
    pack(str(src), str(tmp_path / "b"), PackOptions(detect_content_types=False))
    with Bundle(tmp_path / "b") as b:
        assert b.stat("notes.txt").content_type is None
        assert b.config.content_type_count == 0


def test_a_fixed_creation_time_packs_byte_identical_bundles(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", SPEC, mtime_ns=1_600_000_000 * 10**9)
    for name in ("one", "two"):
        pack(str(src), str(tmp_path / name), PackOptions(created_ns=5, meta=(("k", "v"),)))
    one = {p.name: p.read_bytes() for p in (tmp_path / "one").rglob("*") if p.is_file()}
    two = {p.name: p.read_bytes() for p in (tmp_path / "two").rglob("*") if p.is_file()}
    assert one == two


# --- zstd ----------------------------------------------------------------------------------------


ZSTD_SPEC = {
    "text.txt": b"the quick brown fox jumps over the lazy dog\n" * 20000,
    "random.bin": pseudo_random_bytes(300_000, seed=3, compressible=False),
    "zeros": bytes(600_000),
    "small.txt": b"tiny",
}


@pytest.mark.parametrize("compression", ["zstd", "zstd:19", "zstd:-3"])
def test_zstd_bundles_read_back_byte_exact_and_verify(pack_tree, compression: str) -> None:
    bundle = pack_tree(ZSTD_SPEC, compression=compression, record_size=65536)
    with Bundle(bundle) as b:
        assert b.config.compression_name == "zstd"
        flags = {r.flags for r in b.content.records(0)}
        assert flags == {0, fmt.RECORD_RAW, fmt.RECORD_ZEROS}  # zstd, incompressible, zeros
        for name, data in ZSTD_SPEC.items():
            assert b.read(name) == data
            with b.open(name) as f:
                f.seek(1000)
                assert f.read(70000) == data[1000:71000]
    assert verify(bundle).ok


def test_zstd_shrinks_text_more_than_lz4(pack_tree) -> None:
    spec = {"t.txt": ZSTD_SPEC["text.txt"] + pseudo_random_bytes(200_000, seed=1)}
    sizes = {}
    for codec in ("lz4", "zstd:9"):
        with Bundle(pack_tree(spec, name=codec.replace(":", "-"), compression=codec)) as b:
            sizes[codec] = b.info().shard_bytes
    assert sizes["zstd:9"] < sizes["lz4"]


def test_a_damaged_zstd_record_is_corrupt_data_not_wrong_bytes(pack_tree, copy_bundle) -> None:
    from bundlefs import CorruptDataError
    from tests.conftest import flip_byte

    bundle = copy_bundle(pack_tree({"t.txt": ZSTD_SPEC["text.txt"]}, compression="zstd"))
    with Bundle(bundle) as b:
        record = next(r for r in b.content.records(0) if r.flags == 0)
    flip_byte(bundle / fmt.shard_filename(0), record.stored_offset + 20)
    with Bundle(bundle) as b, pytest.raises(CorruptDataError):
        b.read("t.txt")


@pytest.mark.mount
def test_a_zstd_bundle_mounts_and_reads_like_its_tree(mount_bundle, pack_tree, tmp_path) -> None:
    bundle = pack_tree(ZSTD_SPEC, compression="zstd")
    m = mount_bundle(bundle)
    src = tmp_path / "b.src"
    assert subprocess.run(["diff", "-r", src, m.mountpoint]).returncode == 0


def test_an_unknown_or_misleveled_compression_is_refused(tmp_path: Path) -> None:
    src = build_tree(tmp_path / "src", {"a": b"a"})
    for spec in ("brotli", "lz4:1", "zstd:23", "zstd:x"):
        with pytest.raises(PackError):
            pack(str(src), str(tmp_path / "b"), PackOptions(compression=spec))
