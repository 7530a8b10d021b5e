"""Real FUSE mounts checked with real tools (``tests/support/mounting.py`` is the harness)."""
