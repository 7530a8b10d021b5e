"""What ``bundlefs pack`` says when it is done: the one-line summary, the reuse line of a pack on a
base (``--base``) and its compaction line (``--compact``), the dedup line (``--dedup``), the
upload progress line and the exit status.

May import: the library layers, ``bundlefs.cli.output``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from bundlefs.cli.output import (
    EXIT_OK,
    EXIT_PACKED_CHANGED,
    EXIT_PACKED_SKIPPED,
    count,
    rate,
    ratio,
)
from bundlefs.core.units import format_size

if TYPE_CHECKING:
    from bundlefs.packing.options import BaseReuse, CompactSummary, PackSummary
    from bundlefs.storage.objectstore.upload_progress import UploadProgress


def summary_line(summary: PackSummary) -> str:
    """``packed 3 files, 1 dir, … into … stored bytes (ratio 2.10) in 0.05 s (…): DEST``."""
    from bundlefs.packing.sources.base import SourceErrors

    c = summary.config
    notes = []
    if summary.skipped:
        named = "" if len(summary.skipped) <= SourceErrors.NAMED else ", the first named"
        notes.append(f"{len(summary.skipped):,} skipped{named}")
    if summary.changed:
        notes.append(f"{len(summary.changed):,} changed while packing")
    note = f" ({', '.join(notes)}: see the warnings above)" if notes else ""
    if summary.upload_seconds is not None and summary.build_seconds is not None:
        # To a URL: the build's rate is the packer's, the upload's the link's; neither is the
        # other's, and the whole pack took both.
        timing = (
            f"in {summary.seconds:.2f} s (built in {summary.build_seconds:.2f} s, "
            f"{rate(c.data_bytes, summary.build_seconds)}; uploaded "
            f"{format_size(summary.uploaded_bytes)} in {summary.upload_seconds:.2f} s, "
            f"{rate(summary.uploaded_bytes, summary.upload_seconds)})"
        )
    else:
        timing = f"in {summary.seconds:.2f} s ({rate(c.data_bytes, summary.seconds)})"
    return (
        f"packed {count(c.file_count, 'file')}, {count(c.dir_count, 'dir')}, "
        f"{count(c.symlink_count, 'symlink')}, {count(c.hardlink_count, 'hard link')}, "
        + (f"{count(c.special_count, 'special file')}, " if c.special_count else "")
        + f"{count(c.data_bytes, 'byte')} into {count(summary.stored_bytes, 'stored byte')} "
        f"(ratio {ratio(c.data_bytes, summary.stored_bytes)}) {timing}: {summary.dest}{note}"
    )


def exit_status(summary: PackSummary) -> int:
    """0 only when the bundle holds SRC as it was: entries left out (4) weigh more than files
    that changed (3), whose bytes are in it, if not consistently. Either way it is published."""
    if summary.skipped:
        return EXIT_PACKED_SKIPPED
    if summary.changed:
        return EXIT_PACKED_CHANGED
    return EXIT_OK


def upload_line(u: UploadProgress) -> str:
    """``uploading: 120 MiB of 400 MiB (30%), 38.2 MB/s, 3 s, ETA 7 s``."""
    elapsed = time.monotonic() - u.started
    line = f"uploading: {format_size(u.bytes_done)} of {format_size(u.total_bytes)}"
    if u.total_bytes:
        line += f" ({100 * u.bytes_done // u.total_bytes}%)"
    line += f", {rate(u.bytes_done, elapsed)}, {elapsed:.0f} s"
    if u.bytes_done and u.bytes_done < u.total_bytes:
        line += f", ETA {(u.total_bytes - u.bytes_done) * elapsed / u.bytes_done:.0f} s"
    return line


def reuse_line(reuse: BaseReuse) -> str:
    """``reused 99,000 files (1.9 GB) from OLD, 10 read and found unchanged (2.0 MB), stored
    1,000 (20 MB); linked 3 of its 4 shards`` (``referenced``, ``copied on the store``: a base
    on an object store)."""
    line = (
        f"reused {count(reuse.reused_files, 'file')} ({format_size(reuse.reused_bytes)}) "
        f"from {reuse.base}"
    )
    if reuse.same_files:
        line += f", {reuse.same_files:,} read and found unchanged ({format_size(reuse.same_bytes)})"
    line += f", stored {reuse.stored_files:,} ({format_size(reuse.stored_bytes)})"
    total = reuse.shards_linked + reuse.shards_left
    # On an object store the shards are referenced where they are, or copied there (issue 26).
    verb = {"reference": "referenced", "server-side copy": "copied on the store"}.get(
        next(iter(reuse.ways), ""), "linked"
    )
    line += f"; {verb} {reuse.shards_linked:,} of its {count(total, 'shard')}"
    if reuse.unrecorded_files:
        line += (
            f"; --check strict compared {count(reuse.unrecorded_files, 'file')} by content "
            "(OLD has no source record of them)"
        )
    return line


def compaction_line(done: CompactSummary) -> str:
    """``compacted: 4 shards rewritten into 2 (83 records copied), 16 kept, 16 dropped; dead
    bytes 3.4 MiB -> 656 KiB`` (dropped: no live record left, never copied)."""
    before, after = done.before.dead_bytes, done.dead_bytes
    return (
        f"compacted: {count(done.rewritten - done.dropped, 'shard')} rewritten into "
        f"{done.written:,} ({count(done.records_copied, 'record')} copied), {done.kept:,} kept, "
        f"{done.dropped:,} dropped; dead bytes {format_size(before)} -> {format_size(after)}"
    )


def dedup_line(files: int, size: int) -> str:
    """``dedup: 30,000 files (600.0 MB) share an earlier file's content, stored once``."""
    return f"dedup: {count(files, 'file')} ({format_size(size)}) share an earlier file's content"
