"""The packer: sources of entries, the entry builder, the content writer, ``pack``, ``Writer``,
``merge`` and the distributed pack.

Modules import one way, bottom first (a module imports only those on lines above its own, and
``if TYPE_CHECKING:`` imports count):

1. ``sources.base`` (the ``EntrySource`` seam), ``sources.directory`` (``DirectorySource``),
   ``user_data``
2. ``options`` (the vocabulary: ``PackOptions``, ``PackProgress``, ``PackSummary``, the checks)
3. ``sources.synthetic`` (an in-memory tree, the name rules), ``sources.streams`` (archive streams)
4. ``content`` (file content into shards), ``copied`` (a delta pack's unchanged files' base
   values, a run at a time), then ``builder`` (entries into the index)
5. ``sources.archive``, ``sources.objects``, ``sources.stored`` (layers of stored bundles),
   ``sources.added`` (what a ``Writer`` is given)
6. ``reuse`` (another bundle's shards in a new one), ``destination`` (check DEST; build, seal
   and publish), ``compare`` (a source file against a base's stored bytes), then ``delta`` (a
   pack on a base bundle: its unchanged files arrive stored at the base's bytes, or as its entry
   values, copied), ``delta_sink`` (the same for archives and ``--files-from``; ``on_base`` puts
   any source on a base) and ``compact`` (a bundle without its dead records)
7. ``packer`` (``pack``; ``pack --base --compact`` runs ``compact`` over its own result) |
   ``writer`` (``Writer``: a bundle built from Python, one entry at a time)
8. ``merge``
9. ``distributed``: ``cutter``, ``plan``, ``source``, ``area``, ``task``, ``driver``

As the layering test reads it (a sub-package is one child; ``sources`` orders its own inside):

Order (bottom first): user_data | reuse, sources, options, content | copied, builder, destination,
compare | remote_base | strict, delta_base, delta, delta_sink | compact, packer | writer, merge,
distributed

Where the next features go: a new archive format is one module in ``sources`` over ``synthetic``
and ``streams``; object-store bases of a delta pack go in ``delta_base`` (over ``reuse``).
"""
