"""``IndexWriter.put_copied_run``: a delta pack's run of unchanged files put at once writes the
very index bytes that a put each (``put_entry_value`` and ``put_source``) writes, whatever is
pending before it, however the run falls across batches and commits, with or without source
records; a source stat out of range is refused as ``fmt.encode_source`` refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bundlefs.core import format as fmt
from bundlefs.core.format.keys import entry_keys
from bundlefs.errors import FormatError
from bundlefs.storage.index_writer import IndexWriter

BATCH, COMMIT = IndexWriter.BATCH, IndexWriter.COMMIT_EVERY


def _values(count: int) -> list[bytes]:
    return [b"value %d " % i * (1 + i % 5) for i in range(count)]


def _write(
    path: Path,
    before: tuple[int, int],
    count: int,
    recorded: bool,
    *,
    at_once: bool,
) -> bytes:
    """An index of ``before`` (entries, source records) put one by one, then ``count`` files
    copied (a run at once, or a put each), then one more entry: its data.mdb."""
    index = IndexWriter(str(path))
    entries, sources = before
    for ino in range(1, entries + 1):
        index.put_entry_value(ino, b"directory %d" % ino)
        if ino <= sources:
            index.put_source(ino, ino, ino)
    first, values = entries + 1, _values(count)
    ctimes = [10**18 + i for i in range(count)] if recorded else None
    inodes = [2**63 + i for i in range(count)]
    if at_once:
        index.put_copied_run(first, values, ctimes, inodes)
    else:
        for i, value in enumerate(values):
            index.put_entry_value(first + i, value)
            if ctimes is not None:
                index.put_source(first + i, ctimes[i], inodes[i])
    index.put_entry_value(first + count, b"after the run")
    index.put_meta({"k": "v"})
    index.close()
    return (path / "data.mdb").read_bytes()


@pytest.mark.parametrize("recorded", [True, False], ids=["sources", "no-sources"])
@pytest.mark.parametrize(
    "before, count",
    [
        ((0, 0), 1),
        ((0, 0), BATCH),
        ((1, 0), BATCH * 3 + 7),  # entries one ahead of their source records
        ((BATCH - 1, 3), 2),  # the first file fills the entries' batch
        ((200, 200), BATCH - 200),  # both batches filled by the last file
        ((7, 2), COMMIT + BATCH + 1),  # across a commit
    ],
)
def test_a_run_put_at_once_writes_the_index_a_put_each_writes(
    tmp_path: Path, before: tuple[int, int], count: int, recorded: bool
) -> None:
    each = _write(tmp_path / "each", before, count, recorded, at_once=False)
    at_once = _write(tmp_path / "at-once", before, count, recorded, at_once=True)
    assert at_once == each


def test_a_run_with_a_source_stat_out_of_range_is_refused(tmp_path: Path) -> None:
    index = IndexWriter(str(tmp_path / "index"))
    try:
        with pytest.raises(FormatError, match="source stat out of range: ctime 0, inode -1"):
            index.put_copied_run(1, [b"a", b"b"], [0, 0], [5, -1])
    finally:
        index.abort()


def test_entry_keys_are_the_entry_key_of_each_inode_in_turn() -> None:
    assert entry_keys(7, 3) == [fmt.entry_key(7), fmt.entry_key(8), fmt.entry_key(9)]
    assert entry_keys(7, 0) == []
