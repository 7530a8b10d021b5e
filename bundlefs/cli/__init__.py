"""The ``bundlefs`` command line (entry point ``bundlefs.cli:main``)."""

from bundlefs.cli.main import main

__all__ = ["main"]
