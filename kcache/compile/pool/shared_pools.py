"""The process's shared CompilePools: one per settings, made on first use, shared by every KernelCache.

Apart from `process_pool`, which is the pool itself: here is only which pool a process's caches
share (the lane of `KCACHE_COMPILE_ISOLATION=pool`, and the compile service client's fallback).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from kcache.compile.pool.process_pool import CompilePool

_shared: dict[tuple[object, ...], CompilePool] = {}
_shared_lock = threading.Lock()


def shared_pool(workers: int | None, timeout_s: float | None, preload: Iterable[str]) -> CompilePool:
    """The process's pool for these settings, made on first use. Every KernelCache of a process shares it.

    Workers copy the environment when they start: set CUDA_HOME, TILELANG_*
    and friends before the first compile.
    """
    key = (workers, timeout_s, tuple(preload), os.getpid())
    with _shared_lock:
        pool = _shared.get(key)
        if pool is None or pool.closed:
            pool = _shared[key] = CompilePool(workers, timeout_s, preload=preload)
        return pool
