"""Opening, closing, forking and replacing: a Bundle never mixes two bundles or leaks."""

from __future__ import annotations

import os

import pytest

import bundlefs
from bundlefs.core import format as fmt
from bundlefs.errors import BundleClosedError, BundleError, CorruptDataError
from bundlefs.storage import lmdb_env
from tests.conftest import flip_byte, pseudo_random_bytes


def test_using_a_closed_bundle_raises_bundle_closed_error(pack_tree):
    bundle = pack_tree({"a.txt": b"a" * 100})
    b = bundlefs.Bundle(bundle)
    entry = b.resolve("a.txt")
    assert b.read("a.txt") == b"a" * 100  # the path is now resolved and held
    b.close()
    with pytest.raises(BundleClosedError):
        b.read("a.txt")
    with pytest.raises(BundleClosedError):
        b.stat("a.txt")
    with pytest.raises(BundleClosedError):
        b.content.read_at(entry, 0, 10)


def test_a_failed_open_leaves_no_lmdb_environment_behind(pack_tree, copy_bundle):
    import dataclasses

    from tests.support.hostile import config_of, config_put, forge

    bundle = copy_bundle(pack_tree({"a.txt": b"a"}))
    # A config LMDB can read but the reader refuses: the failure comes after LMDB is open.
    forged = dataclasses.replace(config_of(bundle), entry_count=99)
    forge(bundle, config_put(fmt.encode_config(forged)))
    before = dict(lmdb_env._envs)
    for _ in range(3):
        with pytest.raises(BundleError):
            bundlefs.Bundle(bundle)
    assert lmdb_env._envs == before


def _remove_deep_tree(root, depth: int) -> None:
    """Delete a one-directory-per-level tree bottom up (shutil.rmtree, and so pytest's own
    clean-up of old temp dirs, recurses once per level and would fail)."""
    deepest = root.joinpath(*["d"] * depth)
    for child in deepest.iterdir():
        child.unlink()
    for level in range(depth, -1, -1):
        root.joinpath(*["d"] * level).rmdir()


def test_a_tree_deeper_than_the_recursion_limit_walks_and_names_damage(tmp_path):
    depth = 1100
    path = tmp_path / "src"
    parts = ["d"] * depth
    deep = path
    path.mkdir()
    for part in parts:  # os.makedirs recurses once per level
        deep = deep / part
        deep.mkdir()
    (deep / "leaf.bin").write_bytes(pseudo_random_bytes(5000, seed=3, compressible=False))
    bundle = tmp_path / "deep.bundle"
    try:
        bundlefs.pack(str(path), str(bundle), bundlefs.PackOptions(record_size=4096))
    finally:
        _remove_deep_tree(path, depth)
    with bundlefs.Bundle(bundle) as b:
        assert sum(len(files) for _top, _dirs, files in b.walk()) == 1
        assert len(list(b.paths())) == depth + 1
        leaf = b.resolve("/".join(parts) + "/leaf.bin")
        record = b.content.record_at(leaf.shard, leaf.offset)
    flip_byte(bundle / fmt.shard_filename(0), record.stored_offset + 1)
    with bundlefs.Bundle(bundle) as b:
        leaf = b.resolve("/".join(parts) + "/leaf.bin")
        with pytest.raises(CorruptDataError) as e:
            b.content.read_at(leaf, 0, leaf.size)  # no path given: the bundle works it out
        assert e.value.path.endswith("/d/d/leaf.bin")


def test_a_whole_file_read_counts_one_cache_miss_per_record(pack_tree):
    bundle = pack_tree({"text.txt": b"compressible " * 1000}, record_size=65536)
    with bundlefs.Bundle(bundle) as b:
        b.read("text.txt")
        stats = b.cache_stats()
    assert (stats.misses, stats.hits) == (1, 0)


def test_a_forked_child_refuses_a_bundle_replaced_at_the_same_path(pack_tree, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f1").write_bytes(b"1" * 50_000)
    (src / "f2").write_bytes(b"2" * 50_000)
    dest = tmp_path / "b.bundle"
    bundlefs.pack(str(src), str(dest))
    b = bundlefs.Bundle(dest)
    assert b.read("f1")[:5] == b"11111"
    (src / "f1").write_bytes(b"x" * 20)
    bundlefs.pack(str(src), str(dest), bundlefs.PackOptions(force=True))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: must never see a mix of the old and the new bundle
        os.close(read)
        try:
            data = b.read("f2")
            verdict = b"ok" if data == b"2" * 50_000 else b"WRONG"
        except BundleError:
            verdict = b"refused"
        os.write(write, verdict)
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    verdict = os.read(read, 16)
    os.close(read)
    b.close()
    assert verdict in (b"ok", b"refused")
