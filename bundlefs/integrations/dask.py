"""Packing on a Dask cluster: ``pack_with_dask`` and the CLI's ``--dask ADDRESS|local:N``.

This module only runs tasks; what a distributed pack is (the plan, the partition source, the
task, the staging area, the merge) is ``bundlefs.packing.distributed``, which knows nothing of
Dask. The driver plans the partitions, submits one ``pack_partition`` task per partition,
gathers their results and merges the partial bundles into DEST. A task whose worker dies is
rescheduled by the scheduler (up to its ``distributed.scheduler.allowed-failures``, 3 by
default); the retry removes what the killed attempt left. A task that fails (an unreadable file
without ``skip_errors``) fails the pack: the driver marks the staging area aborted, so running
tasks stop at their next progress tick and queued ones at once, waits for them, then removes
the area. Nothing is published then, and DEST is untouched.

May import: ``bundlefs.errors``, ``bundlefs.packing``; and dask, distributed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence

import dask
from distributed import Client, Future, LocalCluster, as_completed
from distributed.scheduler import KilledWorker

from bundlefs.errors import PackError
from bundlefs.packing.distributed.area import abort
from bundlefs.packing.distributed.driver import DistributedPack
from bundlefs.packing.distributed.plan import default_partitions
from bundlefs.packing.distributed.task import PartResult, PartTask, pack_partition
from bundlefs.packing.options import PackOptions, PackProgress, PackSource, PackSummary

log = logging.getLogger(__name__)

# How long a failed pack waits for its running tasks to stop (they check the abort marker at
# every progress tick, 0.2 s apart; a task stuck in a read cannot) before removing the area.
SETTLE_SECONDS = 60.0
CONNECT_TIMEOUT = "10s"


def worker_count(client: Client) -> int:
    """How many workers the cluster has now."""
    return len(client.scheduler_info(n_workers=-1).get("workers", {}))


def pack_with_dask(
    source: PackSource,
    dest: str,
    client: Client,
    options: PackOptions = PackOptions(),  # noqa: B008 - frozen, safe as a default
    partitions: int | None = None,
    progress: Callable[[PackProgress], None] | None = None,
    *,
    base: str | os.PathLike[str] | None = None,
) -> PackSummary:
    """Pack ``source`` into the bundle ``dest`` on the cluster ``client`` is connected to.

    ``source`` is a directory or a list of archives (tar shards), on storage every worker sees
    under the same path, or an object-store prefix (``s3://bucket/prefix/``: listed once here,
    each task fetching its share with ``options.storage_options``); ``dest`` a local path or a
    URL. ``partitions``: how many tasks (default: ``default_partitions`` of the workers there
    are now, fewer for a small source: one per 256 MiB of content or 20,000 entries,
    ``distributed.plan.fitted_count``). The staging area is beside a local
    DEST, or in ``options.staging`` (required to be shared storage when workers run on other
    machines; the tasks check it and say so). ``progress`` is called as partitions finish
    (files and bytes packed so far).

    The result holds what ``pack(source, dest, options)`` would (every path, byte, mode, owner,
    mtime), and is the same bytes for the same source, partition count and creation time.
    With ``base`` (a local bundle every worker sees, OLD; ``source`` a directory), the result
    is what ``pack(source, dest, options, base=base)`` makes: each task decides per file against
    OLD's index whether it changed and stores only those that did, and the merge links OLD's
    shards that unchanged files use (``merge.merge(..., base=)``).

    Raises ``PackError`` for every failure, leaving nothing at DEST and no staging area.
    """
    job = DistributedPack.prepare(
        source, dest, options, base=None if base is None else os.fspath(base)
    )
    fit = partitions is None  # a count the caller chose is kept; ours follows the data
    if partitions is None:
        partitions = default_partitions(worker_count(client))
    if partitions < 1:
        raise PackError(f"the partition count must be at least 1, not {partitions}")
    with job.staging() as area:
        plan = job.plan(partitions, fit=fit)
        started = time.monotonic()
        results = _run(client, job.tasks(plan, area), job, area, progress)
        job.phases["packing"] = time.monotonic() - started
        return job.merge(plan, results, area)


def _run(
    client: Client,
    tasks: Sequence[PartTask],
    job: DistributedPack,
    area: str,
    progress: Callable[[PackProgress], None] | None,
) -> list[PartResult]:
    """Run every task; the results, or the first failure as a ``PackError`` once every task
    has stopped."""
    counts = PackProgress()
    futures: dict[Future, PartTask] = {}
    try:
        # In every task, not scattered once: scattered data dies with the worker holding it
        # (a killed worker lost it and failed the pack, in about one run of five), while a
        # task's own arguments travel with its retry.
        options = job.part_options
        for task in tasks:
            key = f"bundlefs-pack-{job.token}-{task.partition.index:05d}"
            futures[client.submit(pack_partition, task, options, key=key, pure=False)] = task
        results = []
        for future in as_completed(list(futures), loop=client.loop):
            if future.status != "finished":
                raise _failure(future, futures[future])
            result: PartResult = future.result()
            results.append(result)
            counts.files += result.files
            counts.bytes_read += result.data_bytes
            counts.bytes_stored += result.stored_bytes
            if progress is not None:
                progress(counts)
        return results
    except BaseException:
        abort(area)
        _settle(list(futures))
        raise
    finally:
        for future in futures:
            future.release()


def _failure(future: Future, task: PartTask) -> PackError:
    """The ``PackError`` to raise for a task that did not finish."""
    where = f"partition {task.partition.index}"
    if future.status == "cancelled":
        return PackError(
            f"the Dask cluster lost the task of {where} (was the scheduler restarted?)"
        )
    error = future.exception()
    if isinstance(error, PackError):
        return error  # the pack's own sentence: "cannot read a/b: Permission denied"
    if isinstance(error, KilledWorker):
        return PackError(
            f"the workers running {where} died too often (distributed.scheduler.allowed-failures)"
        )
    return PackError(f"{where} failed on its worker: {type(error).__name__}: {error}")


def _settle(futures: list[Future]) -> None:
    """Wait until no task runs any more (they stop at the abort marker), for a while.

    Polled rather than ``distributed.wait``, which needs a default client (the caller's may
    not be one)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline and not all(f.done() for f in futures):
        time.sleep(0.05)


