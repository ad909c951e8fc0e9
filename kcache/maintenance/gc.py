"""Garbage collection: stale staging, idle lock files, the trash, dead processes' stats, eviction.

A staging directory belongs to the process named in it. On this host a
dead owner means the directory is garbage at once; on another host (a
shared filesystem) we cannot see the owner, so a TTL decides.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from kcache.maintenance.eviction import empty_trash, evict
from kcache.maintenance.stats import fold_dead
from kcache.store import layout
from kcache.store.fsutil import remove_tree
from kcache.store.locks import remove_idle_lock_files

log = logging.getLogger("kcache")

GC_STAMP = ".gc-stamp"
# Directories gc never descends into when it looks for staging areas.
_SKIP = {layout.QUARANTINE, layout.LOCKS, layout.LOGS, layout.TOOLCHAIN, layout.TRASH, layout.STATS}


@dataclass
class GcReport:
    staging_removed: int = 0
    locks_removed: int = 0
    trash_removed: int = 0
    stats_folded: int = 0
    evicted: int = 0
    evicted_bytes: int = 0


def staging_is_stale(name: str, age_s: float, ttl_s: float, host: str) -> bool:
    parsed = layout.StagingName.parse(name)
    if parsed is None or parsed.host != host:
        return age_s > ttl_s
    if parsed.pid == os.getpid():
        return False
    # A live pid older than the TTL is a reused pid, not our writer.
    return not layout.pid_alive(parsed.pid) or age_s > ttl_s


def staging_dirs(root: Path) -> list[Path]:
    """Every `.staging` directory under `root`, the autotuner subtree included."""
    found = []
    for current, subdirs, _files in os.walk(root):
        if os.path.basename(current) == layout.STAGING:
            found.append(Path(current))
            subdirs[:] = []
            continue
        # Published entries hold only files; skipping them keeps the walk
        # proportional to the number of namespaces, not of entries.
        subdirs[:] = [d for d in subdirs if d not in _SKIP and not layout.is_key(d)]
    return found


def lock_dirs(root: Path) -> list[Path]:
    """The lock directories under `root`: the kernels' and the autotune results' (saved by path)."""
    return [root / layout.LOCKS, root / "autotuner" / layout.LOCKS]


def clean_stale_staging(root: Path, ttl_s: float) -> int:
    host = layout.this_host()
    now = time.time()
    removed = 0
    for area in staging_dirs(root):
        try:
            children = list(os.scandir(area))
        except FileNotFoundError:
            continue
        for child in children:
            try:
                age = now - child.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            if staging_is_stale(child.name, age, ttl_s, host):
                if child.is_dir(follow_symlinks=False):
                    gone = remove_tree(Path(child.path), "removing stale staging")
                else:
                    os.unlink(child.path)
                    gone = True
                removed += gone
                log.debug("kcache: removed stale staging %s", child.path)
    return removed


def collect_garbage(root: Path, staging_ttl_s: float, max_size: int | None = None,
                    max_age_s: float | None = None) -> GcReport:
    report = GcReport(
        staging_removed=clean_stale_staging(root, staging_ttl_s),
        locks_removed=sum(remove_idle_lock_files(d) for d in lock_dirs(root)),
        trash_removed=empty_trash(root),
        stats_folded=fold_dead(root),
    )
    if max_size is not None or max_age_s is not None:
        evicted = evict(root, max_size, max_age_s)
        report.evicted, report.evicted_bytes = evicted.evicted, evicted.freed_bytes
    return report


def gc_is_due(root: Path, interval_s: float) -> bool:
    """Rate limit for the gc run at open: at most once per interval per root."""
    stamp = root / GC_STAMP
    try:
        if time.time() - os.stat(stamp).st_mtime < interval_s:
            return False
    except FileNotFoundError:
        pass
    stamp.touch()
    os.utime(stamp)
    return True
