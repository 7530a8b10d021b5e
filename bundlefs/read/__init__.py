"""The reader library: the tree model, the content reader, the ``Bundle`` facade, verify,
extract and export.

Modules import one way, bottom first (a module imports only those on lines above its own, and
``if TYPE_CHECKING:`` imports count):

1. ``options`` (``ReadOptions``, ``RemoteOptions``; imports nothing of ``bundlefs``), ``listing``
   (a directory's children, decoded or as names, inodes and types for plain listings)
2. ``cache`` (the record cache), ``tree`` (entries by inode, lookups, paths)
3. ``content`` (file bytes through the cache)
4. ``paths`` (``BundleStat``, ``BundleDirEntry``), ``fileobj`` (``BundleFile``), ``salvage`` (a
   damaged file's good bytes and lost ranges)
5. ``stream`` (whole-bundle traversals; a file's stat comes from ``paths``)
6. ``assemble`` (``BundleParts``: the one place a bundle's storage is opened, local or remote),
   ``mapping`` (``BundleMapping``: the files as a ``Mapping``, which ``Bundle`` inherits),
   ``samples`` (``iter_samples``: files grouped into samples; ``Bundle`` inherits its streaming
   methods)
7. ``facts`` (``BundleInfo``, ``ShardDamage``), ``diff`` (two bundles compared from their
   indexes alone)
8. ``bundle`` (``Bundle``), ``verify`` (a package: its ``__init__`` orders its inside)
9. ``extract``, ``export`` (over ``Bundle``)

As the layering test reads it:

Order (bottom first): options | listing, cache | tree, content, paths | fileobj | salvage, stream,
assemble | mapping | samples, facts | diff, bundle | verify, extract | export

Where the next features go: a record cache shared by several readers, or a store that resolves
shards across bundles (delta bundles that reference a base), plug in at ``assemble``.
"""
