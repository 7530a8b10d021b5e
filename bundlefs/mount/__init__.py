"""The FUSE daemon and what talks to a mount. Importing this package imports neither pyfuse3 nor
trio.

Order (bottom first): bindings | table | stats | options | lifecycle | offload | direct,
kernel | readonly, xattrs | tuning, preflight | reads | listing, operations, worker, supervisor,
daemon

- ``bindings``: which FUSE binding the mount runs on (patched or stock) and what to say of it
- ``table``: the kernel's mount table, and the daemon's xattrs read from outside
- ``stats``: the counters, shared by every worker of a mount, and one process's view of them
- ``options``: ``MountOptions`` and ``LogSetup``
- ``lifecycle``: the readiness pipe, becoming a daemon, systemd notify
- ``offload``: ``ThreadOffload``, blocking loads off the trio loop
- ``direct``: pyfuse3's loop with no event loop under it (a blocking worker: trio not imported)
- ``kernel``: the no-open probe and the ``/dev/fuse`` poll
- ``readonly``: ``ReadOnlyOperations``, every mutation answered ``EROFS``
- ``xattrs``: the extended attributes an entry shows (and the namespaces answered "not supported")
- ``tuning``: mallopt, the kernel's read-ahead, the index held in memory, load threads
- ``preflight``: the checks before mounting, the worker count, the kernel's mount options
- ``reads``: ``ReadScheduler``, where a read's loads run (inline or in threads)
- ``listing``: plain directory listings, added to the reply in batches
- ``operations``: ``BundleOperations``, the pyfuse3 adapter and the one errno table
- ``worker``: one serving process (pyfuse3's loop, direct or under trio; its signals, a cloned
  session)
- ``supervisor``: several worker processes, started, replaced and stopped
- ``daemon``: ``mount`` (the sequence) and ``unmount``
"""
