"""The process's shared ServicePools: one per settings, made on first use, shared by every KernelCache.

Apart from `client`, which is the ServicePool itself: here is only which client a process's caches
share, what each falls back to (the process's shared CompilePool), and closing them all.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from kcache.compile.service.client import ServicePool
from kcache.setting_values import caller_fork_setting

_shared: dict[tuple[object, ...], ServicePool] = {}
# Reentrant: making a pool may open another (an import hook of the program's can open a cache, whose
# warm-up asks for its own pool), and a plain lock would wait for itself.
_shared_lock = threading.RLock()


def shared_service_pool(workers: int | None, timeout_s: float | None, preload: Iterable[str],
                        idle_s: float) -> ServicePool:
    """The process's ServicePool for these settings; its fallback is the process's shared pool. A pool
    reads KCACHE_CALLER_FORK and XDG_RUNTIME_DIR once, when it is made, so both are part of its key: a
    compile after either changed goes through a pool of the new values, never one made under the old."""
    preload = tuple(preload)
    key = (workers, timeout_s, preload, idle_s, caller_fork_setting(), os.environ.get("XDG_RUNTIME_DIR"), os.getpid())
    with _shared_lock:
        found = _shared.get(key)
        if found is None:
            found = _shared[key] = ServicePool(workers, timeout_s, preload, idle_s,
                                               lambda: _own_pool(workers, timeout_s, preload))
        return found


def _own_pool(workers: int | None, timeout_s: float | None, preload: tuple[str, ...]) -> object:
    """The process's own pool, a client's fallback: loaded only when the service is not there."""
    from kcache.compile.pool.shared_pools import shared_pool

    return shared_pool(workers, timeout_s, preload)


def close_shared_service_pools() -> None:
    """Disconnect every ServicePool of this process (`close`): their unfinished jobs stop, none runs
    again in a fallback pool. For a process that stops what it started before it ends (the stress
    harness's commands, interrupted), before it stops its services."""
    with _shared_lock:
        pools = list(_shared.values())
    for pool in pools:
        pool.close()
