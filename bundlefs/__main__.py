"""``python -m bundlefs``: the same CLI as the ``bundlefs`` console script."""

from bundlefs.cli import main

raise SystemExit(main())
