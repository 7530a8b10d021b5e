"""``python -m bundlefs``: the same CLI as the ``bundlefs`` console script.

May import: ``bundlefs.cli``.
"""

from bundlefs.cli.app import main

raise SystemExit(main())
