"""Mutation fuzzing: damaged shards, index and marker never crash, hang or lie (issue 5).

Each example copies a packed bundle, damages bytes of it (flip, overwrite, truncate, extend) and
hands it to a worker subprocess (``hostile.Prober``) that opens, walks, looks up, reads (whole and
at random offsets), verifies and extracts it under a memory limit and a time limit. Every read must
return the original bytes or raise a ``BundleError``; ``verify`` must not call a bundle intact that
failed to read. Example counts are small by default; ``BUNDLEFS_FUZZ_EXAMPLES`` (``make fuzz``)
raises them. A few cases also go through a real mount.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundlefs import PackOptions, pack
from bundlefs.core import format as fmt
from bundlefs.core.format.pages import PAGES_FILE
from tests.conftest import SAMPLE_FILES, SAMPLE_RECORD_SIZE
from tests.support.hostile import Prober, damage, report_line, reseal

EXAMPLES = int(os.environ.get("BUNDLEFS_FUZZ_EXAMPLES", "12"))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
OPS = ("flip", "overwrite", "truncate", "extend")


@pytest.fixture(scope="module")
def bundles(sample_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The sample tree packed two ways: lz4 over several shards, and uncompressed in one."""
    root = tmp_path_factory.mktemp("fuzz-bundles")
    out = []
    for name, options in (
        ("lz4", PackOptions(record_size=SAMPLE_RECORD_SIZE, shard_size=48 * 1024)),
        ("raw", PackOptions(record_size=SAMPLE_RECORD_SIZE, compression="none", block_size=512)),
    ):
        pack(str(sample_tree), str(root / name), options)
        out.append(root / name)
    return out


