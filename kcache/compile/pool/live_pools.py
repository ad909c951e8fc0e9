"""Every `CompilePool` alive in this process, so that all of them are closed at exit.

Apart from `process_pool` so that a process (the stress harness, interrupted) can close every pool
it started without knowing where each was made, and so that the registry sits below the pool that
registers itself in it (imports go one way).
"""

from __future__ import annotations

import atexit
import weakref
from typing import Protocol


class Closable(Protocol):
    def close(self) -> None: ...


_live_pools: weakref.WeakSet[Closable] = weakref.WeakSet()


def track(pool: Closable) -> None:
    """`pool` is closed at exit unless it was closed before (`forget`)."""
    _live_pools.add(pool)


def forget(pool: Closable) -> None:
    _live_pools.discard(pool)


@atexit.register
def close_all_pools() -> None:
    """Close every CompilePool of this process (its workers stopped): at exit, or earlier where a
    process stops what it started before it ends."""
    for pool in list(_live_pools):
        pool.close()
