"""The reader library: the tree model, the content reader, the ``Bundle`` facade, verify,
extract and export.

Order inside ``read/``, bottom first (a module imports only from rows above its own):

1. ``options`` (``ReadOptions``, ``RemoteOptions``; imports nothing of ``bundlefs``)
2. ``cache``, ``tree``
3. ``content``
4. ``paths``, ``fileobj``, ``stream``
5. ``assemble`` (the one place a bundle's storage is opened, local or remote)
6. ``facts``, ``verify.report``
7. ``verify.tree``, ``verify.shards``
8. ``verify.files``
9. ``bundle``, ``verify`` (its ``__init__``: ``verify()`` and the driver)
10. ``extract``, ``export``

``tests/test_read_parts.py`` checks it.
"""
