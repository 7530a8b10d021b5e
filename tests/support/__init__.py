"""Helpers shared by the tests and by ``bench/``: the mount harness, the S3 server, source trees,
hostile bundles, the tree contract. No tests here."""
