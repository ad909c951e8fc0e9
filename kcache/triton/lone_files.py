"""A file Triton puts alone (its driver's utilities and a kernel's launcher, C modules; its autotuner's
timings): found in the roots or the remote tiers; a C module missed is built once by a herd of
processes that miss it together.

Triton builds such a module with the C compiler in the program's process (`compile_module_from_src`:
0.25-0.6 s of a core on the H200) when `get_file` misses it, and `put`s it. Without a lock, N processes
that start at once (a job's ranks, 8 tunes at once) each build the same module. Here a miss of a file
named as Python's extension modules are (`EXT_SUFFIX`) takes the key's lock, as a group's miss does: the
first process builds while the others wait for its publish and read it; the lock is released at `put` or
when Triton drops the manager: a build that raised lets go of it as the program lets go of the exception
(whose traceback holds Triton's frame, and so the manager), mostly at once. The wait is short on
purpose: past `BUILD_WAIT_S` a waiter builds the module itself, as Triton would have (a second build of
the same source is harmless: each process loads the copy it verified). An autotuner's timings, the other
lone file, take no lock: a tune is not to wait for another process's benchmarks.
"""

from __future__ import annotations

import logging
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kcache.errors import CacheLockTimeout
from kcache.triton.store import entry_key

if TYPE_CHECKING:
    from kcache.triton.held import Held
    from kcache.triton.store import GroupStore

Read = tuple[Path, dict[str, bytes]]  # (entry directory, verified files)

log = logging.getLogger("kcache")

SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
BUILD_WAIT_S = 20.0  # a C build takes about a second; past this, build here too, as Triton would


def find(lone_files: GroupStore, groups: GroupStore, filename: str, held: Callable[[], Held]) -> Read | None:
    """The lone file `filename` of Triton's key: its entry in the roots, the file of a compile group
    (a compile's file Triton asks for alone), another node's from the remote tiers; or, for a C module
    that misses, another process's build of it (`wait_or_hold`). None: Triton builds or writes it."""
    key = entry_key(lone_files.triton_key, filename)
    found = lone_files.read(key, None, filename)
    if found is None:
        found = groups.read(groups.key, f"{filename.rsplit('.', 1)[0]}.json", filename)  # `add.ptx` -> `add.json`
    if found is None:
        found = lone_files.fetch(key, None, filename)
    if found is None and filename.endswith(SUFFIX):
        found = wait_or_hold(lone_files, key, filename, held)
    return found


def wait_or_hold(store: GroupStore, key: str, filename: str, held: Callable[[], Held]) -> Read | None:
    """A C module missed: another process's build of it, read once published (at most BUILD_WAIT_S),
    or None with its lock in `held()` (this process builds it; released at `put` or the manager's drop),
    or None holding nothing (no lock to be had: built here too)."""
    if store.where.write is None:
        return None
    lock = store.lock(key)
    try:
        with store.arrivals(key) as arrivals:  # a waiter wakes at the builder's publish
            waited = lock.acquire(min(BUILD_WAIT_S, store.where.lock_timeout_s),
                                  lambda: store.read(key, None, filename) is not None, arrivals.nap)
    except CacheLockTimeout:
        log.warning("kcache: another process has been building Triton's %s for %.0f s; building it here too",
                    filename, min(BUILD_WAIT_S, store.where.lock_timeout_s))
        return None
    except OSError as err:
        log.warning("kcache: cannot take the lock %s (%s); building Triton's %s without it", lock.path,
                    err.strerror or err, filename)
        return None
    found = store.read(key, None, filename, locked=waited is not None)  # published while we waited, or just before
    if found is not None:
        if waited is not None:
            lock.release()
        return found
    if waited is None:  # seen published, then gone (evicted): build it, unlocked, as Triton would
        return None
    held().lock = lock  # made only now: a hit or a wait holds nothing
    return None
