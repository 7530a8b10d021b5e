"""Format versions: bundles of versions 1 to 5 keep working, and shards are named in decimal.

The committed bundles are tests/data/v1-twelve-shards.bundle (packed by the last version-1 writer;
shards ``shard-00000000`` … ``shard-0000000b``) and tests/data/v2-twelve-shards.bundle (the same
tree packed by the last version-2 writer, zstd; ``shard-00000000`` … ``shard-00000011``) and
tests/data/v3-twelve-shards.bundle, tests/data/v4-twelve-shards.bundle and
tests/data/v5-twelve-shards.bundle (the same tree packed by the last version-3, -4 and -5 writers).
Every way a user reads a bundle — the library, ``verify``, ``extract``, ``cat``, ``info``, a real
FUSE mount — must serve them unchanged, and a bundle of today's version holding their shards (as a
merge links them in).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bundlefs import Bundle
from bundlefs.core import format as fmt
from bundlefs.read.verify import verify
from tests.conftest import pseudo_random_bytes
from tests.support.hostile import read_values
from tests.support.legacy_trees import (
    V1_BUNDLE,
    V1_FILES,
    V1_PACK_OPTIONS,
    V2_BUNDLE,
    V2_PACK_OPTIONS,
    V3_BUNDLE,
    V4_BUNDLE,
    V5_BUNDLE,
    build_v1_tree,
)
from tests.support.trees import diff_r, run_cli


@pytest.fixture(scope="module")
def v1_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tree both committed bundles were packed from."""
    return build_v1_tree(tmp_path_factory.mktemp("v1") / "src")


@pytest.fixture
def v1_copy(tmp_path: Path) -> Path:
    """A private copy of the committed version-1 bundle, which a test may change."""
    dest = tmp_path / "v1.bundle"
    shutil.copytree(V1_BUNDLE, dest)
    return dest


@dataclass(frozen=True)
class Legacy:
    """A bundle of the v1 tree that today's bundlefs did not write (or not all of)."""

    path: Path
    version: int
    meta: dict[str, str] = field(default_factory=dict)


@pytest.fixture(params=["v1", "v2", "v3", "v4", "v5", "grafted"])
def legacy(request: pytest.FixtureRequest) -> Legacy:
    """Each committed bundle, and the bundle of today's version whose shards 0-3 are the
    version-1 bundle's and 4-7 the version-2 bundle's (conftest ``grafted_bundle_path``)."""
    if request.param == "v1":
        return Legacy(V1_BUNDLE, 1)
    if request.param == "v2":
        return Legacy(V2_BUNDLE, 2, {"made-by": "bundlefs 22d101b, format version 2"})
    if request.param == "v3":
        return Legacy(V3_BUNDLE, 3, {"made-by": "bundlefs 6acabea, format version 3"})
    if request.param == "v4":
        return Legacy(V4_BUNDLE, 4, {"made-by": "bundlefs 9791af2, format version 4"})
    if request.param == "v5":
        return Legacy(V5_BUNDLE, 5, {"made-by": "bundlefs 5c0717b, format version 5"})
    return Legacy(request.getfixturevalue("grafted_bundle_path"), fmt.FORMAT_VERSION)


# --- the committed bundles still read -------------------------------------------------------------


def test_the_version_1_bundle_has_twelve_hex_named_shards() -> None:
    names = sorted(p.name for p in V1_BUNDLE.glob("shard-*"))
    assert names == [fmt.shard_filename(i, 1) for i in range(12)]
    assert names[10:] == ["shard-0000000a", "shard-0000000b"]


def test_the_version_2_bundle_has_twelve_decimal_named_shards() -> None:
    names = sorted(p.name for p in V2_BUNDLE.glob("shard-*"))
    assert names == [fmt.shard_filename(i, 2) for i in range(12)]
    assert names[10:] == ["shard-00000010", "shard-00000011"]


