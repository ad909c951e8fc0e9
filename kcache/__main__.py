"""`python -m kcache`: the cache's command line (see kcache/cli.py)."""

import sys

from kcache.tools.cli import main

sys.exit(main())
