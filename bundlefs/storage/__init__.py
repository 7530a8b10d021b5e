"""Where bytes and metadata live: the LMDB index, shard records, the ShardStore interface,
staging and publishing. Only this layer imports lmdb.
"""
