"""Helpers shared by the tests and by ``bench/``: the mount harness, the S3 server, source trees,
hostile bundles, the tree contract, the cluster cache's reader process. No tests here."""
