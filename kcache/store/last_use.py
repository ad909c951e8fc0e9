"""When an entry was last used: its directory's mtime, set on a hit at most once an hour. The size
bound (kcache.maintenance.eviction) evicts the least recently used first. Its own module, of nothing
but the standard library, because every hit calls it: a hit loads no eviction code."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger("kcache")

LAST_USE_RESOLUTION_S = 3600.0


def note_use(entry_dir: Path) -> None:
    """Record that the entry was used now, at most once an hour. Best effort: a cache this process
    cannot write (read-only, another user's) simply keeps its times."""
    try:
        if time.time() - os.stat(entry_dir, follow_symlinks=False).st_mtime >= LAST_USE_RESOLUTION_S:
            os.utime(entry_dir, follow_symlinks=False)  # a link swapped in meanwhile is not followed
    except OSError as err:
        log.debug("kcache: could not record the use of %s: %s", entry_dir, err)
