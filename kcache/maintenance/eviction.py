"""Size- and age-bounded LRU eviction of kernel entries, and the cheap record of last use.

Last use is the entry directory's mtime: publishing sets it, and a disk hit
bumps it when it is more than an hour old, so a hot entry costs one `utime`
per hour per process, not a write per hit. Entries are immutable and the
manifest covers files only, so the directory's own times are free to use.

An evicted entry is renamed into `<root>/.trash/` (atomic: a reader sees the
whole entry or a miss) and deleted there. A process that already loaded it
keeps its mapping; one that was reading it meets a vanished file, which is a
miss, and compiles again.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kcache.maintenance.stats import MAX_STATS_FILE_BYTES, stats_directory
from kcache.store import dirfd, layout
from kcache.store.bounded_read import read_regular_at
from kcache.store.components import KERNELS
from kcache.store.fsutil import make_dir_at, replace_file_at

log = logging.getLogger("kcache")

@dataclass
class EntryUsage:
    key: str
    path: Path
    size: int
    last_used: float


def scan_entries(root: Path, namespace: str = KERNELS) -> list[EntryUsage]:
    """Every kernel entry (of `namespace`: TileLang's kernels, or Triton's groups under `triton`) with
    its size and last use. Entries that vanish meanwhile are skipped."""
    found = []
    try:
        listing = list(os.scandir(root / namespace))
    except FileNotFoundError:
        return []
    for entry in listing:
        if not layout.is_key(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            size = sum(f.stat(follow_symlinks=False).st_size for f in os.scandir(entry.path))
        except FileNotFoundError:
            continue
        found.append(EntryUsage(entry.name, Path(entry.path), size, info.st_mtime))
    return found


@dataclass
class EvictReport:
    evicted: int = 0
    freed_bytes: int = 0
    remaining: int = 0
    remaining_bytes: int = 0


def evict(root: Path, max_size: int | None, max_age_s: float | None, now: float | None = None) -> EvictReport:
    """Evict entries unused for longer than `max_age_s`, then least-recently-used ones until the
    total is at most `max_size`: TileLang's kernels and Triton's groups under one bound."""
    entries = sorted(scan_entries(root) + scan_entries(root, layout.TRITON), key=lambda e: e.last_used)
    now = time.time() if now is None else now
    total = sum(e.size for e in entries)
    report = EvictReport()
    for entry in entries:
        too_old = max_age_s is not None and now - entry.last_used > max_age_s
        too_big = max_size is not None and total > max_size
        if not (too_old or too_big):
            report.remaining += 1
            report.remaining_bytes += entry.size
            continue
        total -= entry.size
        if evict_entry(root, entry.path):
            report.evicted += 1
            report.freed_bytes += entry.size
    record_size(root, report.remaining, report.remaining_bytes)
    return report


SIZE_RECORD = "size.json"


def record_size(root: Path, entries: int, size: int) -> None:
    """Remember the total this scan found, so that `kcache stats` need not stat every file."""
    record = json.dumps({"entries": entries, "bytes": size, "measured": time.time()}).encode()
    try:
        with stats_directory(root, create=True) as directory_fd:
            assert directory_fd is not None
            replace_file_at(directory_fd, SIZE_RECORD, record, durable=False)  # a hint, rescanned when lost
    except OSError as err:
        log.debug("kcache: could not record the cache size in %s: %s", root / layout.STATS, err)


def recorded_size(root: Path) -> dict[str, Any] | None:
    try:
        with stats_directory(root) as directory_fd:
            if directory_fd is None:
                return None
            value = json.loads(read_regular_at(directory_fd, SIZE_RECORD, MAX_STATS_FILE_BYTES))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def evict_entry(root: Path, entry_dir: Path) -> bool:
    """Move one entry out of sight atomically, then delete it. False if it was already gone.

    By descriptor: the entry's parent and the trash are opened without following links, and the
    entry is renamed and removed relative to them (kcache/store/dirfd.py)."""
    with dirfd.subdir(root) as root_fd:
        assert root_fd is not None
        parent = os.path.relpath(entry_dir.parent, root)
        parent_fd = dirfd.open_dirs_at(root_fd, *Path(parent).parts)
        if parent_fd is None:
            return False
        try:
            trash_fd = _trash(root_fd)
            try:
                dest = f"{entry_dir.name}.{uuid.uuid4().hex[:12]}"
                try:
                    os.rename(entry_dir.name, dest, src_dir_fd=parent_fd, dst_dir_fd=trash_fd)
                except FileNotFoundError:
                    return False
                dirfd.remove_tree_at(trash_fd, dest, "deleting an evicted entry")
            finally:
                os.close(trash_fd)
        finally:
            os.close(parent_fd)
    log.debug("kcache: evicted %s", entry_dir)
    return True


def _trash(root_fd: int) -> int:
    try:
        make_dir_at(root_fd, layout.TRASH)
    except FileExistsError:
        pass
    fd = dirfd.open_dir_at(root_fd, layout.TRASH)
    if fd is None:
        raise FileNotFoundError(errno.ENOENT, "the trash vanished", layout.TRASH)
    return fd


def empty_trash(root: Path) -> int:
    """Delete what evictions interrupted by a crash left in the trash: by descriptor, so a `.trash`
    that is a symlink (planted by someone else) is refused, never followed."""
    try:
        with dirfd.subdir(root, layout.TRASH) as trash_fd:
            if trash_fd is None:
                return 0
            return sum(dirfd.remove_tree_at(trash_fd, name, "emptying the trash") for name in os.listdir(trash_fd))
    except dirfd.NotADirectoryOfOurs as err:
        log.warning("kcache: not emptying %s: %s. Remove it by hand if it is yours.", root / layout.TRASH, err)
        return 0
