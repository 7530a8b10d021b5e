from bundlefs.cli.main import main

__all__ = ["main"]
