"""Whether the gc run at a cache's open is due: the rate limit alone, without the gc's own modules (a
cache that opens, hits and exits never loads them)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from kcache.store import dirfd, layout, sharing


def gc_is_due(root: Path, interval_s: float) -> bool:
    """Rate limit for the gc run at open: at most once per interval per root (`.gc-stamp`'s mtime).
    The stamp is shared by every user of a group root, so it follows group mode."""
    with dirfd.subdir(root) as root_fd:
        assert root_fd is not None
        try:
            if time.time() - os.stat(layout.GC_STAMP, dir_fd=root_fd, follow_symlinks=False).st_mtime < interval_s:
                return False
        except FileNotFoundError:
            pass
        exact = sharing.file_mode(sharing.SHARED_FILE_MODE)
        fd = os.open(layout.GC_STAMP, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     sharing.SHARED_FILE_MODE if exact is not None else 0o644, dir_fd=root_fd)
        try:
            if exact is not None and os.fstat(fd).st_uid == os.geteuid():
                sharing.fix_mode(fd, exact)
            os.utime(fd)
        finally:
            os.close(fd)
    return True