@pytest.fixture(scope="module")
def prober(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    p = Prober(tmp_path_factory.mktemp("fuzz-probe"))
    yield p
    p.close()
    report_line(request, "fuzz (damaged bytes): " + p.summary())


def _damaged_copy(original: Path) -> Path:
    work = Path(tempfile.mkdtemp(prefix="fuzz-"))
    copy = work / "b"
    shutil.copytree(original, copy)
    return copy


def _targets(bundle: Path) -> list[str]:
    shards = sorted(p.name for p in bundle.iterdir() if p.name.startswith(fmt.SHARD_PREFIX))
    index = [f"{fmt.INDEX_DIR}/{fmt.INDEX_FILE}", f"{fmt.INDEX_DIR}/{PAGES_FILE}"]
    return shards + index + [fmt.MARKER_NAME]


damages = st.tuples(
    st.sampled_from(OPS),
    st.integers(0, 2**20),  # offset, taken modulo the file size
    st.integers(1, 64),  # length of a flip or overwrite, bytes added by extend
    st.integers(0, 255),
)


def _check(prober: Prober, bundle: Path, sample_tree: Path, seed: int) -> None:
    try:
        violations = prober.probe(bundle, sample_tree, strict=True, seed=seed)
    finally:
        shutil.rmtree(bundle.parent, ignore_errors=True)
    assert violations == [], "\n".join(violations)


@FUZZ
@given(which=st.integers(0, 1), shard=st.integers(0, 10), how=damages)
def test_a_damaged_shard_reads_correctly_or_fails_with_a_bundle_error(
    bundles, prober, sample_tree, which, shard, how
):
    bundle = _damaged_copy(bundles[which])
    shards = _targets(bundle)[:-3]
    op, offset, length, byte = how
    damage(bundle / shards[shard % len(shards)], op, offset, length, byte)
    _check(prober, bundle, sample_tree, offset)


@FUZZ
@given(which=st.integers(0, 1), how=damages)
def test_a_damaged_index_file_is_refused_or_reads_correctly(
    bundles, prober, sample_tree, which, how
):
    bundle = _damaged_copy(bundles[which])
    op, offset, length, byte = how
    damage(bundle / fmt.INDEX_DIR / fmt.INDEX_FILE, op, offset, length, byte)
    _check(prober, bundle, sample_tree, offset)


@FUZZ
@given(which=st.integers(0, 1), how=damages)
def test_a_damaged_index_page_whose_checksums_were_made_to_agree_never_crashes_or_lies(
    bundles, prober, sample_tree, which, how
):
    # A hostile index (docs/format.md §3.10): the page table and the marker vouch for the
    # damaged pages, so only the page checks' decoding stands between them and LMDB.
    bundle = _damaged_copy(bundles[which])
    op, offset, length, byte = how
    damage(bundle / fmt.INDEX_DIR / fmt.INDEX_FILE, op, offset, length, byte)
    if op in ("flip", "overwrite"):
        reseal(bundle)
    _check(prober, bundle, sample_tree, offset)


@FUZZ
@given(which=st.integers(0, 1), how=damages)
def test_a_damaged_completion_marker_is_refused_or_reads_correctly(
    bundles, prober, sample_tree, which, how
):
    bundle = _damaged_copy(bundles[which])
    op, offset, length, byte = how
    damage(bundle / fmt.MARKER_NAME, op, offset, length, byte)
    _check(prober, bundle, sample_tree, offset)


@FUZZ
@given(
    which=st.integers(0, 1),
    hits=st.lists(st.tuples(st.integers(0, 20), damages), min_size=2, max_size=5),
)
def test_several_damages_at_once_never_crash_or_lie(bundles, prober, sample_tree, which, hits):
    bundle = _damaged_copy(bundles[which])
    targets = _targets(bundle)
    for target, (op, offset, length, byte) in hits:
        damage(bundle / targets[target % len(targets)], op, offset, length, byte)
    _check(prober, bundle, sample_tree, len(hits))


def test_the_prober_reports_an_intact_bundle_as_clean(bundles, prober, sample_tree):
    for bundle in bundles:
        assert prober.probe(bundle, sample_tree, strict=True) == []


def test_the_prober_catches_wrong_bytes(bundles, sample_tree, tmp_path):
    # The probe itself must be able to fail: against a different source tree, reads "lie".
    other = tmp_path / "other"
    shutil.copytree(sample_tree, other, symlinks=True)
    (other / "hello.txt").write_bytes(b"something else\n")
    own = Prober(tmp_path)
    try:
        violations = own.probe(bundles[0], other, strict=True)
    finally:
        own.close()
    assert any("wrong bytes reading b'hello.txt'" in v for v in violations)


# --- through a real mount -------------------------------------------------------------------------


def _record_of(bundle: Path, path: str):
    from bundlefs import Bundle

    with Bundle(bundle) as b:
        entry = b.resolve(path)
        return b.content.record_at(entry.shard, entry.offset)


@pytest.mark.mount
def test_a_damaged_record_gives_eio_on_its_file_and_the_rest_of_the_mount_works(
    bundles, mount_bundle, copy_bundle
):
    from bundlefs import Bundle

    bundle = copy_bundle(bundles[0])
    record = _record_of(bundle, "noise.bin")
    with Bundle(bundle) as b:  # every file with bytes in that record (small files share records)
        sharing = {
            p
            for p in SAMPLE_FILES
            if (e := b.resolve(p)).shard == record.shard
            and e.size
            and e.offset < record.end
            and record.offset < e.offset + e.size
        }
    damage(bundle / fmt.shard_filename(record.shard), "flip", record.stored_offset + 100)
    m = mount_bundle(bundle, allowed_log=[r"damaged data, read failed with EIO"])
    with pytest.raises(OSError) as raised:
        (m.mountpoint / "noise.bin").read_bytes()
    assert raised.value.errno == errno.EIO
    for path, content in SAMPLE_FILES.items():
        if path not in sharing:
            assert (m.mountpoint / path).read_bytes() == content, path
    assert m.process.poll() is None


@pytest.mark.mount
def test_a_truncated_shard_gives_eio_past_the_cut_and_the_right_bytes_before_it(
    bundles, mount_bundle, copy_bundle
):
    from bundlefs import Bundle

    bundle = copy_bundle(bundles[1])  # one shard, every record stored raw
    cut = _record_of(bundle, "noise.bin")
    with Bundle(bundle) as b:
        before = {
            p for p in SAMPLE_FILES if b.resolve(p).offset + len(SAMPLE_FILES[p]) <= cut.offset
        }
    assert before and "noise.bin" not in before
    os.truncate(bundle / fmt.shard_filename(cut.shard), cut.stored_offset + 10)
    m = mount_bundle(bundle, allowed_log=[r"damaged data, read failed with EIO"])
    for path in before:
        assert (m.mountpoint / path).read_bytes() == SAMPLE_FILES[path], path
    with pytest.raises(OSError) as raised:
        (m.mountpoint / "noise.bin").read_bytes()
    assert raised.value.errno == errno.EIO
    assert m.process.poll() is None
