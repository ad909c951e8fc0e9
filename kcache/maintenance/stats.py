"""Counters: per cache object in memory, and persisted per process for `kcache stats`.

No lock and no shared file on the hot path: each cache object writes its own
counter file, `<root>/.stats/<host>.<pid>.<token>.json`, at most once a
second and at exit (atomic replace, no fsync: counters are not worth a disk
flush). A reader sums every file. gc folds the files of dead processes into
`total.json`, under a lock, recording which files it folded so that a crash
between the fold and the unlink never counts a file twice. A SIGKILLed
process loses at most its last second of counts.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

from kcache.store import dirfd, layout
from kcache.store.bounded_read import read_regular_at
from kcache.store.fsutil import make_dir_at, replace_file_at

log = logging.getLogger("kcache")

TOTAL = "total.json"
# A counters file is a few hundred bytes: anything far bigger is not one of ours.
MAX_STATS_FILE_BYTES = 1 << 20
FLUSH_INTERVAL_S = 1.0


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    remote_hits: int = 0  # from any remote tier; by tier below
    redis_hits: int = 0
    s3_hits: int = 0
    misses: int = 0  # found nothing usable in memory or on disk at first look
    compiles: int = 0
    compile_seconds: float = 0.0
    lost_races: int = 0
    corrupt_entries: int = 0
    publish_failures: int = 0
    evictions: int = 0
    uploads: int = 0
    lock_waits: int = 0
    lock_wait_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: float) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


COUNTERS = tuple(f.name for f in fields(CacheStats) if not f.name.startswith("_"))


class StatsFile:
    """This process's persisted counters for one root: every cache object on the root adds to it."""

    def __init__(self, root: Path) -> None:
        self.directory = Path(root) / layout.STATS
        self.path = self.directory / f"{layout.this_host()}.{os.getpid()}.{uuid.uuid4().hex[:12]}.json"
        self.stats = CacheStats()
        # The first write waits an interval too (or the exit): not ~0.2 ms of a fresh process's first hit.
        self._last_flush = time.monotonic()
        self._dirty = False

    def add(self, **deltas: float) -> None:
        """Count, and write at most once per FLUSH_INTERVAL_S."""
        self.stats.add(**deltas)
        self._dirty = True
        if time.monotonic() - self._last_flush >= FLUSH_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        self._last_flush = time.monotonic()
        data = json.dumps(self.stats.snapshot()).encode()
        try:
            with stats_directory(self.directory.parent, create=True) as directory_fd:
                assert directory_fd is not None
                replace_file_at(directory_fd, self.path.name, data, durable=False)  # counters: no fsync
        except OSError as err:  # a read-only or foreign cache: the counters stay in memory
            log.debug("kcache: could not persist stats to %s: %s", self.path, err)


_files: dict[tuple[str, int], StatsFile] = {}
_files_lock = threading.Lock()
# A thread of the parent may hold it at a fork (a Triton compile forks from any thread): made anew.
os.register_at_fork(after_in_child=lambda: globals().update(_files_lock=threading.Lock()))


def stats_file(root: Path) -> StatsFile:
    """The process's StatsFile for `root` (one per root and process, flushed at exit)."""
    key = (str(root), os.getpid())
    with _files_lock:
        found = _files.get(key)
        if found is None:
            found = _files[key] = StatsFile(root)
        return found


@atexit.register
def _flush_all() -> None:
    for (_root, pid), persisted in list(_files.items()):
        if pid == os.getpid():  # a forked child does not write its parent's file
            persisted.flush()


def read_persisted(root: Path) -> dict[str, float]:
    """The sum of every process's persisted counters under `root`."""
    total = dict.fromkeys(COUNTERS, 0)
    try:
        with stats_directory(Path(root)) as directory_fd:
            if directory_fd is None:
                return total
            folded = _read_total(directory_fd)
            _accumulate(total, folded["counters"])
            for name in os.listdir(directory_fd):
                if _owner(name) is not None and name not in folded["folded"]:
                    _accumulate(total, _read_json(directory_fd, name))
    except OSError as err:  # a missing root, or a .stats that is not ours
        log.debug("kcache: cannot read the stats of %s: %s", root, err)
    return total


def fold_dead(root: Path) -> int:
    """Fold the counter files of dead processes of this host into total.json. Returns how many."""
    try:
        return _fold_dead(root)
    except dirfd.NotADirectoryOfOurs as err:
        log.warning("kcache: not folding the stats of %s: %s. Remove it if it is yours.", root, err)
        return 0


def _fold_dead(root: Path) -> int:
    from kcache.store.locks import KeyLock

    with stats_directory(Path(root)) as directory_fd:
        if directory_fd is None:
            return 0
        lock = KeyLock(Path(root) / layout.STATS / ".fold.lock", "stats")
        if lock.acquire(10.0) is None:
            return 0
        with lock:
            host = layout.this_host()
            folded = _read_total(directory_fd)
            present = set(os.listdir(directory_fd))
            done = [name for name in folded["folded"] if name in present]  # folded, unlink interrupted
            fresh = []
            for name in sorted(present):
                owner = _owner(name)
                if owner is None or name in done or owner[0] != host or layout.pid_alive(owner[1]):
                    continue
                _accumulate(folded["counters"], _read_json(directory_fd, name))
                fresh.append(name)
            if not fresh and not done:
                return 0
            # The fold record is fsynced before its files are unlinked: they must not count twice.
            _write_total(directory_fd, {"counters": folded["counters"], "folded": done + fresh})
            for name in done + fresh:
                try:
                    os.unlink(name, dir_fd=directory_fd)
                except FileNotFoundError:
                    pass
            _write_total(directory_fd, {"counters": folded["counters"], "folded": []})
            return len(fresh)


@contextlib.contextmanager
def stats_directory(root: Path, *, create: bool = False) -> Iterator[int | None]:
    """The descriptor of `<root>/.stats` (None if missing), opened without following a link."""
    with dirfd.subdir(root) as root_fd:
        assert root_fd is not None
        if create:
            with contextlib.suppress(FileExistsError):
                make_dir_at(root_fd, layout.STATS)
        fd = dirfd.open_dir_at(root_fd, layout.STATS)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _owner(name: str) -> tuple[str, int] | None:
    if not name.endswith(".json") or name == TOTAL:
        return None
    host, _, rest = name[: -len(".json")].rpartition(".")
    host, _, pid = host.rpartition(".")
    return (host, int(pid)) if host and pid.isdigit() and rest else None


def _read_json(directory_fd: int, name: str) -> dict:
    try:
        value = json.loads(read_regular_at(directory_fd, name, MAX_STATS_FILE_BYTES))
    except (OSError, ValueError):  # vanished, or a torn file of an older kcache: nothing to add
        return {}
    return value if isinstance(value, dict) else {}


def _read_total(directory_fd: int) -> dict:
    value = _read_json(directory_fd, TOTAL)
    counters = value.get("counters") if isinstance(value.get("counters"), dict) else {}
    folded = value.get("folded") if isinstance(value.get("folded"), list) else []
    return {"counters": dict(counters), "folded": [str(n) for n in folded]}


def _write_total(directory_fd: int, value: dict) -> None:
    replace_file_at(directory_fd, TOTAL, json.dumps(value).encode())


def _accumulate(total: dict, counters: dict) -> None:
    for name in COUNTERS:
        value = counters.get(name, 0)
        if isinstance(value, (int, float)):
            total[name] = total.get(name, 0) + value
