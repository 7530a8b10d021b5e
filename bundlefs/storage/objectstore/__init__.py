"""A bundle on an object store, over fsspec: the one client, the reader's fetches, caches and
read-ahead, the ``RemoteShardStore``, the index fetch, the listing a pack source reads and the
upload a pack publishes with. Order inside, bottom first: ``client`` → ``fetcher`` →
``tiers`` → ``disk_cache``, ``readahead``, ``outage``, ``inflight`` → ``held``, ``index_fetch``,
``listing``, ``upload_progress`` → ``upload`` → ``shard_store`` (storage/__init__.py).
"""
