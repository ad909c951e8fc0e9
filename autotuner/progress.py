"""A tune's progress: a tqdm bar on stderr (none when quiet) that also updates the tune's holder note,
which the processes waiting for the tune show."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class _NotedBar:
    """A progress bar that also tells `noted(done)`: the tune's holder note, which waiters show."""

    def __init__(self, bar: Any, noted: Callable[[int], None]) -> None:
        self.bar = bar
        self.noted = noted
        self.done = 0

    def update(self, n: int) -> None:
        self.done += n
        self.bar.update(n)
        self.noted(self.done)

    def __enter__(self) -> _NotedBar:
        self.bar.__enter__()
        self.noted(0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)


def progress(total: int, description: str, verbose: bool, noted: Callable[[int], None]) -> Any:
    """A context manager whose `update(n)` counts `n` more of `total` done."""
    if not verbose:
        return _NotedBar(_NoBar(), noted)
    from tqdm import tqdm  # only when the bar is shown

    return _NotedBar(tqdm(total=total, desc=description, file=sys.stderr, leave=False), noted)
