"""Garbage collection: stale staging, idle lock files, the trash, dead processes' stats, eviction.

A staging directory belongs to the process named in it. On this host a
dead owner means the directory is garbage at once; on another host (a
shared filesystem) we cannot see the owner, so a TTL decides.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kcache.maintenance.eviction import empty_trash, evict
from kcache.maintenance.stats import fold_dead
from kcache.store import access, dirfd, layout
from kcache.store.locks import remove_idle_lock_files

log = logging.getLogger("kcache")

# Directories gc never descends into when it looks for staging areas.
_SKIP = {layout.QUARANTINE, layout.LOCKS, layout.LOGS, layout.TOOLCHAIN, layout.TRASH, layout.STATS}


@dataclass
class GcReport:
    staging_removed: int = 0
    locks_removed: int = 0
    trash_removed: int = 0
    quarantine_removed: int = 0
    logs_removed: int = 0
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
    """Every `.staging` directory under `root`, the autotuner subtree included (for reports)."""
    try:
        with dirfd.subdir(root) as root_fd:
            assert root_fd is not None
            return [root / where for where, _fd in _staging_areas(root_fd)]
    except OSError:
        return []


def _staging_areas(root_fd: int) -> Iterator[tuple[str, int]]:
    """(relative path, descriptor) of every `.staging` below the root, walked by descriptor (os.fwalk
    follows no link), skipping published entries and kcache's bookkeeping directories."""
    for where, subdirs, _files, where_fd in os.fwalk(".", dir_fd=root_fd):
        if os.path.basename(where) == layout.STAGING:
            subdirs[:] = []
            yield os.path.normpath(where), where_fd
            continue
        # Published entries hold only files; skipping them keeps the walk
        # proportional to the number of namespaces, not of entries.
        subdirs[:] = [d for d in subdirs if d not in _SKIP and not layout.is_key(d)]


def lock_dirs(root: Path) -> list[Path]:
    """The lock directories under `root`: the kernels', the autotune results' (saved by path) and
    Triton's groups'."""
    return [root / layout.LOCKS, *(root / namespace / layout.LOCKS for namespace in layout.NAMESPACES)]


def clean_stale_staging(root_fd: int, ttl_s: float) -> int:
    host = layout.this_host()
    now = time.time()
    removed = 0
    for where, area_fd in _staging_areas(root_fd):
        for name in os.listdir(area_fd):
            if layout.StagingName.parse(name) is None:
                continue  # not a name kcache gives: not ours to delete
            try:
                age = now - os.stat(name, dir_fd=area_fd, follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            if staging_is_stale(name, age, ttl_s, host):
                removed += dirfd.remove_tree_at(area_fd, name, "removing stale staging")
                log.debug("kcache: removed stale staging %s/%s", where, name)
    return removed


def collect_garbage(root: Path, staging_ttl_s: float, max_size: int | None = None,
                    max_age_s: float | None = None, quarantine_age_s: float | None = None) -> GcReport:
    """Clean a root; nothing at all in a directory that is not a kcache root (access.claim_root).
    `quarantine_age_s`: also delete quarantined entries and compile logs older than this (`kcache gc`;
    kept for inspection otherwise)."""
    try:
        root_fd = dirfd.open_root(root)
    except FileNotFoundError:
        return GcReport()  # nothing to clean (and nothing is created)
    try:
        if not access.claim_root(root_fd, root):
            return GcReport()
        staging_removed = clean_stale_staging(root_fd, staging_ttl_s)
        quarantine_removed = logs_removed = 0
        if quarantine_age_s is not None:
            quarantine_removed = remove_old_items(root_fd, layout.QUARANTINE, quarantine_age_s, "quarantined entry")
            logs_removed = remove_old_items(root_fd, layout.LOGS, quarantine_age_s, "compile log")
    finally:
        os.close(root_fd)
    report = GcReport(
        staging_removed=staging_removed,
        quarantine_removed=quarantine_removed,
        logs_removed=logs_removed,
        locks_removed=sum(remove_idle_lock_files(d) for d in lock_dirs(root)),
        trash_removed=empty_trash(root),
        stats_folded=fold_dead(root),
    )
    if max_size is not None or max_age_s is not None:
        evicted = evict(root, max_size, max_age_s)
        report.evicted, report.evicted_bytes = evicted.evicted, evicted.freed_bytes
    return report


def remove_old_items(root_fd: int, directory: str, age_s: float, what: str) -> int:
    """Delete the items of `directory` (`.quarantine`, `.logs`) older than `age_s`, by descriptor: a
    directory that is a link is refused (NotADirectoryOfOurs, one warning), never followed into
    someone's directories."""
    try:
        directory_fd = dirfd.open_dir_at(root_fd, directory)
    except dirfd.NotADirectoryOfOurs as err:
        log.warning("kcache: not cleaning %s: %s", directory, err)
        return 0
    if directory_fd is None:
        return 0
    now, removed = time.time(), 0
    try:
        for name in os.listdir(directory_fd):
            try:
                age = now - os.stat(name, dir_fd=directory_fd, follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            if age > age_s:
                removed += dirfd.remove_tree_at(directory_fd, name, f"removing an old {what}")
    finally:
        os.close(directory_fd)
    return removed
