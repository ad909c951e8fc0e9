"""The machine-wide bound on this user's compiles: `count` slot files, each flock'd by whoever runs a
compile in it.

Three kinds of compile share the bound (`KCACHE_COMPILE_WORKERS`, default the usable cores): a job
the service runs in one of its workers (its scheduler holds a slot for the job's whole run), a
compile a client runs in a fork of itself while the service is not warm yet (`caller_fork`), and a
Triton compile whose stages hook cannot leave its program (kcache.triton.isolation, which waits for a
slot). Every
service of the user shares them (TileLang's and Triton's, whose templates import other compilers,
and the services of other environments): a slot is a file `compile-slot-<i>` in the user's private
runtime directory, named by no service, so that all of them together run at most as many compiles
as there are cores; the kernel drops a
flock when its holder dies, SIGKILL included, so a killed compiler never keeps a slot. The service
removes the slot files nobody holds as it exits.
"""

from __future__ import annotations

import os
import random
import time

from kcache.compile.runtime_dir import runtime_directory
from kcache.store.locks import take_file_lock

# Not `random`'s module functions: their state is the program's. Helion's searches seed it
# (HELION_AUTOTUNE_RANDOM_SEED) and draw their configs from it between compiles; a draw of kcache's
# there (a compile that asks for a slot, a remote wait's jitter) would change the configs they tune.
# The system's source has no state to share with the program, or between a process and its forks.
_DRAWS = random.SystemRandom()


class CompileSlot:
    """A slot held (its descriptor keeps the flock); `release()` gives it back."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # drops the flock

    def __enter__(self) -> CompileSlot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class CompileSlots:
    """The user's compile slots, as the service `name` sees them: at most `count` compiles at once,
    machine-wide for this user, whichever service or fork runs them."""

    def __init__(self, name: str, count: int) -> None:
        self.name = name
        self.count = count

    def try_take(self) -> CompileSlot | None:
        """One non-blocking attempt at each slot, from a random one on (so that processes that ask
        together do not all try slot 0 first); None when every slot is held. OSError (a service
        directory that is not private, say) reaches the caller."""
        first = _DRAWS.randrange(self.count)
        for step in range(self.count):
            index = (first + step) % self.count
            fd = take_file_lock(self.path(index))  # the service removes its free slot files as it exits
            if fd is not None:
                return CompileSlot(fd)
        return None

    def take(self, timeout_s: float, retry_s: float = 0.05, retry_max_s: float = 0.5) -> CompileSlot | None:
        """A slot, waiting while every slot is held, at most `timeout_s`; None past it. A holder tells
        nobody when it lets go: the slots are looked at again after `retry_s`, doubled each time up to
        `retry_max_s` (a long wait costs a few looks a second, not twenty)."""
        deadline = time.monotonic() + timeout_s
        while (slot := self.try_take()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(retry_s, left))
            retry_s = min(2 * retry_s, retry_max_s)
        return slot

    def held(self) -> int:
        """How many slots are held now: a snapshot for tests (it takes the free ones for a moment, so
        a fork asking just then would go to the service instead)."""
        taken = []
        try:
            while (slot := self.try_take()) is not None:
                taken.append(slot)
            return self.count - len(taken)
        finally:
            for slot in taken:
                slot.release()

    def path(self, index: int) -> str:
        return str(runtime_directory() / f"compile-slot-{index}")

