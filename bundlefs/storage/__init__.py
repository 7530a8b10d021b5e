"""Where bytes and metadata live: the LMDB index, shard records, the ShardStore interface,
staging and publishing, and a bundle on an object store. Only this layer imports lmdb (and,
through ``location``, fsspec).

Imports inside point one way. Bottom first; a module imports only from its own step or below:

1. ``location``, ``marker``, ``codec``, ``store``, ``lmdb_env``
2. ``index``, ``index_writer``, ``shards``, ``shard_writer`` (the read and write halves)
3. ``publish``
4. ``objectstore/client`` (the one fsspec client), then ``objectstore/fetcher`` (its GETs)
5. ``objectstore/{tiers, disk_cache, readahead, outage, inflight, held, index_fetch, listing,
   upload_progress, upload}``, each only from those before it in this list
6. ``objectstore/shard_store`` (``RemoteShardStore``: composes step 5)
"""