# -- the CLI's --dask ------------------------------------------------------------------------------


def parse_spec(spec: str) -> int | str:
    """``local:N`` -> N (worker processes on this machine); anything else is a scheduler's
    address, as ``distributed.Client`` takes it."""
    if not spec.startswith("local:"):
        return spec
    count = spec[len("local:") :]
    if not count.isdigit() or int(count) < 1:
        raise PackError(f"--dask {spec!r}: local:N takes a whole number of workers, at least 1")
    return int(count)


@contextlib.contextmanager
def _quiet_about_busy_ports() -> Iterator[None]:
    """The scheduler's HTTP endpoint takes another port when 8787 is taken (another cluster,
    another user's) and says so in a four-line UserWarning: noise on a pack's stderr."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Port .* is already in use", category=UserWarning)
        yield


@contextlib.contextmanager
def connect(spec: str) -> Iterator[Client]:
    """A client for ``--dask SPEC``: a new ``LocalCluster`` of N single-threaded worker
    processes for ``local:N`` (closed at the end), else the scheduler at the address."""
    target = parse_spec(spec)
    if isinstance(target, int):
        # The workers' scratch space (``dask-scratch-space``, otherwise left in the system's
        # temporary directory) goes in a directory of our own, removed with the cluster.
        with (
            tempfile.TemporaryDirectory(prefix="bundlefs-dask-") as scratch,
            dask.config.set({"temporary-directory": scratch}),
            _quiet_about_busy_ports(),
            LocalCluster(
                n_workers=target,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            ) as cluster,
            Client(cluster) as client,
        ):
            yield client
        return
    try:
        client = Client(target, timeout=CONNECT_TIMEOUT)
    except (OSError, TimeoutError, ValueError) as e:
        raise PackError(f"cannot reach the Dask scheduler at {target}: {e}") from None
    with client:
        yield client
