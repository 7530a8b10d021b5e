"""Where bytes and metadata live: the LMDB index, shard records, the ShardStore interface,
staging and publishing, and a bundle on an object store (``objectstore/``). Only this layer
imports lmdb, and fsspec only through ``location``.

Imports inside point one way, bottom first: the compiled index steps and their loader
(``native``), the marker, the record codecs, the store interface,
the LMDB environment rules, the index's checks and where a bundle lives; then the read and write
halves of the index and the shards; then publishing; then the object store, which uses all of them.

Order (bottom first): native, location | marker | codec | store | lmdb_env | entry_scan |
key_ranges | index_fill, index_guard, index_check, index | index_writer | shards | shard_writer,
liveness | source_records | totals | publish, objectstore, bases, remove
"""
