"""Where a pack's entries come from: the ``EntrySource`` seam (``base``) and its implementations.

Bottom first: ``base`` (the seam), ``tree_table`` (the SQLite tables ``synthetic`` keeps its
entries in), ``read_hints`` (asking the kernel to read ahead the files a pack on a base will
read) and ``known_split`` (a pack on a base's split of a directory into files unchanged by their
lstat and the rest), ``directory`` (``DirectorySource``: a tree on disk), ``synthetic`` (a tree of
made-up entries, placed as ``tar -x`` places them, and the one set of name rules for sources of
made-up entries) and ``streams`` (archive streams), then ``archive`` (tar and zip), ``objects``
(an object-store prefix), ``stored`` (layers of trees already stored in bundles), ``listed`` (the
listed paths of a directory, in list order) and ``added`` (what a ``Writer`` is given, in a
temporary table). A new archive format is one more module over ``synthetic`` and ``streams``.

Order (bottom first): base | tree_table, read_hints | known_split, directory | synthetic | streams,
archive | objects | stored | listed | added
"""
