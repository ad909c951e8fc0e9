"""SIGINT and SIGTERM for a long command (`kcache import`, `kcache export`, the stress harness and its
benchmarks): an exception in the main thread, so that every `with` and `finally` on the way out stops
what the command started and removes what it half made, and the command ends with one line.

Python's own answers do neither: SIGINT's KeyboardInterrupt ends in a traceback, and SIGTERM's default
action ends the process at once, leaving its children, its services and its temporary files behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, as KeyboardInterrupt is: `except Exception` in the
    code it crosses does not swallow it.

    `done`: what the interrupted work had finished, set on the way out by the code that knows it (an
    import whose entries were all published before the signal was acted on, say); None: the caller's
    own account holds."""

    def __init__(self, signum: int, done: str | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.done = done

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        """What a shell reports for a process that a signal ended: 128 + its number (130, 143)."""
        return 128 + self.signum


def _raise_interrupted(signum: int, _frame: FrameType | None) -> None:
    # One interruption: a second signal while the first one's cleanup runs would cut that cleanup
    # short (and leave what it was stopping). The cleanups are bounded, so it is only noted.
    for stop in STOP_SIGNALS:
        signal.signal(stop, _already_stopping)
    raise Interrupted(signum)


def _already_stopping(_signum: int, _frame: FrameType | None) -> None:
    """A Python-level handler that does nothing, rather than SIG_IGN: an ignored signal stays ignored
    in the children started during the cleanup, a caught one does not."""


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Within: the first SIGINT or SIGTERM raises Interrupted in the main thread; further ones are
    ignored while it unwinds. The previous handlers come back at the end. Elsewhere than in the main
    thread (where Python runs signal handlers), it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {stop: signal.signal(stop, _raise_interrupted) for stop in STOP_SIGNALS}
    try:
        yield
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)


def ignore_further_signals() -> None:
    """After an interruption, while the command removes what it made and says its last line: a further
    SIGINT or SIGTERM changes nothing (its cleanup was asked for already)."""
    if threading.current_thread() is threading.main_thread():
        for stop in STOP_SIGNALS:
            signal.signal(stop, _already_stopping)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Within: a SIGINT or SIGTERM waits for the block's end, then acts as it would have (the handler
    that was installed runs; under `interruptible()`, Interrupted is raised there). For a step that must
    finish whole once begun: an import's renames, a bundle's rename into place."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {stop: signal.signal(stop, lambda signum, _frame: arrived.append(signum)) for stop in STOP_SIGNALS}
    try:
        yield
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)
        if arrived:
            _act_as_before(arrived[0], previous[signal.Signals(arrived[0])])


def _act_as_before(signum: int, handler: Any) -> None:
    """What `handler` would have done with `signum`: call it, or the default action, or nothing."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signum)  # its default action: the process ends as that signal ends it
