"""``pack(SRC, NEW, base=OLD, compact=True)``: a pack on a base that is also compacted, in one
publish — NEW's shards are what ``compact`` makes of the plain pack on the base.

The base is the end of a chain of packs on bases with churn (a third of the files rewritten each
generation), so its shards hold many dead records and many small shards; NEW must drop them as
``compact`` would, read exactly as a full pack of SRC, never touch OLD, and, where nothing is
dead, link OLD's shards as a plain pack on the base does.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from bundlefs import Bundle, CompactOptions, PackOptions, compact, pack
from bundlefs.core import format as fmt
from bundlefs.errors import PackError
from bundlefs.read.verify import verify
from bundlefs.storage.index import IndexReader
from bundlefs.storage.liveness import Liveness, shard_liveness
from tests.conftest import bundle_file_bytes
from tests.support.trees import MTIME_NS

FILES = 120
OPTIONS = PackOptions(record_size=16 * 1024, shard_size=128 * 1024)


def _write(src: Path, i: int, rng: random.Random, generation: int) -> None:
    path = src / f"d{i % 4}" / f"f{i:03d}.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(rng.randbytes(rng.randint(500, 40_000)))
    mtime = MTIME_NS + generation  # years before any pack: outside the racy window
    os.utime(path, ns=(mtime, mtime))


def _churn(src: Path, rng: random.Random, generation: int) -> None:
    for i in rng.sample(range(FILES), FILES // 3):
        _write(src, i, rng, generation)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(SRC, OLD): OLD the fourth generation of packs on bases, SRC churned once more since."""
    root = tmp_path_factory.mktemp("delta-compact")
    src, rng = root / "src", random.Random(26)
    for i in range(FILES):
        _write(src, i, rng, 0)
    old = root / "g0.bundle"
    pack(str(src), str(old), OPTIONS)
    for generation in range(1, 4):
        _churn(src, rng, generation)
        new = root / f"g{generation}.bundle"
        pack(str(src), str(new), OPTIONS, base=old)
        old = new
    _churn(src, rng, 4)
    return src, old


def _liveness(bundle: Path, min_live: float = 0.5) -> Liveness:
    reader = IndexReader(str(bundle))
    try:
        return Liveness.of(shard_liveness(reader), min_live)
    finally:
        reader.close()


def _contents(bundle: Path) -> dict[str, tuple]:
    """Every path with its stat and content (or target)."""
    out = {}
    with Bundle(bundle) as b:
        for path, entry in b.tree:
            data = b.read(path) if entry.is_file and not entry.is_symlink else b""
            out[path] = (b.lstat(path), data)
    return out


def test_the_base_has_dead_bytes_to_compact(chain) -> None:
    dead = _liveness(chain[1])
    assert dead.sparse_shards > 0 and dead.dead_bytes > 0


def test_no_shard_is_below_the_threshold_after_a_compacting_pack(chain, tmp_path) -> None:
    src, old = chain
    new = tmp_path / "new.bundle"
    summary = pack(str(src), str(new), OPTIONS, base=old, compact=True)
    after = _liveness(new)
    assert after.sparse_shards == 0
    assert after.dead_bytes / after.stored_bytes < 1 - OPTIONS.min_live
    assert summary.compaction is not None and summary.compaction.dead_bytes == after.dead_bytes


def test_a_compacting_pack_reads_as_a_full_pack_of_the_source(chain, tmp_path) -> None:
    src, old = chain
    new, full = tmp_path / "new.bundle", tmp_path / "full.bundle"
    pack(str(src), str(new), OPTIONS, base=old, compact=True)
    pack(str(src), str(full), OPTIONS)
    assert _contents(new) == _contents(full)
    report = verify(new)
    assert report.ok, report.problems


