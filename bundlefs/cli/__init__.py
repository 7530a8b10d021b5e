"""The ``bundlefs`` command line (entry point ``bundlefs.cli:main``)."""

from bundlefs.cli.app import main

__all__ = ["main"]
