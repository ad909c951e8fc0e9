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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kcache.store.locks import KeyLock

_held: weakref.WeakSet[KeyLock] = weakref.WeakSet()  # KeyLocks holding their flock in this process


def holding(lock: KeyLock) -> None:
    _held.add(lock)


def letting_go(lock: KeyLock) -> None:
    _held.discard(lock)


def _close_in_child() -> None:
    for lock in list(_held):
        lock.forget_in_child()
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)
