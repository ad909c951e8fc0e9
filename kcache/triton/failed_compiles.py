"""Triton compiles that failed with a Python error in this process, and what a compile of one does next.

A config that Triton cannot build fails with a Python error, not a crash: a `tl.static_assert` in its
front half, ptxas refusing it ("Insufficient registers") in its back half. Plain Triton's autotuner
compiles it once, meets `CompileTimeAssertionFailure` or `PTXASError`, and skips it. Under kcache the
error is met away from Triton's own call (kcache.triton.isolation's `CompileFailed`), and then:
- the key's lock is let go at once: nothing will be published for it, and a compile that failed must
  never make another wait (a tune's benchmark asks for the config its compile-ahead failed on, in this
  same process, while the failed future still holds that compile's manager);
- the key is remembered for the process's life, so that its next compile is not sent away again;
- in a tune's compile-ahead (`parallel_tune.in_ahead_lane`) the failure ends there
  (`LeftToItsBenchmark`, which the compile-ahead ignores); anywhere else Triton's own compile runs in
  this process and raises what plain Triton raises. So a failing config costs one compile away and one
  in the caller, where plain Triton's tune compiles it once; its benchmark waits for the caller's alone.

Not remembered across processes: unlike a crash (kcache.triton.crashes), the error is Triton's to
raise, with its own message, and a compile in the caller cannot harm it.
"""

from __future__ import annotations

import threading

_MOST_REMEMBERED = 4096  # a process that meets more failed keys starts over (each costs one compile away)
_failed: set[str] = set()
_guard = threading.Lock()


class LeftToItsBenchmark(Exception):
    """A config's compile failed in a tune's compile-ahead; the tune's benchmark of it compiles it in
    the caller, and Triton's autotuner decides (it skips `CompileTimeAssertionFailure` and `PTXASError`)."""


def note(key: str) -> None:
    """Remember that the compile of Triton's group `key` failed with a Python error."""
    with _guard:
        if len(_failed) >= _MOST_REMEMBERED:
            _failed.clear()
        _failed.add(key)


def failed_before(key: str) -> bool:
    with _guard:
        return key in _failed


def raise_in_ahead_lane(name: str) -> None:
    """In a tune's compile-ahead, LeftToItsBenchmark for the failed compile `name`; elsewhere nothing:
    Triton's own compile runs in this process and raises its error."""
    from kcache.triton.parallel_tune import in_ahead_lane

    if in_ahead_lane():
        raise LeftToItsBenchmark(f"Triton's compile of {name} failed; its benchmark compiles it in this process")
