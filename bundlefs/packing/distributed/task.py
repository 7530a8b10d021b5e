"""One task of a distributed pack: ``pack_partition`` packs one ``Partition`` into its own
complete bundle, ``AREA/part-NNNNN``, wherever the executor runs it.

It is an ordinary ``pack`` of a ``PartitionSource`` (on the base bundle, for a pack on a base:
its unchanged files reuse the base's records, the base's shards described at their own numbers
before the partition's own but not linked: only the merge on the base reads such a partial
bundle), of the partition's share of an object listing, or of its run of tar shards; it stops
at its next progress tick once the driver marks the area aborted. A retried task finds what a
killed attempt left (an unlocked ``.part-NNNNN.partial-PID``) and ``publish.stage`` removes it.
What it reports back (``PartResult``) is small, whatever the partition held.

May import: ``bundlefs.storage``, ``bundlefs.packing`` below it (``options``, ``sources``,
``user_data``, ``delta``, ``packer``, ``distributed``'s ``plan``, ``source``, ``area``).
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

from bundlefs.packing.delta_base import Base
from bundlefs.packing.distributed.area import check_area
from bundlefs.packing.distributed.plan import Partition
from bundlefs.packing.distributed.source import PartitionSource
from bundlefs.packing.options import BaseReuse, PackOptions, PackProgress, PackSource
from bundlefs.packing.packer import pack
from bundlefs.packing.sources.base import SourceErrors
from bundlefs.packing.sources.objects import ObjectSource
from bundlefs.packing.user_data import UserDataFile
from bundlefs.storage.location import Location

PART_NAME = "part-%05d"


@dataclass(frozen=True)
class PartTask:
    """What one task packs (``source``: the directory, or None for archives and objects) and
    where to. ``prefix``: the object store's location (its storage options travel with it, out
    of the repr), and ``owner`` the driver's uid and gid, which every object is given."""

    partition: Partition
    source: str | None
    area: str  # the staging area (shared storage: the driver and every worker see it)
    token: str  # what the driver wrote in the area's TOKEN file
    prefix: Location | None = None
    owner: tuple[int, int] | None = None
    base: str | None = None  # a pack on a base: the base bundle (a local path every worker sees)

    @property
    def dest(self) -> str:
        return os.path.join(self.area, PART_NAME % self.partition.index)


@dataclass(frozen=True)
class PartResult:
    """What a task reports back: small, whatever the partition held."""

    index: int
    dest: str
    files: int
    dirs: int
    data_bytes: int
    stored_bytes: int
    seconds: float
    host: str
    skipped: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    user_data_used: frozenset[bytes] = frozenset()
    reuse: BaseReuse | None = None  # a pack on a base: what it took from the base


class _AbortCheck:
    """The partition pack's progress callback: stops it once the driver has marked the area
    aborted, or the area is gone (at most every 0.2 s: ``pack``'s progress throttle)."""

    def __init__(self, task: PartTask) -> None:
        self.task = task

    def __call__(self, _progress: PackProgress) -> None:
        check_area(self.task.area, self.task.token)


def pack_partition(task: PartTask, options: PackOptions) -> PartResult:
    """Pack one partition into ``task.dest`` (a complete bundle of its own); runs on a worker.

    ``options`` are the distributed pack's, as the driver fixed them (the creation time, no
    bundle metadata: that goes to the merge). A partial left by an attempt that was killed is
    removed (``publish.stage``); one a killed attempt had already published is replaced.
    """
    check_area(task.area, task.token)
    options = dataclasses.replace(options, force=True, storage_options=None, staging=None)
    source, pool = _source(task, options)
    # On a base: OLD's shards are described in the partial bundle, not linked into it; the
    # merge links those used, once. 16 tasks on a base of 191 shards, 4,000 files unchanged:
    # 11.4 s with each task linking its used shards and writing a stand-in for every other,
    # 1.8 s so (a full dask pack: 2.8 s; load ~12 on 2 cores).
    base = None if task.base is None else Base(task.base, task.dest, options, linked=False)
    try:
        summary = pack(source, task.dest, options, progress=_AbortCheck(task), base=base)
    finally:
        if base is not None:
            base.close()  # pack closed it, unless it failed first
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    used: frozenset[bytes] = frozenset()
    if isinstance(options.user_data, UserDataFile):
        used = frozenset(options.user_data.used)
    c = summary.config
    return PartResult(
        index=task.partition.index,
        dest=task.dest,
        files=c.file_count,
        dirs=c.dir_count,
        data_bytes=c.data_bytes,
        stored_bytes=summary.stored_bytes,
        seconds=summary.seconds,
        host=os.uname().nodename,
        skipped=tuple(summary.skipped),
        changed=tuple(summary.changed),
        user_data_used=used,
        reuse=summary.reuse,
    )


def _source(task: PartTask, options: PackOptions) -> tuple[PackSource, Executor | None]:
    """What the task packs, and the thread pool it reads with (the caller shuts it down)."""
    errors = SourceErrors(options.skip_errors)
    pool = None
    source: PackSource
    if task.prefix is not None:
        # The objects' fetchers: small objects are fetched ahead as in a single-machine pack.
        pool = ThreadPoolExecutor(options.jobs) if options.jobs > 1 else None
        assert options.created_ns is not None  # fixed by the driver
        source = ObjectSource(
            task.prefix,
            errors,
            created_ns=options.created_ns,
            excludes=options.excludes,
            pool=pool,
            owner=task.owner,
            objects=task.partition.objects,
        )
    elif task.source is not None:
        # The source's own readers (pack() makes its pool for the source only when it walks
        # a directory itself): reads overlap as in a single-machine pack.
        pool = ThreadPoolExecutor(options.jobs) if options.jobs > 1 else None
        source = PartitionSource(
            task.source, task.partition, errors, excludes=options.excludes, pool=pool
        )
    else:
        source = list(task.partition.archives)
    return source, pool
