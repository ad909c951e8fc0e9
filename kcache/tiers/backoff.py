"""The pause between the attempts of one bounded wait on a remote store (a lease, a claim).

A remote lease has no event to wait on: a waiter polls it. Polling at a fixed cadence turns a
fleet of waiters into synchronized bursts, and polling with no pause at all (an attempt that
answers "wait" at once) into a busy loop on the store. So every wait pauses between attempts:
a jittered, exponentially widening window, as filelock backs off between contended lock
attempts, and never past the wait's deadline. A wait of T seconds makes at most about
6 + 2T attempts.
"""

from __future__ import annotations

import random
import time

# Not `random`'s module functions, whose state is the program's (kcache.compile.compile_slots says why).
_DRAWS = random.SystemRandom()

# A lone waiter still notices a released lease within this long...
FIRST_PAUSE_S = 0.05
# ...and a long wait costs the store at most a few requests a second per waiter.
MAX_PAUSE_S = 1.0


class Backoff:
    """The deadline of one wait and the pauses between its attempts.

        backoff = Backoff(timeout_s)
        while not attempt():
            if not backoff.pause():
                give up (the deadline passed)
    """

    def __init__(self, timeout_s: float, *, first_s: float = FIRST_PAUSE_S, max_s: float = MAX_PAUSE_S) -> None:
        self.timeout_s = max(0.0, timeout_s)
        self.started = time.monotonic()
        self.deadline = self.started + self.timeout_s
        self.attempts = 0
        self._first_s = first_s
        self._max_s = max(first_s, max_s)

    def waited(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def next_pause(self) -> float:
        """The pause before the next attempt: in the upper half of a window that doubles with each
        attempt up to `max_s` (jitter, so that waiters that started together drift apart; the lower
        bound keeps the number of attempts in a wait small whatever the draws)."""
        window = min(self._max_s, self._first_s * 2 ** min(self.attempts, 16))
        return max(self._first_s, _DRAWS.uniform(window / 2, window))

    def pause(self) -> bool:
        """Sleep before the next attempt; False, without sleeping, once the deadline has passed."""
        remaining = self.remaining()
        if remaining <= 0.0:
            return False
        time.sleep(min(self.next_pause(), remaining))  # a remote lease has no event to wait on
        self.attempts += 1
        return True
