"""``pack(SRC, NEW, base=OLD)``: a complete bundle of SRC that reuses OLD's stored bytes for every
file that did not change, stores only what did, and never modifies OLD.

Every NEW is compared with its source tree entry by entry (extracted, then ``snapshot``), and
verified; OLD's files are compared byte for byte before and after.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bundlefs import Bundle, PackOptions, pack
from bundlefs.core import format as fmt
from bundlefs.errors import PackError
from bundlefs.read.extract import extract
from bundlefs.read.verify import verify
from tests.conftest import bundle_file_bytes, flip_byte
from tests.support.legacy_trees import V1_PACK_OPTIONS, V4_BUNDLE, build_v1_tree
from tests.support.trees import MTIME_NS, build_rich_tree, set_mtimes, snapshot

OLD_NS = MTIME_NS  # 2020: far outside the racy window of a pack made now


def _tree(root: Path, files: int = 40, seed: int = 1) -> Path:
    """``files`` files of 1 byte to 40 KiB in 4 directories, one of 3 MiB (read in chunks, not
    ahead), all with mtime OLD_NS."""
    rng = random.Random(seed)
    for i in range(files):
        path = root / f"d{i % 4}" / f"f{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(1, 40_000)))
    (root / "large.bin").write_bytes(rng.randbytes(3 * 2**20))
    set_mtimes(root, OLD_NS)
    return root


def _same_as(bundle: Path, tree: Path, scratch: Path) -> bool:
    """Whether ``bundle`` extracts to exactly ``tree`` (modes, mtimes, content, links)."""
    out = scratch / f"x-{time.monotonic_ns()}"
    with Bundle(bundle) as b:
        extract(b, out)
    same = snapshot(out) == snapshot(tree)
    shutil.rmtree(out)
    return same


def _pack(src: Path, dest: Path, base: Path | None = None, **options):
    return pack(str(src), str(dest), PackOptions(**options), base=base)


def test_nothing_changed_reuses_every_file_and_writes_no_shard(tmp_path: Path) -> None:
    src = build_rich_tree(tmp_path / "src")
    _pack(src, tmp_path / "old")
    summary = _pack(src, tmp_path / "new", tmp_path / "old")
    assert summary.reuse is not None
    assert (summary.reuse.stored_files, summary.reuse.same_files) == (0, 0)
    assert summary.reuse.reused_files > 0
    assert summary.stored_bytes == 0
    old_shard = os.stat(tmp_path / "old" / fmt.shard_filename(0))
    assert os.stat(tmp_path / "new" / fmt.shard_filename(0)).st_ino == old_shard.st_ino
    assert _same_as(tmp_path / "new", src, tmp_path)
    assert verify(tmp_path / "new").ok


def test_a_changed_file_is_stored_and_the_others_reused(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    _pack(src, tmp_path / "old")
    (src / "d1" / "f001.bin").write_bytes(b"changed content")
    summary = _pack(src, tmp_path / "new", tmp_path / "old")
    assert summary.reuse.stored_files == 1
    assert summary.reuse.reused_files == 40
    assert _same_as(tmp_path / "new", src, tmp_path)
    assert verify(tmp_path / "new").ok


def test_a_touched_file_is_read_and_stores_nothing(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    _pack(src, tmp_path / "old")
    os.utime(src / "d2" / "f002.bin", ns=(OLD_NS, OLD_NS + 5))
    os.utime(src / "large.bin", ns=(OLD_NS, OLD_NS + 5))
    summary = _pack(src, tmp_path / "new", tmp_path / "old")
    assert (summary.reuse.same_files, summary.reuse.stored_files) == (2, 0)
    assert summary.stored_bytes == 0
    with Bundle(tmp_path / "new") as b:
        assert b.lstat("large.bin").st_mtime_ns == OLD_NS + 5
    assert _same_as(tmp_path / "new", src, tmp_path)


def test_metadata_comes_from_the_source_even_when_content_is_reused(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    _pack(src, tmp_path / "old")
    os.chmod(src / "d0" / "f000.bin", 0o600)
    summary = _pack(src, tmp_path / "new", tmp_path / "old")
    assert summary.reuse.stored_files == 0
    with Bundle(tmp_path / "new") as b:
        assert b.lstat("d0/f000.bin").st_mode & 0o777 == 0o600


def test_a_same_size_same_mtime_rewrite_inside_the_racy_window_is_found(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "label.txt").write_bytes(b"cat")
    _pack(src, tmp_path / "old")  # just written: its mtime is within 2 s of OLD's creation
    st = os.stat(src / "label.txt")
    (src / "label.txt").write_bytes(b"dog")
    os.utime(src / "label.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    _pack(src, tmp_path / "new", tmp_path / "old")
    with Bundle(tmp_path / "new") as b:
        assert b.read("label.txt") == b"dog"


def test_check_content_finds_a_same_size_same_mtime_rewrite_outside_the_window(
    tmp_path: Path,
) -> None:
    src = _tree(tmp_path / "src")
    _pack(src, tmp_path / "old")
    path = src / "large.bin"
    data = bytearray(path.read_bytes())
    data[2_500_000] ^= 1
    path.write_bytes(bytes(data))
    os.utime(path, ns=(OLD_NS, OLD_NS))
    summary = _pack(src, tmp_path / "new", tmp_path / "old", check="content")
    assert (summary.reuse.stored_files, summary.reuse.same_files) == (1, 40)
    assert _same_as(tmp_path / "new", src, tmp_path)


def test_shards_only_deleted_files_used_are_not_linked(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    _pack(src, tmp_path / "old", shard_size=2**20)
    with Bundle(tmp_path / "old") as b:
        shard = b.resolve("large.bin").shard
    (src / "large.bin").unlink()
    summary = _pack(src, tmp_path / "new", tmp_path / "old")
    assert summary.reuse.shards_left >= 1
    old_ino = os.stat(tmp_path / "old" / fmt.shard_filename(shard)).st_ino
    new_shard = os.stat(tmp_path / "new" / fmt.shard_filename(shard))
    assert new_shard.st_ino != old_ino and new_shard.st_size < 2**16
    assert _same_as(tmp_path / "new", src, tmp_path)
    assert verify(tmp_path / "new").ok


def test_the_base_is_never_modified(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    _pack(src, tmp_path / "old")
    before = bundle_file_bytes(tmp_path / "old")
    (src / "d3" / "new.txt").write_bytes(b"new")
    shutil.rmtree(src / "d0")
    _pack(src, tmp_path / "new", tmp_path / "old")
    assert bundle_file_bytes(tmp_path / "old") == before
    assert verify(tmp_path / "old").ok


def _change(rng: random.Random, root: Path) -> None:
    """One random change of the tree: rewrite (same size, keeping a fresh file's mtime), grow,
    touch, delete, add, rename or chmod."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    path = rng.choice(files)
    kind = rng.choice(["same-size", "grow", "touch", "delete", "add", "rename", "chmod"])
    st = path.stat()
    if kind == "same-size" and st.st_size:
        data = bytearray(path.read_bytes())
        data[rng.randrange(len(data))] ^= 0xFF
        path.write_bytes(bytes(data))
        if st.st_mtime_ns > time.time_ns() - 10**9:
            # Written less than a second before the last pack: the same mtime again, which only
            # the racy window catches (an older file keeps its stat only in a --check content
            # world).
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif kind == "grow":
        with path.open("ab") as f:
            f.write(b"+")
    elif kind == "touch":
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    elif kind == "delete":
        path.unlink()
    elif kind == "add":
        (path.parent / f"n{rng.randrange(10**6)}").write_bytes(rng.randbytes(rng.randint(0, 9000)))
    elif kind == "rename":
        path.rename(path.parent / f"r{rng.randrange(10**6)}")
    else:
        path.chmod(0o600 if st.st_mode & 0o77 else 0o644)


@pytest.mark.parametrize("seed", range(3))
def test_random_changes_in_a_chain_of_five_generations_are_never_missed(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    src = _tree(tmp_path / "src", files=60, seed=seed)
    for p in sorted(src.rglob("*.bin"))[::2]:  # half inside the racy window, half far outside
        os.utime(p)
    bundles = [tmp_path / "g0"]
    _pack(src, bundles[0])
    copies = [tmp_path / "t0"]
    subprocess.run(["cp", "-a", str(src), str(copies[0])], check=True)
    for generation in range(1, 5):
        for _ in range(rng.randint(3, 12)):
            _change(rng, src)
        bundles.append(tmp_path / f"g{generation}")
        _pack(src, bundles[-1], bundles[-2], shard_size=2**20)
        copies.append(tmp_path / f"t{generation}")
        subprocess.run(["cp", "-a", str(src), str(copies[-1])], check=True)
    for bundle, copy in zip(bundles, copies, strict=True):
        assert _same_as(bundle, copy, tmp_path), bundle.name
        assert verify(bundle).ok, bundle.name


def test_a_chained_bundle_reads_without_its_bases(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    _pack(src, tmp_path / "g0")
    (src / "d0" / "f000.bin").write_bytes(b"one")
    _pack(src, tmp_path / "g1", tmp_path / "g0")
    (src / "d1" / "f001.bin").write_bytes(b"two")
    _pack(src, tmp_path / "g2", tmp_path / "g1")
    shutil.rmtree(tmp_path / "g0")
    shutil.rmtree(tmp_path / "g1")
    assert verify(tmp_path / "g2").ok
    assert _same_as(tmp_path / "g2", src, tmp_path)


def test_a_zstd_base_under_an_lz4_pack_makes_a_bundle_that_says_it_needs_zstd(
    tmp_path: Path,
) -> None:
    pytest.importorskip("zstandard")
    src = _tree(tmp_path / "src")
    _pack(src, tmp_path / "old", compression="zstd")
    (src / "d0" / "f000.bin").write_bytes(b"lz4 now")
    summary = _pack(src, tmp_path / "new", tmp_path / "old")
    assert summary.config.compression == fmt.COMPRESSION_ZSTD
    assert _same_as(tmp_path / "new", src, tmp_path)


def test_a_missing_base_is_one_sentence(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", files=2)
    with pytest.raises(PackError, match=r"^the base .*nope is not a bundle \(no such directory\)$"):
        _pack(src, tmp_path / "new", tmp_path / "nope")
    assert not (tmp_path / "new").exists()


def test_a_base_that_is_not_a_bundle_is_one_sentence(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", files=2)
    (tmp_path / "plain").mkdir()
    with pytest.raises(PackError, match=r"^the base .*plain is not a bundle that can be read"):
        _pack(src, tmp_path / "new", tmp_path / "plain")


def test_an_object_store_base_is_refused_for_now(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", files=2)
    with pytest.raises(PackError, match="a base must be a local bundle for now"):
        _pack(src, tmp_path / "new", "s3://bucket/old.bundle")


def test_a_dest_that_is_the_base_is_refused(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", files=2)
    _pack(src, tmp_path / "old")
    with pytest.raises(PackError, match="overlaps the base"):
        _pack(src, tmp_path / "old", tmp_path / "old", force=True)
    assert verify(tmp_path / "old").ok


def test_an_archive_source_on_a_base_is_refused(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", files=2)
    _pack(src, tmp_path / "old")
    subprocess.run(["tar", "cf", str(tmp_path / "t.tar"), "-C", str(src), "."], check=True)
    with pytest.raises(PackError, match="needs one directory SRC"):
        pack(str(tmp_path / "t.tar"), str(tmp_path / "new"), base=tmp_path / "old")


def test_a_base_whose_shard_was_replaced_is_refused_in_one_sentence(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", files=4)
    _pack(src, tmp_path / "old")
    _pack(src, tmp_path / "other", created_ns=OLD_NS + 1)
    shard = fmt.shard_filename(0)
    os.unlink(tmp_path / "old" / shard)
    shutil.copy(tmp_path / "other" / shard, tmp_path / "old" / shard)
    with pytest.raises(PackError, match="is not the shard its bundle's index describes"):
        _pack(src, tmp_path / "new", tmp_path / "old")
    assert not (tmp_path / "new").exists()


def _damage(bundle: Path, path: str) -> None:
    """Flip a byte inside the stored record that holds the start of ``path``'s bytes."""
    with Bundle(bundle) as b:
        entry = b.resolve(path)
        record = next(r for r in b.content.records(entry.shard) if r.end > entry.offset)
    flip_byte(bundle / fmt.shard_filename(entry.shard), record.stored_offset + 100)


def test_a_touched_file_of_a_base_without_digests_whose_bytes_are_damaged_is_stored_anew(
    tmp_path: Path,
) -> None:
    src = build_v1_tree(tmp_path / "src")
    old = tmp_path / "old"
    shutil.copytree(V4_BUNDLE, old)  # version 4: no digest, OLD's bytes are what is compared
    _damage(old, "d1/f02.bin")
    os.utime(src / "d1" / "f02.bin", ns=(OLD_NS, OLD_NS + 1))
    summary = _pack(src, tmp_path / "new", old, **V1_PACK_OPTIONS)
    # The fixture's files lie in its racy window: every one is compared, one found damaged.
    assert (summary.reuse.same_files, summary.reuse.stored_files) == (19, 1)
    assert summary.reuse.digest_compared == 0
    assert _same_as(tmp_path / "new", src, tmp_path)


def test_check_content_on_a_base_without_digests_reads_its_bytes(tmp_path: Path) -> None:
    src = build_v1_tree(tmp_path / "src")
    summary = _pack(src, tmp_path / "new", V4_BUNDLE, check="content", **V1_PACK_OPTIONS)
    assert summary.reuse.same_files == 20 and summary.reuse.digest_compared == 0
    assert _same_as(tmp_path / "new", src, tmp_path)


def test_check_content_compares_digests_and_reads_no_byte_of_the_base(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", files=4)
    _pack(src, tmp_path / "old")
    _damage(tmp_path / "old", "large.bin")  # read, OLD's bytes would differ from SRC's
    _damage(tmp_path / "old", "d0/f000.bin")
    summary = _pack(src, tmp_path / "new", tmp_path / "old", check="content")
    assert (summary.reuse.same_files, summary.reuse.stored_files) == (5, 0)
    assert summary.reuse.digest_compared == 5


def test_check_content_by_digest_finds_a_same_size_rewrite(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", files=4)
    _pack(src, tmp_path / "old")
    for name in ("large.bin", "d1/f001.bin"):
        data = bytearray((src / name).read_bytes())
        data[len(data) // 2] ^= 1
        (src / name).write_bytes(bytes(data))
        os.utime(src / name, ns=(OLD_NS, OLD_NS))
    summary = _pack(src, tmp_path / "new", tmp_path / "old", check="content")
    assert (summary.reuse.same_files, summary.reuse.stored_files) == (3, 2)
    assert _same_as(tmp_path / "new", src, tmp_path)


def test_a_reused_entry_carries_the_bases_digest(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", files=4)
    _pack(src, tmp_path / "old")
    os.utime(src / "d2" / "f002.bin", ns=(OLD_NS, OLD_NS + 5))  # compared, not trusted by stat
    _pack(src, tmp_path / "new", tmp_path / "old")
    with Bundle(tmp_path / "old") as a, Bundle(tmp_path / "new") as b:
        for path in ("d2/f002.bin", "d0/f000.bin", "large.bin"):
            digest = hashlib.sha256((src / path).read_bytes()).digest()[:16]
            assert a.resolve(path).digest == b.resolve(path).digest == digest


def test_damage_in_a_shard_old_and_new_share_is_reported_by_verify_of_both(
    tmp_path: Path,
) -> None:
    src = _tree(tmp_path / "src")
    _pack(src, tmp_path / "old")
    (src / "d1" / "f001.bin").write_bytes(b"changed content")
    _pack(src, tmp_path / "new", tmp_path / "old")
    shared = tmp_path / "old" / fmt.shard_filename(0)
    assert os.stat(tmp_path / "new" / fmt.shard_filename(0)).st_ino == os.stat(shared).st_ino
    flip_byte(shared, 4096 + 10)  # the first record: the files at the start of the stored order
    old_report, new_report = verify(tmp_path / "old"), verify(tmp_path / "new")
    assert not old_report.ok and not new_report.ok
    assert new_report.damaged_files and "d1/f001.bin" not in new_report.damaged_files
    assert set(new_report.damaged_files) <= set(old_report.damaged_files)
