"""``verify``'s file phase: every regular file read whole, its CRC32C checked and (format version
5) its digest recomputed from the same bytes.

A file is damaged when its own bytes fail (CRC, decompression, a missing shard) or when it shares
a record the shard phase found damaged; a damaged file's every name (its hard links) is named.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.read``.
"""

from __future__ import annotations

from collections.abc import Callable

from bundlefs.core import format as fmt
from bundlefs.core.checksum import ContentDigest
from bundlefs.errors import BundleError, CorruptDataError, FormatError
from bundlefs.read.content import ContentReader
from bundlefs.read.tree import TreeModel
from bundlefs.read.verify.report import Findings
from bundlefs.read.verify.shards import ShardScan
from bundlefs.read.verify.tree import UNMAP_EVERY, InodeTable


def check_files(
    tree_model: TreeModel,
    content: ContentReader,
    table: InodeTable,
    shards: ShardScan,
    findings: Findings,
    unmap: Callable[[], None] | None = None,
) -> None:
    """Read every file the entry phase found (in the shards checked), noting each damaged one
    under all its names; ``unmap`` is called every ``UNMAP_EVERY`` inodes (the index's mapped
    pages out of the resident set)."""
    n = table.entry_count
    for ino in range(1, n + 1):
        findings.tick("files", ino, n)
        if unmap is not None and not ino % UNMAP_EVERY:
            unmap()
        if not table.is_file(ino):
            continue
        try:
            entry = tree_model.stored_entry(ino)
        except FormatError:
            continue  # reported by the entry scan
        if not shards.selected(entry.shard):
            continue  # its bytes are in a shard not checked (``verify --shard``)
        findings.report.files_checked += 1
        path = table.path(ino)
        message = _file_problem(content, shards, entry, path)
        if message is not None:
            findings.damaged_files.add(path)
            for link in table.links_to(ino):
                findings.damaged_files.add(table.path(link))
            findings.problem("file", f"{path}: {message}", path=path, shard=entry.shard)


def _file_problem(
    content: ContentReader, shards: ShardScan, entry: fmt.Entry, path: str
) -> str | None:
    """Why the file is damaged, or None."""
    stream_size = shards.stream_sizes.get(entry.shard)
    if stream_size is None:
        return f"stored in shard {entry.shard}, which does not exist or is unreadable"
    if entry.offset + entry.size > stream_size:
        return f"extends past the end of shard {entry.shard}'s stream"
    message = None
    digest = ContentDigest() if entry.digest else None
    try:
        for piece in content.iter_content(entry, path):
            # Its CRC is checked as it is read; the records' bytes are counted above.
            if digest is not None:
                digest.update(piece)
        if digest is not None and digest.digest() != entry.digest:
            message = f"its content does not match its {fmt.DIGEST_NAME} digest"
    except CorruptDataError as e:
        message = e.detail + (f" (shard {e.shard})" if e.shard is not None else "")
        if e.record is not None:
            message = f"{e.detail} (shard {e.shard}, record at stream offset {e.record:,})"
    except (BundleError, OSError) as e:
        message = str(e)
    bad = shards.bad.overlapping(entry.shard, entry.offset, entry.offset + entry.size)
    if message is None and bad is not None:
        # Its own bytes check out, but it shares a damaged record: name it all the same.
        message = f"shares a damaged record (shard {entry.shard}, stream offset {bad[0]:,})"
    return message
