"""``iter_files(shards=…, with_stat=True)``: a worker streams only its shards, and each file comes
with its stat (content type included)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bundlefs import Bundle, PackOptions, pack
from bundlefs.read.stream import StoredFiles
from tests.conftest import HardLink, build_tree, pseudo_random_bytes

FILES = {f"d{i % 3}/f{i:02}.txt": pseudo_random_bytes(3000, seed=i) for i in range(40)}


@pytest.fixture(scope="module")
def sharded_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec: dict = {}
    for path, data in FILES.items():
        top, name = path.split("/")
        spec.setdefault(top, {})[name] = data
    spec["link"] = HardLink("d0/f00.txt")
    src = build_tree(tmp_path_factory.mktemp("split") / "src", spec)
    dest = src.parent / "split.bundle"
    pack(str(src), str(dest), PackOptions(record_size=4096, shard_size=16384))
    return dest


def test_the_shards_split_the_stream_into_disjoint_parts(sharded_bundle) -> None:
    with Bundle(sharded_bundle) as b:
        count = b.config.shard_count
        assert count >= 4
        whole = list(b.iter_files())
        parts = [list(b.iter_files(shards=n)) for n in range(count)]
        assert [f for part in parts for f in part] == whole  # each file once, in stored order
        assert all(parts)
        for n, part in enumerate(parts):
            assert all(b.stat(p).st_ino and b.resolve(p).shard == n for p, _d in part)
        assert list(b.iter_files(shards=range(1, 3))) == parts[1] + parts[2]
        assert list(b.iter_files(shards=[count - 1, 0])) == parts[0] + parts[-1]
        assert list(b.iter_files(shards=[])) == []


@pytest.mark.parametrize("shards", [-1, 999, range(0, 999), [0, 999]])
def test_a_shard_the_bundle_does_not_have_is_a_value_error(sharded_bundle, shards) -> None:
    with Bundle(sharded_bundle) as b, pytest.raises(ValueError, match="no shard"):
        b.iter_files(shards=shards)


def test_with_stat_gives_each_file_its_stat_and_content_type(sharded_bundle) -> None:
    with Bundle(sharded_bundle) as b:
        got = list(b.iter_files(with_stat=True))
        assert [(p, d) for p, _s, d in got] == list(b.iter_files())
        for path, stat, data in got:
            assert stat == b.stat(path)
            assert stat.st_size == len(data)
        # (a hard-linked file has no content type: the packer detects it by name)
        assert {s.content_type for _p, s, _d in got if s.st_nlink == 1} == {"text/plain"}
        names = dict((p, s) for p, s, _d in got)
        assert names["link"].st_ino == names["d0/f00.txt"].st_ino and names["link"].st_nlink == 2


def _scanned(b: Bundle, fast: bool, shards=None) -> tuple:
    stored = StoredFiles.__new__(StoredFiles)
    stored.shards = shards
    if fast:
        assert stored._scan_raw(b.tree)
    else:
        stored._scan_tree(b.tree)
    return (stored.keys, stored.files, stored.names, stored.dirs, stored.dir_paths)


@pytest.mark.parametrize("which", ["sample", "grafted", "split"])
def test_the_fast_index_scan_finds_what_the_directory_walk_finds(
    which, sample_bundle_path, grafted_bundle_path, sharded_bundle
) -> None:
    # The sample tree has hard links, symlinks, empty and nested directories; the grafted bundle
    # names shards of older bundles; the split one has many shards and a link at the top.
    path = {"sample": sample_bundle_path, "grafted": grafted_bundle_path, "split": sharded_bundle}
    with Bundle(path[which]) as b:
        assert _scanned(b, True) == _scanned(b, False)
        assert _scanned(b, True, range(1, 2)) == _scanned(b, False, range(1, 2))
