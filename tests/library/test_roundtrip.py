"""Pack → read round trips over generated trees: whatever tree hypothesis builds, ``Bundle`` reports
the same names, kinds, sizes, modes, mtimes, link targets and bytes as the source file system."""

from __future__ import annotations

import os
import stat
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundlefs import Bundle, PackOptions, pack
from tests.conftest import HardLink, Symlink, build_tree

SETTINGS = settings(
    derandomize=True,
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Names: any bytes but "/" and NUL, 1–40 long, never "." or "..".
names = st.binary(min_size=1, max_size=40).filter(
    lambda n: b"/" not in n and b"\0" not in n and n not in (b".", b"..")
)

# Content: mostly small; sometimes repetitive (compressible), all zeros or several records.
contents = st.one_of(
    st.binary(max_size=64),
    st.binary(min_size=1, max_size=16).map(lambda b: b * 700),
    st.integers(0, 20_000).map(bytes),
    st.binary(min_size=4097, max_size=9000),
)

symlink_targets = st.binary(min_size=1, max_size=60).filter(lambda t: b"\0" not in t)

trees = st.recursive(
    st.dictionaries(names, st.one_of(contents, symlink_targets.map(Symlink)), max_size=5),
    lambda children: st.dictionaries(
        names, st.one_of(contents, children, symlink_targets.map(Symlink)), max_size=5
    ),
    max_leaves=25,
)


def _files(spec: dict, prefix: bytes = b"") -> list[bytes]:
    out = []
    for name, value in spec.items():
        path = prefix + name
        if isinstance(value, dict):
            out += _files(value, path + b"/")
        elif isinstance(value, bytes):
            out.append(path)
    return out


@st.composite
def trees_with_links(draw) -> dict:
    """A tree, plus a few hard links to its files placed at the root."""
    spec = draw(trees.filter(lambda t: isinstance(t, dict)))
    files = _files(spec)
    if files:
        for i in range(draw(st.integers(0, 3))):
            name = b"hardlink-%d" % i
            if name not in spec:
                spec[name] = HardLink(draw(st.sampled_from(files)))
    return spec


def assert_same_tree(bundle: Bundle, root: bytes) -> None:
    """Every path of the source, compared with what the bundle says of it."""
    for top, dirs, files in os.walk(root):
        rel_top = os.path.relpath(top, root)
        rel_top = b"" if rel_top == b"." else rel_top
        assert bundle.listdir(rel_top) == sorted(dirs + files), rel_top
        for name in dirs + files:
            rel = os.path.join(rel_top, name) if rel_top else name
            want = os.lstat(os.path.join(top, name))
            got = bundle.lstat(rel)
            assert got.st_mode == want.st_mode, rel
            assert got.st_mtime_ns == want.st_mtime_ns, rel
            assert (got.st_uid, got.st_gid) == (want.st_uid, want.st_gid), rel
            if stat.S_ISLNK(want.st_mode):
                assert bundle.readlink(rel) == os.readlink(os.path.join(top, name)), rel
                assert got.st_size == want.st_size, rel
            elif stat.S_ISREG(want.st_mode):
                with open(os.path.join(top, name), "rb") as f:
                    assert bundle.read(rel) == f.read(), rel
                assert got.st_size == want.st_size, rel
                assert got.st_nlink == want.st_nlink, rel  # every name is inside the tree
            else:
                assert got.st_nlink == want.st_nlink, rel
                assert got.st_size == len(os.listdir(os.path.join(top, name))), rel


@SETTINGS
@given(spec=trees_with_links(), record_size=st.sampled_from([4096, 65536]))
def test_generated_trees_round_trip(spec: dict, record_size: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = build_tree(os.path.join(tmp, "src"), spec)
        dest = os.path.join(tmp, "b.bundle")
        pack(str(src), dest, PackOptions(record_size=record_size))
        with Bundle(dest) as b:
            assert_same_tree(b, os.fsencode(src))


@SETTINGS
@given(
    contents=st.lists(contents, min_size=1, max_size=12),
    compression=st.sampled_from(["lz4", "none"]),
    reads=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 30_000), st.integers(0, 10_000))),
)
def test_random_range_reads_match_the_source(
    contents: list[bytes], compression: str, reads: list[tuple[int, int, int]]
) -> None:
    spec = {b"f%02d" % i: data for i, data in enumerate(contents)}
    with tempfile.TemporaryDirectory() as tmp:
        src = build_tree(os.path.join(tmp, "src"), spec)
        dest = os.path.join(tmp, "b.bundle")
        pack(str(src), dest, PackOptions(record_size=4096, compression=compression))
        with Bundle(dest, cache_size=8192) as b:
            for which, start, size in reads:
                name = b"f%02d" % (which % len(contents))
                with b.open(name) as f:
                    f.seek(start)
                    assert f.read(size) == spec[name][start : start + size]