def test_its_shards_are_what_compact_makes_of_the_plain_pack_on_the_base(chain, tmp_path) -> None:
    src, old = chain
    new, plain = tmp_path / "new.bundle", tmp_path / "plain.bundle"
    pack(str(src), str(new), OPTIONS, base=old, compact=True)
    pack(str(src), str(plain), OPTIONS, base=old)
    compact(
        plain, str(tmp_path / "compacted.bundle"), CompactOptions(shard_size=OPTIONS.shard_size)
    )
    sizes = [
        sorted(p.stat().st_size for p in b.glob("shard-*"))
        for b in (new, tmp_path / "compacted.bundle")
    ]
    assert sizes[0] == sizes[1]


def test_the_base_is_never_modified_by_a_compacting_pack(chain, tmp_path) -> None:
    src, old = chain
    before = bundle_file_bytes(old)
    pack(str(src), str(tmp_path / "new.bundle"), OPTIONS, base=old, compact=True)
    assert bundle_file_bytes(old) == before
    assert verify(old).ok


def test_the_shards_it_writes_are_its_own_and_the_bases_are_links(chain, tmp_path) -> None:
    src, old = chain
    new = tmp_path / "new.bundle"
    summary = pack(str(src), str(new), OPTIONS, base=old, compact=True)
    old_inodes = {p.stat().st_ino for p in old.glob("shard-*")}
    reader = IndexReader(str(new))
    try:
        own = {
            s
            for s in range(reader.config.shard_count)
            if reader.shard_info(s).header_id == fmt.OWN_BUNDLE_ID
        }
    finally:
        reader.close()
    for shard in range(summary.config.shard_count):
        st = (new / fmt.shard_filename(shard)).stat()
        assert (st.st_ino in old_inodes) == (shard not in own)
        assert shard not in own or st.st_nlink == 1
    assert (
        summary.reuse is not None
        and summary.reuse.shards_linked == summary.config.shard_count - len(own)
    )
    assert summary.stored_bytes == sum((new / fmt.shard_filename(s)).stat().st_size for s in own)


def test_nothing_is_left_but_the_bundle(chain, tmp_path) -> None:
    src, old = chain
    pack(str(src), str(tmp_path / "new.bundle"), OPTIONS, base=old, compact=True)
    assert [p.name for p in tmp_path.iterdir()] == ["new.bundle"]
    names = {p.name for p in (tmp_path / "new.bundle").iterdir()}
    assert names == {fmt.INDEX_DIR, fmt.MARKER_NAME} | {
        p.name for p in (tmp_path / "new.bundle").glob("shard-*")
    }


def test_with_nothing_dead_it_links_like_a_plain_pack_on_the_base(chain, tmp_path) -> None:
    src, _old = chain
    base = tmp_path / "base.bundle"
    pack(str(src), str(base), PackOptions(record_size=16 * 1024))  # one shard, every byte live
    new, plain = tmp_path / "new.bundle", tmp_path / "plain.bundle"
    summary = pack(str(src), str(new), base=base, compact=True)
    pack(str(src), str(plain), base=base)
    assert summary.compaction is not None
    assert (summary.compaction.rewritten, summary.compaction.records_copied) == (0, 0)
    assert summary.stored_bytes == 0
    inodes = [{p.stat().st_ino for p in b.glob("shard-*")} for b in (base, new, plain)]
    assert inodes[0] == inodes[1] == inodes[2]
    assert _contents(new) == _contents(plain)


def test_compacting_without_a_base_is_refused(chain, tmp_path) -> None:
    with pytest.raises(PackError, match="a pack on a base"):
        pack(str(chain[0]), str(tmp_path / "new.bundle"), compact=True)
    assert list(tmp_path.iterdir()) == []


def test_a_min_live_that_is_not_a_fraction_is_refused(chain, tmp_path) -> None:
    src, old = chain
    with pytest.raises(PackError, match="not a fraction"):
        pack(
            str(src),
            str(tmp_path / "new.bundle"),
            PackOptions(min_live=1.5),
            base=old,
            compact=True,
        )
