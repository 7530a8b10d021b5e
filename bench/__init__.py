"""Benchmark suite for bundlefs (issue 4; the read-path measurements and targets of issue 9).

Run with ``python -m bench.run`` (``make bench``) or ``python -m bench.run --quick``
(``make bench-quick``). The modules are:

- ``datasets``: deterministic, seeded generation of the small / large / source-tree datasets.
- ``systems``: one small adapter per system under test (raw directory, squashfuse_ll,
  ratarmount, bundlefs) with ``pack`` / ``mount`` / ``unmount``.
- ``reader``: the worker process that does the timed read loops (cat-style, Python ``open()``,
  or bundlefs's Python API).
- ``measure``: the timed experiments (pack, mount-ready, find, du, random and sequential reads,
  daemon RSS and CPU, bundlefs's FUSE requests per file, Python API reads).
- ``targets``: the targets (issue 9's read path, issue 4's others) and how each is evaluated.
- ``report``: medians, ratios, ``docs/benchmarks.md``, ``docs/benchmarks.png`` and the JSON.
- ``run``: the command line entry point tying it together.

Parts ``make bench`` runs after ``run``, each writing its own section of docs/benchmarks.md:
``workers``, ``codecs``, ``torch_epoch``, ``object_store``, ``delta`` and ``delta_sources``
(``pack --base`` from a directory, and from archives and lists) and ``writer``
(``bundlefs.Writer`` against ``pack`` on the same files).

This package deliberately imports nothing heavy at import time: ``bench.reader`` is started
many times as a subprocess and its start-up must stay cheap.
"""
