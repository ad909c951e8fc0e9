"""The key locks this process holds, let go of in a fork of it (`os.register_at_fork`).

A flock belongs to the open file that the holder's descriptor refers to, which a fork shares: a child
forked while a lock is held (a data loader's worker forked while a compile-ahead thread holds a
kernel's lock, or a C module's) would keep it locked after the holder released it, for as long as the
child lives, and every other process would wait on it. The child closes its copies of the held
descriptors at once: the holder's hold is unchanged, and ends when the holder lets go.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class Held(Protocol):
    """A lock that holds its flock in this process (kcache.store.locks.KeyLock, which imports this)."""

    def forget_in_child(self) -> None: ...


_held: weakref.WeakSet[Held] = weakref.WeakSet()  # KeyLocks holding their flock in this process


def holding(lock: Held) -> None:
    _held.add(lock)


def letting_go(lock: Held) -> None:
    _held.discard(lock)


def _close_in_child() -> None:
    for lock in list(_held):
        lock.forget_in_child()
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)
