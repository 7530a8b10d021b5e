"""``Bundle.iter_samples``: files grouped into samples in stored order (WebDataset's stem
convention, one sample per directory, a key function), with stats, and split into parts that
never cut a sample."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from bundlefs import Bundle, CorruptDataError, PackOptions, pack
from tests.conftest import build_tree, flip_byte, pseudo_random_bytes

# 3 class directories of 12 samples each, 2-3 members a sample (a .json on every third), a
# subdirectory with files of its own, a file without an extension.
SPEC: dict = {
    f"c{c}": {
        **{f"{i:04d}.jpg": pseudo_random_bytes(900 + i * 13, seed=c * 100 + i) for i in range(12)},
        **{f"{i:04d}.cls": str(c).encode() for i in range(12)},
        **{f"{i:04d}.meta.json": b'{"i": %d}' % i for i in range(0, 12, 3)},
    }
    for c in range(3)
}
SPEC["c1"]["extra"] = {"a.txt": b"a", "b.txt": b"b"}
SPEC["README"] = b"no extension"


@pytest.fixture(scope="module")
def samples_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = build_tree(tmp_path_factory.mktemp("samples") / "src", SPEC)
    dest = src.parent / "samples.bundle"
    pack(str(src), str(dest), PackOptions(record_size=4096, shard_size=16384))
    return dest


def test_stem_samples_group_a_directorys_files_by_the_name_before_the_first_dot(samples_bundle):
    with Bundle(samples_bundle) as b:
        samples = list(b.iter_samples())
        keys = [k for k, _m in samples]
        assert len(keys) == len(set(keys)) == 3 * 12 + 3  # + c1/extra/a, c1/extra/b, README
        got = dict(samples)
        assert got["c0/0003"] == {
            "jpg": SPEC["c0"]["0003.jpg"],
            "cls": b"0",
            "meta.json": b'{"i": 3}',
        }
        assert set(got["c2/0004"]) == {"jpg", "cls"}
        assert got["README"] == {"": b"no extension"}
        assert got["c1/extra/a"] == {"txt": b"a"}


def test_samples_come_in_stored_order_with_every_file_once(samples_bundle):
    with Bundle(samples_bundle) as b:
        flattened = [
            (f"{key}.{name}" if name else key, data)
            for key, members in b.iter_samples()
            for name, data in members.items()
        ]
        assert flattened == list(b.iter_files())


def test_dir_samples_are_each_directorys_files(samples_bundle):
    with Bundle(samples_bundle) as b:
        got = dict(b.iter_samples("dir"))
        assert list(got) == ["", "c0", "c1", "c2", "c1/extra"]  # stored (breadth-first) order
        assert got[""] == {"README": b"no extension"}
        assert got["c1/extra"] == {"a.txt": b"a", "b.txt": b"b"}
        assert got["c2"]["0011.jpg"] == SPEC["c2"]["0011.jpg"]
        assert len(got["c0"]) == 12 * 2 + 4


def test_a_key_function_splits_each_path_into_key_and_name(samples_bundle):
    def by_class(path: str) -> tuple[str, str]:
        top, _, rest = path.partition("/")
        return top, rest or top

    with Bundle(samples_bundle) as b:
        got = dict(b.iter_samples(by_class))
        assert list(got) == ["README", "c0", "c1", "c2"]
        assert got["c1"]["extra/b.txt"] == b"b"


def test_a_key_function_giving_one_name_twice_in_a_sample_is_a_value_error(samples_bundle):
    with Bundle(samples_bundle) as b, pytest.raises(ValueError, match="second member"):
        list(b.iter_samples(lambda path: ("all", path.rpartition(".")[2])))


def test_with_stat_gives_each_members_stat_and_content_type(samples_bundle):
    with Bundle(samples_bundle) as b:
        for key, members, stats in b.iter_samples(with_stat=True):
            assert set(stats) == set(members)
            for name, stat in stats.items():
                path = f"{key}.{name}" if name else key
                assert stat == b.stat(path) and stat.st_size == len(members[name])
        stats = {key: stats for key, _members, stats in b.iter_samples(with_stat=True)}
        assert stats["c0/0003"]["meta.json"].content_type == "application/json"
        assert stats["c0/0003"]["jpg"].st_size == len(SPEC["c0"]["0003.jpg"])


@pytest.mark.parametrize("key", ["stem", "dir"])
@pytest.mark.parametrize("count", [1, 2, 3, 7, 16, 200])
def test_parts_hold_every_sample_exactly_once_in_stored_order(samples_bundle, key, count):
    with Bundle(samples_bundle) as b:
        whole = list(b.iter_samples(key))
        parts = [list(b.iter_samples(key, part=(i, count))) for i in range(count)]
        assert [s for part in parts for s in part] == whole
        assert len({k for k, _m in whole}) == len(whole)  # no sample was cut in two


def test_file_parts_are_contiguous_and_equal_to_one(samples_bundle):
    with Bundle(samples_bundle) as b:
        whole = list(b.iter_files())
        parts = [list(b.iter_files(part=(i, 5))) for i in range(5)]
        assert [f for part in parts for f in part] == whole
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("part", [(0, 0), (2, 2), (-1, 3)])
def test_a_part_out_of_range_is_a_value_error(samples_bundle, part):
    with Bundle(samples_bundle) as b, pytest.raises(ValueError, match="part"):
        b.iter_samples(part=part)


def test_an_unknown_key_is_a_value_error(samples_bundle):
    with Bundle(samples_bundle) as b, pytest.raises(ValueError, match="key must be"):
        b.iter_samples("suffix")  # type: ignore[arg-type]


def test_samples_stream_in_an_archives_order(tmp_path):
    # WebDataset writes a tar shard sample by sample, unsorted: the samples come in its order.
    archive = tmp_path / "shard-000.tar"
    with tarfile.open(archive, "w") as tar:
        for key in ("s9", "s1", "s5"):
            for ext in ("txt", "cls"):
                data = f"{key}.{ext}".encode()
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    pack(str(archive), str(tmp_path / "b"))
    with Bundle(tmp_path / "b") as b:
        assert list(b.iter_samples()) == [
            (k, {"txt": f"{k}.txt".encode(), "cls": f"{k}.cls".encode()})
            for k in ("s9", "s1", "s5")
        ]


def test_a_damaged_member_is_left_out_of_its_sample_with_on_error_skip(tmp_path):
    # Each file exactly one record, so a flipped byte damages one file.
    spec = {f"{i}.{ext}": pseudo_random_bytes(4096, seed=i * 2 + (ext == "b"))
            for i in range(3) for ext in ("a", "b")}  # fmt: skip
    src = build_tree(tmp_path / "src", spec)
    pack(str(src), str(tmp_path / "b"), PackOptions(record_size=4096))
    with Bundle(tmp_path / "b") as b:
        entry = b.resolve("1.b")
        record = b.content.record_at(entry.shard, entry.offset)
    flip_byte(tmp_path / "b" / "shard-00000000", record.stored_offset + 3)
    with Bundle(tmp_path / "b") as b:
        with pytest.raises(CorruptDataError, match="1.b"):
            list(b.iter_samples())
        got = dict(b.iter_samples(on_error="skip"))
        assert {k: sorted(m) for k, m in got.items()} == {
            "0": ["a", "b"],
            "1": ["a"],
            "2": ["a", "b"],
        }
        assert got["1"]["a"] == spec["1.a"]
