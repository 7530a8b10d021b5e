"""``python -m bundlefs``: the same CLI as the ``bundlefs`` console script."""

from bundlefs.cli.main import main

raise SystemExit(main())
