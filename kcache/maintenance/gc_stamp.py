"""The gc run at a cache's open: whether it is due (the rate limit alone, without the gc's own modules:
a cache that opens, hits and exits never loads them), and its run, which never fails the open."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kcache.store import dirfd, layout, sharing

log = logging.getLogger("kcache")


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


def collect_if_due(root: Path, interval_s: float, collect: Callable[[], Any]) -> None:
    """Run `collect` (the cache's gc) if it is due at `root`; a failure is one warning."""
    try:
        if gc_is_due(root, interval_s):
            report = collect()
            if report.staging_removed or report.locks_removed:
                log.debug("kcache: gc at open removed %s", report)
    except Exception as err:  # whatever a hostile root holds, opening the cache works
        log.warning("kcache: gc of %s at open failed (the cache still works): %s: %s", root,
                    type(err).__name__, err)
