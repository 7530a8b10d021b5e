"""The driver's side of a distributed pack: ``DistributedPack``.

The checks before anything runs (every check a pack makes before reading, so a bad DEST fails
before any task does), the staging area (a locked temporary directory, removed at the end
whatever happens), the plan and the tasks, and at the end the merge of the partial bundles
(``merge.merge``) and the publishing of the result at DEST. The executor that runs the tasks is
not here (``bundlefs.integrations.dask``). On a base bundle (``pack --base OLD --dask``) every
task packs its partition on OLD and the merge holds OLD's shards once (``merge(..., base=)``).

May import: ``bundlefs.errors``, ``bundlefs.storage``, ``bundlefs.packing`` (all of it below
``distributed``, and ``distributed``'s other modules).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from bundlefs.errors import PackError
from bundlefs.packing import merge as merging
from bundlefs.packing.delta_base import Base
from bundlefs.packing.destination import check_destination, object_prefix
from bundlefs.packing.distributed.area import remove_area, write_token
from bundlefs.packing.distributed.plan import Plan, plan_archives, plan_directory, plan_objects
from bundlefs.packing.distributed.task import PartResult, PartTask
from bundlefs.packing.options import (
    BaseReuse,
    PackOptions,
    PackSource,
    PackSummary,
    check_options,
)
from bundlefs.packing.sources.streams import STDIN
from bundlefs.packing.user_data import UserDataFile
from bundlefs.storage import publish
from bundlefs.storage.location import Location, parse_location
from bundlefs.storage.objectstore.upload import RemotePublisher, staging_path


@dataclass
class DistributedPack:
    """The driver's side of one distributed pack: made by ``prepare`` (every check a pack makes
    before reading, so a bad DEST fails before any task runs), then ``staging`` (the area),
    ``plan``, ``tasks``, the executor's runs of ``pack_partition``, and ``merge``."""

    source: str | tuple[str, ...]  # a directory (or an object-store prefix's URL), or archives
    dest: str
    options: PackOptions  # checked, the creation time fixed
    local: bool  # DEST is a local path (else a URL)
    started: float = field(default_factory=time.monotonic)
    phases: dict[str, float] = field(default_factory=dict)
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    _area_id: tuple[int, int] | None = None
    prefix: Location | None = None  # the source is the objects below it
    base: str | None = None  # a pack on a base bundle (local, seen by every worker)

    @classmethod
    def prepare(
        cls, source: PackSource, dest: str, options: PackOptions, base: str | None = None
    ) -> DistributedPack:
        options = check_options(options)
        if options.dedup:
            raise PackError("dedup packs in one process: a distributed pack does not dedup")
        if options.compact:
            raise PackError("a distributed pack does not compact: run compact on the result")
        if isinstance(source, str | os.PathLike):
            paths = [os.fspath(source)]
        elif isinstance(source, Sequence):
            paths = [os.fspath(p) for p in source]
        else:
            raise PackError("a distributed pack packs a directory or archive files")
        if not paths:
            raise PackError("nothing to pack: no source given")
        if STDIN in paths:
            raise PackError(
                "a tar on stdin cannot be packed in partitions: give the archive's path"
            )
        location, _remote = check_destination(paths, dest, options)
        prefix = object_prefix(paths, options)
        if base is not None:
            _check_base(base, paths, prefix, location, options)
        if prefix is not None:
            return cls(
                source=paths[0],
                dest=location.path if location.is_local else dest,
                options=options,
                local=location.is_local,
                prefix=prefix,
            )
        directory = len(paths) == 1 and os.path.isdir(paths[0])
        if options.staging is not None:
            staging = os.path.abspath(options.staging)
            if not os.path.isdir(staging):
                raise PackError(f"the staging directory {options.staging} does not exist")
            if directory:
                real = os.path.realpath(paths[0])
                inside = os.path.realpath(staging)
                if inside == real or inside.startswith(real.rstrip("/") + "/"):
                    raise PackError("the staging directory cannot be inside the tree being packed")
        return cls(
            source=paths[0] if directory else tuple(paths),
            dest=location.path if location.is_local else dest,
            options=options,
            local=location.is_local,
            base=None if base is None else os.path.abspath(base),
        )

    @property
    def part_options(self) -> PackOptions:
        """What every task packs with: the bundle's metadata is the merge's to write."""
        return dataclasses.replace(self.options, meta=())

    @contextlib.contextmanager
    def staging(self) -> Iterator[str]:
        """The staging area, created (locked, as a pack's partial is: ``bundlefs gc`` removes it
        if the driver is killed) and always removed at the end.

        Beside a local DEST (the merge hard-links the partial shards into it), or in
        ``options.staging`` (a URL DEST, or workers on other machines: it must be storage every
        worker and the driver see).
        """
        if self.options.staging is not None:
            name = os.path.basename(self.dest.rstrip("/")) or "bundle"
            stand_in = os.path.join(os.path.abspath(self.options.staging), name)
        elif self.local:
            stand_in = self.dest
        else:
            stand_in = staging_path(parse_location(self.dest, self.options.storage_options), None)
        with publish.stage(stand_in + ".dask") as (area, area_id):
            self._area_id = area_id
            try:
                write_token(area, self.token)
                yield area
            finally:
                remove_area(area)

    def plan(self, count: int, *, fit: bool = False) -> Plan:
        """The partitions: at most ``count``; with ``fit`` (the caller gave no count), no more
        than the data is worth."""
        if self.prefix is not None:
            assert self.options.created_ns is not None  # fixed by check_options
            plan = plan_objects(
                self.prefix,
                count,
                created_ns=self.options.created_ns,
                excludes=self.options.excludes,
                skip_errors=self.options.skip_errors,
                fit=fit,
            )
        elif isinstance(self.source, str):
            plan = plan_directory(
                self.source,
                count,
                excludes=self.options.excludes,
                skip_errors=self.options.skip_errors,
                jobs=self.options.jobs,
                skip=self._area_id,
                fit=fit,
            )
        else:
            plan = plan_archives(self.source, count, fit=fit)
        self.phases["listing"] = plan.seconds
        return plan

    def tasks(self, plan: Plan, area: str) -> list[PartTask]:
        if self.prefix is not None:
            owner = (os.getuid(), os.getgid())
            return [
                PartTask(p, None, area, self.token, prefix=self.prefix, owner=owner)
                for p in plan.partitions
            ]
        directory = self.source if isinstance(self.source, str) else None
        return [PartTask(p, directory, area, self.token, base=self.base) for p in plan.partitions]

    def merge(self, plan: Plan, results: Sequence[PartResult], area: str) -> PackSummary:
        """Merge the partial bundles (in partition order) into one in the staging area, then
        publish it at DEST: a rename beside a local DEST, an upload to a URL."""
        results = sorted(results, key=lambda r: r.index)
        directory = isinstance(self.source, str)
        # A directory's partitions never share a file (their ranges are disjoint): a clash is a
        # tree that changed while it was packed; an object prefix's neither (one listing). Tar
        # shards share directories (the root at least), whose attributes a single-machine pack
        # takes from the first member below them unless a directory member describes them: the
        # first partition's, as "first" keeps.
        options = merging.MergeOptions(
            on_clash="error" if directory else "first",
            meta=self.options.meta,
            created_ns=self.options.created_ns,
        )
        merged_dir = os.path.join(area, "merged")
        started = time.monotonic()
        base = None if self.base is None else Base(self.base, merged_dir, self.options)
        try:
            merged = merging.merge([r.dest for r in results], merged_dir, options, base=base)
        finally:
            if base is not None:
                base.close()
        self.phases["merge"] = time.monotonic() - started
        if merged.overridden:
            # A member path in shards of two partitions: a single-machine pack keeps the last
            # one (as tar -x does), the merge could keep only the first; refused, not guessed.
            first, more = merged.overridden[0], len(merged.overridden) - 1
            also = f" (and {more} more)" if more else ""
            raise PackError(
                f"{first}{also} is in tar shards of different partitions, where a single-machine "
                "pack keeps the last one: pack these shards in one partition (--partitions 1)"
            )
        started = time.monotonic()
        self._publish(merged_dir)
        self.phases["publish"] = time.monotonic() - started
        if isinstance(self.options.user_data, UserDataFile):
            for r in results:
                self.options.user_data.used |= r.user_data_used
        return PackSummary(
            self.dest,
            merged.config,
            sum(r.stored_bytes for r in results),  # the merged bundle's shards are theirs
            merged.index_bytes,
            time.monotonic() - self.started,
            _unique([*plan.skipped, *(s for r in results for s in r.skipped)]),
            _unique([s for r in results for s in r.changed]),
            dict(self.phases),
            reuse=None if base is None else _reuse(base.reuse, results),
        )

    def _publish(self, merged: str) -> None:
        """Put the merged bundle at DEST, atomically (``publish``'s rename, or the store's
        marker last)."""
        force = self.options.force
        if not self.local:
            remote = RemotePublisher(parse_location(self.dest, self.options.storage_options))
            try:
                remote.publish(merged, force)
            except OSError as e:
                raise PackError(f"cannot upload the bundle to {self.dest}: {e}") from e
            return
        parent = os.path.dirname(os.path.abspath(self.dest))
        if os.stat(merged).st_dev == os.stat(parent).st_dev:
            publish.publish(merged, self.dest, force)
            return
        # --staging on another file system than DEST: the shards must be copied over, which a
        # merge of the one merged bundle does (linking where it can), publishing as it goes.
        merging.merge(
            [merged],
            self.dest,
            merging.MergeOptions(
                force=force, meta=self.options.meta, created_ns=self.options.created_ns
            ),
        )


def _check_base(
    base: str, paths: list[str], prefix: Location | None, dest: Location, options: PackOptions
) -> None:
    """A distributed pack on a base packs one directory into a local DEST, and the base opens
    (``delta_base.Base``'s checks); one sentence if not."""
    if prefix is not None or len(paths) != 1 or not os.path.isdir(paths[0]):
        raise PackError("a distributed pack on a base (--base) packs one directory SRC")
    if not dest.is_local:
        raise PackError("a pack on a base (--base) writes a local bundle for now, not a URL")
    Base(base, dest.path, options).close()


def _reuse(linked: BaseReuse, results: Sequence[PartResult]) -> BaseReuse:
    """What the tasks took from the base, added up, with the shards the merge ``linked``."""
    total = dataclasses.replace(linked)
    for part in results:
        if part.reuse is not None:
            for name in _REUSE_COUNTS:
                setattr(total, name, getattr(total, name) + getattr(part.reuse, name))
    return total


_REUSE_COUNTS = (
    "reused_files",
    "reused_bytes",
    "same_files",
    "same_bytes",
    "digest_compared",
    "stored_files",
    "stored_bytes",
)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
