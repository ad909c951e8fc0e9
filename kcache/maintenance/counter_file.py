"""This process's persisted counters for one root: `<root>/.stats/<host>.<pid>.<token>.json`.

No lock and no shared file on the hot path: each process writes its own counter file at most once a
second and at exit (atomic replace, no fsync: counters are not worth a disk flush). A reader sums
every file (kcache.maintenance.stats). A SIGKILLed process loses at most its last second of counts.

One file per root and process, whichever compilers count into it: TileLang's KernelCache (its
counters, kcache.maintenance.stats.CacheStats), Triton's manager and Helion's backend (their
`<compiler>_hits`, `_misses` and `_compiles`). Light on purpose: a fresh process's Triton hit loads
this module, and nothing of the write path until its first write (a second later, or at exit).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from kcache.store import dirfd, layout

log = logging.getLogger("kcache")

FLUSH_INTERVAL_S = 1.0
# The compilers counted beside TileLang, each with these three counters (docs/operations.md, "stats"):
# a hit is a lookup served without compiling (a wait for another process's compile included), a miss
# one that compiled (or had to, and failed), a compile one compiler run that produced the kernel.
OTHER_COMPILERS = ("triton", "helion")
LOOKUP_COUNTERS = ("hits", "misses", "compiles")
COMPILER_COUNTERS = tuple(f"{compiler}_{counter}" for compiler in OTHER_COMPILERS for counter in LOOKUP_COUNTERS)


class StatsFile:
    """This process's persisted counters for one root: every cache object on the root adds to it."""

    def __init__(self, root: Path) -> None:
        self.directory = Path(root) / layout.STATS
        self.path = self.directory / f"{layout.this_host()}.{os.getpid()}.{os.urandom(6).hex()}.json"
        self._counts: dict[str, float] = {}
        self._lock = threading.Lock()
        # The first write waits an interval too (or the exit): not ~0.2 ms of a fresh process's first hit.
        self._last_flush = time.monotonic()
        self._dirty = False

    def add(self, **deltas: float) -> None:
        """Count, and write at most once per FLUSH_INTERVAL_S."""
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] = self._counts.get(name, 0) + delta
            self._dirty = True
        if time.monotonic() - self._last_flush >= FLUSH_INTERVAL_S:
            self.flush()

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self._counts)

    def flush(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            self._last_flush = time.monotonic()
            data = json.dumps(self._counts).encode()
        from kcache.store.fsutil import replace_file_at  # the write path: not loaded by a process that only hit

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


def count_lookup(root: Path | None, compiler: str, **deltas: float) -> None:
    """Add `deltas` (hits, misses, compiles) to `compiler`'s counters of `root` (None: a root this
    process writes nothing under, KCACHE_READONLY say: not persisted, as TileLang's)."""
    if root is not None:
        stats_file(root).add(**{f"{compiler}_{name}": delta for name, delta in deltas.items()})


@atexit.register
def _flush_all() -> None:
    for (_root, pid), persisted in list(_files.items()):
        if pid == os.getpid():  # a forked child does not write its parent's file
            persisted.flush()


@contextlib.contextmanager
def stats_directory(root: Path, *, create: bool = False) -> Iterator[int | None]:
    """The descriptor of `<root>/.stats` (None if missing), opened without following a link."""
    with dirfd.subdir(root) as root_fd:
        assert root_fd is not None
        if create:
            from kcache.store.fsutil import make_dir_at

            with contextlib.suppress(FileExistsError):
                make_dir_at(root_fd, layout.STATS)
        fd = dirfd.open_dir_at(root_fd, layout.STATS)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)
