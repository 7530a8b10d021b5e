"""The ``bundlefs`` command line (entry point ``bundlefs.cli:main``).

Order (bottom first): output | scrub | completion, options | listing, pack_sources | pack_report,
pack | info | browse, du | export | extract | gc | rm | mount | verify, merge | compact | diff, app
"""

from bundlefs.cli.app import main

__all__ = ["main"]
