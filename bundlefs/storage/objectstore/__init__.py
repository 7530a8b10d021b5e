"""A bundle on an object store, over fsspec: the one client (``client``: the per-protocol profile
table a new back-end is one entry of), the web-server file system (``http``), the GETs with
retries and outage handling (``fetcher``), the reader's caches (``tiers``, ``disk_cache``,
``held``), read-ahead (``readahead``), outage accounting (``outage``), single-flight
(``inflight``), the index fetch (``index_fetch``; from version 6 a sparse copy filled page by
page, ``index_pages``), the listing a pack source reads
(``listing``), the upload a pack publishes with (``upload``, ``upload_progress``), the shards
a bundle keeps in its bases and the markers that guard them (``references``, version 6), and
``RemoteShardStore`` (``shard_store``) composing the reader's parts.

Order (bottom first): http | tiers | readahead | outage | inflight | upload_progress, client,
fetcher | disk_cache, held | index_pages, index_fetch | listing, references, upload |
shard_store
"""
