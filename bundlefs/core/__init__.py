"""The bottom layer: the on-disk format in code, its invariants, checksums, sizes, libc calls.

Pure where it can be; no module here imports lmdb, lz4, pyfuse3 or trio.

Order (bottom first): checksum | content_types | format | libc | units, integrity
"""
