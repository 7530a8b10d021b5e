"""A pack split into partitions that run anywhere, merged into one bundle: everything of a
distributed pack but the executor (``bundlefs.integrations.dask`` runs the tasks on Dask).

Its rooms, bottom first (each imports only those before it):
- ``cutter``: the tree's shape as the planning walk saw it, cut into ranges of about equal weight
  (content bytes and entries, half each), each cut at the shallowest directory boundary near its
  ideal place, so directories stay whole where they fit in a share;
- ``plan``: ``plan_directory`` (one lstat-only walk in the driver with the packer's own
  ``DirectorySource``; all names of a hard-linked file in one partition), ``plan_objects`` (one
  listing with the packer's own ``ObjectSource``; each partition carries its share of it) and
  ``plan_archives`` (runs of whole tar shards of about equal bytes, in order);
- ``source``: ``PartitionSource``, one partition's range of a directory plus the directories
  above it (with their real attributes), so each partition packs to a complete partial bundle;
- ``area``: the staging area's token, abort marker and removal;
- ``task``: ``pack_partition``, an ordinary ``pack`` of one partition into ``AREA/part-NNNNN``;
- ``driver``: ``DistributedPack``, the checks before anything runs, the staging area, the plan
  and the tasks, the merge of the partial bundles (``merge.merge``) and the publishing at DEST.

The result holds exactly what a single-machine pack of the same source holds (every path, byte,
mode, owner and mtime; for tar shards, docs/cli.md says what is refused and where a directory's
description may differ), and is the same bytes for the same source, partition count and creation
time. docs/scale.md says how it scales.

Order (bottom first): cutter, plan, source, area, task, driver
"""
