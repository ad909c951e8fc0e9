"""This user's cache directory for kcache: `$XDG_CACHE_HOME/kcache`, else `~/.cache/kcache`, on Linux.

What platformdirs answers (4.x: an XDG_CACHE_HOME that is not an absolute path is ignored, as the XDG
spec says), computed here on Linux because a fresh process's hit would otherwise load platformdirs
(about 2.5 ms on the development machine) to learn a path; platformdirs answers elsewhere (macOS,
Windows). tests/test_store.py compares the two.
"""

from __future__ import annotations

import os
import sys


def user_cache_dir(app: str = "kcache") -> str:
    if sys.platform.startswith("linux"):
        base = os.environ.get("XDG_CACHE_HOME", "").strip()
        if not os.path.isabs(base):
            base = os.path.expanduser("~/.cache")
        return os.path.join(base, app)
    import platformdirs

    return platformdirs.user_cache_dir(app, appauthor=False)
