"""Counters: per cache object in memory, persisted per process (kcache.maintenance.counter_file),
summed for `kcache stats`, zeroed by `kcache stats --zero`.

A reader sums every process's file. gc folds the files of dead processes into `total.json`, under a
lock, recording which files it folded so that a crash between the fold and the unlink never counts a
file twice. A zero cannot empty the files of live processes (each rewrites its whole count), so it
records, in total.json, what each file held at the zero (its baseline), and zeroes the folded total; a
reader counts each file above its baseline, and a fold moves a file's baseline out with the file. Both
are one atomic replace of total.json under the fold's lock.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kcache.maintenance.counter_file import COMPILER_COUNTERS, stats_directory
from kcache.store import dirfd, layout
from kcache.store.bounded_read import read_regular_at
from kcache.store.fsutil import replace_file_at

log = logging.getLogger("kcache")

TOTAL = "total.json"
# A counters file is a few hundred bytes: anything far bigger is not one of ours.
MAX_STATS_FILE_BYTES = 1 << 20
FOLD_LOCK = ".fold.lock"


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    remote_hits: int = 0  # from any remote tier; by tier below
    redis_hits: int = 0
    s3_hits: int = 0
    # A lookup is a hit (memory, disk or remote: served without compiling, a wait for another
    # process's compile included) or a miss (it compiled, or had to and failed): ccache's meaning.
    misses: int = 0
    compiles: int = 0  # compiler runs that produced the kernel
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


COUNTERS = tuple(f.name for f in fields(CacheStats) if not f.name.startswith("_"))  # TileLang's
PERSISTED_COUNTERS = COUNTERS + COMPILER_COUNTERS  # and Triton's and Helion's


def read_persisted(root: Path) -> dict[str, float]:
    """The sum of every process's persisted counters under `root` since the last zero: TileLang's
    (COUNTERS) and the other compilers' (COMPILER_COUNTERS)."""
    total = dict.fromkeys(PERSISTED_COUNTERS, 0)
    try:
        with stats_directory(Path(root)) as directory_fd:
            if directory_fd is None:
                return total
            folded = _read_total(directory_fd)
            _accumulate(total, folded["counters"])
            for name in os.listdir(directory_fd):
                if _owner(name) is not None and name not in folded["folded"]:
                    _accumulate(total, _read_json(directory_fd, name), folded["baseline"].get(name, {}))
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


def zero_counters(root: Path) -> bool:
    """`kcache stats --zero` (as `ccache -z`): every counter reads 0 from now on. Whether there was a
    .stats to zero (a root without one reads 0 already). A live process's counts not written yet (its
    last second at most) count after the zero."""
    with stats_directory(Path(root)) as directory_fd:
        if directory_fd is None:
            return False
        with _fold_lock(root):
            folded = _read_total(directory_fd)
            baseline = {name: _read_json(directory_fd, name) for name in os.listdir(directory_fd)
                        if _owner(name) is not None and name not in folded["folded"]}
            _write_total(directory_fd, {"counters": {}, "folded": folded["folded"], "baseline": baseline})
        return True


def _fold_lock(root: Path) -> Any:
    from kcache.store.locks import KeyLock

    lock = KeyLock(Path(root) / layout.STATS / FOLD_LOCK, "stats")
    if lock.acquire(10.0) is None:
        raise TimeoutError(f"{lock.path}: another process has folded the stats for 10 s; try again")
    return lock


def _fold_dead(root: Path) -> int:
    with stats_directory(Path(root)) as directory_fd:
        if directory_fd is None:
            return 0
        try:
            lock = _fold_lock(root)
        except TimeoutError:
            return 0
        with lock:
            host = layout.this_host()
            folded = _read_total(directory_fd)
            baseline = folded["baseline"]
            present = set(os.listdir(directory_fd))
            done = [name for name in folded["folded"] if name in present]  # folded, unlink interrupted
            fresh = []
            for name in sorted(present):
                owner = _owner(name)
                if owner is None or name in done or owner[0] != host or layout.pid_alive(owner[1]):
                    continue
                _accumulate(folded["counters"], _read_json(directory_fd, name), baseline.pop(name, {}))
                fresh.append(name)
            if not fresh and not done:
                return 0
            # The fold record is fsynced before its files are unlinked: they must not count twice. Their
            # baselines leave with them, in the same write.
            _write_total(directory_fd, {"counters": folded["counters"], "folded": done + fresh, "baseline": baseline})
            for name in done + fresh:
                try:
                    os.unlink(name, dir_fd=directory_fd)
                except FileNotFoundError:
                    pass
            _write_total(directory_fd, {"counters": folded["counters"], "folded": [], "baseline": baseline})
            return len(fresh)


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
    baseline = value.get("baseline") if isinstance(value.get("baseline"), dict) else {}
    return {"counters": dict(counters), "folded": [str(n) for n in folded],
            "baseline": {str(name): held for name, held in baseline.items() if isinstance(held, dict)}}


def _write_total(directory_fd: int, value: dict) -> None:
    replace_file_at(directory_fd, TOTAL, json.dumps(value).encode())


def _accumulate(total: dict, counters: dict, baseline: dict | None = None) -> None:
    """Add `counters` above `baseline` (what they held at the last zero) to `total`."""
    for name in PERSISTED_COUNTERS:
        value, before = counters.get(name, 0), (baseline or {}).get(name, 0)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            base = before if isinstance(before, (int, float)) and not isinstance(before, bool) else 0
            total[name] = total.get(name, 0) + max(value - base, 0)
