"""Format versions: bundles of version 1 keep working, and version 2 names shards in decimal.

The version-1 bundle is the committed tests/data/v1-twelve-shards.bundle (packed by the last
version-1 writer; shards ``shard-00000000`` … ``shard-0000000b``). Every way a user reads a bundle —
the library, ``verify``, ``extract``, ``cat``, a real FUSE mount — must serve it unchanged.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bundlefs import Bundle
from bundlefs.core import format as fmt
from bundlefs.read.verify import verify
from tests.conftest import pseudo_random_bytes
from tests.legacy_trees import V1_FILES, V1_PACK_OPTIONS, build_v1_tree
from tests.trees import diff_r, run_cli

V1_BUNDLE = Path(__file__).parent / "data" / "v1-twelve-shards.bundle"


@pytest.fixture(scope="module")
def v1_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_v1_tree(tmp_path_factory.mktemp("v1") / "src")


@pytest.fixture
def v1_copy(tmp_path: Path) -> Path:
    """A private copy of the committed version-1 bundle, which a test may change."""
    dest = tmp_path / "v1.bundle"
    shutil.copytree(V1_BUNDLE, dest)
    return dest


# --- version 1 still reads -----------------------------------------------------------------------


def test_the_version_1_bundle_has_twelve_hex_named_shards() -> None:
    names = sorted(p.name for p in V1_BUNDLE.glob("shard-*"))
    assert names == [fmt.shard_filename(i, 1) for i in range(12)]
    assert names[10:] == ["shard-0000000a", "shard-0000000b"]


def test_a_version_1_bundle_reads_every_file_through_the_library(v1_tree: Path) -> None:
    with Bundle(V1_BUNDLE) as b:
        assert b.config.format_version == 1 and b.config.shard_count == 12
        assert b.info().to_dict()["format_version"] == 1
        for rel, _size, _c in V1_FILES:
            assert b.read(rel) == (v1_tree / rel).read_bytes(), rel
        assert b.readlink("link-to-first") == "d0/f00.bin"
        assert b.stat("d2/hardlink-of-d1-f01").st_nlink == 2
        assert b.stat("d0/f00.bin").content_type is None  # version 1 stores none
        assert b.info().meta == {}


def test_a_version_1_bundle_verifies_clean() -> None:
    report = verify(V1_BUNDLE)
    assert report.ok, [p.message for p in report.problems]
    assert report.shards == 12


def test_a_version_1_bundle_extracts_to_the_tree_it_was_packed_from(
    tmp_path: Path, v1_tree: Path
) -> None:
    result = run_cli("extract", V1_BUNDLE, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert diff_r(v1_tree, tmp_path / "out").returncode == 0


def test_a_version_1_bundle_cats_and_infos_from_the_cli(v1_tree: Path) -> None:
    assert run_cli("cat", V1_BUNDLE, "d3/f04.bin").stdout == (v1_tree / "d3/f04.bin").read_bytes()
    assert b"version 1" in run_cli("info", V1_BUNDLE).stdout


@pytest.mark.mount
def test_a_version_1_bundle_mounts_and_diffs_clean_against_its_tree(
    mount_bundle, v1_tree: Path
) -> None:
    m = mount_bundle(V1_BUNDLE)
    assert subprocess.run(["diff", "-r", v1_tree, m.mountpoint]).returncode == 0
    assert os.stat(m.mountpoint / "d2/hardlink-of-d1-f01").st_nlink == 2


# --- version 2 names shards in decimal -----------------------------------------------------------


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
        assert b.config.format_version == fmt.FORMAT_VERSION == 2
        assert b.read("f10") == spec["f10"]
    assert verify(bundle).ok


def test_the_v1_tree_packed_today_reads_the_same_as_the_v1_bundle(
    tmp_path: Path, v1_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bundlefs import PackOptions, pack

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1650000000")
    dest = tmp_path / "v2.bundle"
    pack(str(v1_tree), str(dest), PackOptions(**V1_PACK_OPTIONS))
    with Bundle(V1_BUNDLE) as old, Bundle(dest) as new:
        assert new.config.shard_count == old.config.shard_count == 12
        assert sorted(old) == sorted(new)
        for path in old:
            if old.isfile(path):
                assert old.read(path) == new.read(path)
    assert (dest / "shard-00000011").exists() and not (dest / "shard-0000000b").exists()


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


def test_verify_reports_a_hex_named_shard_in_a_version_2_bundle(tmp_path: Path, pack_tree) -> None:
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