def test_a_committed_bundle_reads_every_file_through_the_library(
    legacy: Legacy, v1_tree: Path
) -> None:
    with Bundle(legacy.path) as b:
        assert b.config.format_version == legacy.version and b.config.shard_count == 12
        assert b.info().to_dict()["format_version"] == legacy.version
        for rel, _size, _c in V1_FILES:
            assert b.read(rel) == (v1_tree / rel).read_bytes(), rel
        assert b.read("empty") == b""
        assert b.readlink("link-to-first") == "d0/f00.bin"
        assert b.stat("d2/hardlink-of-d1-f01").st_nlink == 2
        assert b.stat("d0/f00.bin").content_type is None  # .bin names no type; v1 stores none
        assert b.info().meta == legacy.meta


def test_a_committed_bundle_verifies_clean(legacy: Legacy) -> None:
    report = verify(legacy.path)
    assert report.ok, [p.message for p in report.problems]
    assert report.shards == 12


def test_a_committed_bundle_extracts_to_the_tree_it_was_packed_from(
    tmp_path: Path, v1_tree: Path, legacy: Legacy
) -> None:
    result = run_cli("extract", legacy.path, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert diff_r(v1_tree, tmp_path / "out").returncode == 0


def test_a_committed_bundle_cats_and_infos_from_the_cli(v1_tree: Path, legacy: Legacy) -> None:
    cat = run_cli("cat", legacy.path, "d3/f04.bin")
    assert cat.stdout == (v1_tree / "d3/f04.bin").read_bytes()
    assert b"version %d" % legacy.version in run_cli("info", legacy.path).stdout


@pytest.mark.mount
def test_a_committed_bundle_mounts_and_diffs_clean_against_its_tree(
    mount_bundle, v1_tree: Path, legacy: Legacy
) -> None:
    m = mount_bundle(legacy.path)
    assert subprocess.run(["diff", "-r", v1_tree, m.mountpoint]).returncode == 0
    assert os.stat(m.mountpoint / "d2/hardlink-of-d1-f01").st_nlink == 2


# --- from version 2, shards are named in decimal -------------------------------------------------


def test_a_20_mb_tree_packed_in_1_mib_shards_has_decimal_names_past_ten(
    tmp_path: Path, pack_tree
) -> None:
    # 100 files of 200 kB: about nineteen shards, and shard 10 must be shard-00000010, never
    # shard-0000000a.
    spec = {f"f{i:02d}": pseudo_random_bytes(200_000, seed=i) for i in range(100)}
    bundle = pack_tree(spec, shard_size=2**20)
    names = sorted(p.name for p in bundle.glob("shard-*"))
    assert "shard-00000010" in names
    assert names == [f"shard-{i:08d}" for i in range(len(names))]
    assert not any(set(n[6:]) - set("0123456789") for n in names)  # no hex digit anywhere
    with Bundle(bundle) as b:
        assert b.config.format_version == fmt.FORMAT_VERSION == 6
        assert b.read("f10") == spec["f10"]
    assert verify(bundle).ok


def _pack_today(tree: Path, dest: Path, options: dict, monkeypatch: pytest.MonkeyPatch) -> Path:
    from bundlefs import PackOptions, pack

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1650000000")
    pack(str(tree), str(dest), PackOptions(**options))
    return dest


@pytest.mark.parametrize(
    "committed, options",
    [
        (V1_BUNDLE, V1_PACK_OPTIONS),
        (V2_BUNDLE, V2_PACK_OPTIONS),
        (V3_BUNDLE, V1_PACK_OPTIONS),
        (V4_BUNDLE, V1_PACK_OPTIONS),
        (V5_BUNDLE, V1_PACK_OPTIONS),
    ],
    ids=["v1", "v2", "v3", "v4", "v5"],
)
def test_the_v1_tree_packed_today_reads_the_same_as_the_committed_bundle(
    tmp_path: Path,
    v1_tree: Path,
    monkeypatch: pytest.MonkeyPatch,
    committed: Path,
    options: dict,
) -> None:
    dest = _pack_today(v1_tree, tmp_path / "v6.bundle", options, monkeypatch)
    with Bundle(committed) as old, Bundle(dest) as new:
        assert new.config.format_version == 6
        assert new.config.shard_count == old.config.shard_count == 12
        assert new.config.compression == old.config.compression
        assert sorted(old) == sorted(new)
        for path in old:
            if old.isfile(path):
                assert old.read(path) == new.read(path)
    assert (dest / "shard-00000011").exists() and not (dest / "shard-0000000b").exists()


@pytest.mark.parametrize(
    "committed, options",
    [
        (V1_BUNDLE, V1_PACK_OPTIONS),
        (V2_BUNDLE, V2_PACK_OPTIONS),
        (V3_BUNDLE, V1_PACK_OPTIONS),
        (V4_BUNDLE, V1_PACK_OPTIONS),
        (V5_BUNDLE, V1_PACK_OPTIONS),
    ],
    ids=["v1", "v2", "v3", "v4", "v5"],
)
def test_the_v1_tree_packed_today_has_the_committed_bundles_shard_streams_and_records(
    tmp_path: Path,
    v1_tree: Path,
    monkeypatch: pytest.MonkeyPatch,
    committed: Path,
    options: dict,
) -> None:
    # What legacy_trees.graft_legacy_shards relies on: a bundle of this tree packed today can take
    # the committed bundles' shard files in place of its own, entries unchanged.
    dest = _pack_today(v1_tree, tmp_path / "v6.bundle", options, monkeypatch)
    version = {V1_BUNDLE: 1, V2_BUNDLE: 2, V3_BUNDLE: 3, V4_BUNDLE: 4, V5_BUNDLE: 5}[committed]
    for i in range(12):
        old = (committed / fmt.shard_filename(i, version)).read_bytes()
        new = (dest / fmt.shard_filename(i)).read_bytes()
        assert new[fmt.SHARD_HEADER_SIZE :] == old[fmt.SHARD_HEADER_SIZE :], i
    assert read_values(dest, fmt.DB_RECORDS) == read_values(committed, fmt.DB_RECORDS)


# --- verify checks shard names against the version -------------------------------------------


def _messages(bundle: Path) -> list[str]:
    report = verify(bundle)
    return [p.message for p in report.problems]


def test_verify_reports_a_stray_shard_file_the_index_does_not_list(v1_copy: Path) -> None:
    shutil.copyfile(v1_copy / "shard-00000000", v1_copy / "shard-00000099")
    messages = _messages(v1_copy)
    assert any("shard-00000099" in m and "not a shard of this bundle" in m for m in messages)


def test_verify_reports_a_version_1_shard_renamed_to_a_decimal_name(v1_copy: Path) -> None:
    os.rename(v1_copy / "shard-0000000a", v1_copy / "shard-00000010")
    messages = _messages(v1_copy)
    assert any("shard-00000010" in m and "version 2 names shard 10" in m for m in messages)
    assert any("shard 10" in m and "cannot read" in m for m in messages)  # the real one is gone


def test_verify_reports_a_hex_named_shard_in_a_version_3_bundle(tmp_path: Path, pack_tree) -> None:
    spec = {f"f{i:02d}": pseudo_random_bytes(5000, seed=i, compressible=False) for i in range(12)}
    bundle = pack_tree(spec, shard_size=4096, record_size=4096, block_size=512)
    os.rename(bundle / "shard-00000011", bundle / "shard-0000000b")
    messages = _messages(bundle)
    assert any("shard-0000000b" in m and "version 1 names shard 11" in m for m in messages)


def test_verify_cli_fails_on_a_stray_shard(v1_copy: Path) -> None:
    shutil.copyfile(v1_copy / "shard-00000001", v1_copy / "shard-0000000c")
    result = run_cli("verify", v1_copy)
    assert result.returncode != 0
    assert b"shard-0000000c" in result.stdout + result.stderr
