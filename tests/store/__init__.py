"""Bundles on an object store and object-store sources, against a real S3 server on the loopback
(``tests/support/s3server.py``)."""
