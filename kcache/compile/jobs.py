"""Jobs for the compile pool: what the caller hands in, what comes back."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# "Not given" for a job's timeout: the pool's own applies (None means no limit).
UNSET: Any = object()


def usable_cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass
class Job:
    """One unit of work for `compile_many`: `fn(*args)` in a worker."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    name: str | None = None
    timeout_s: float | None = UNSET
    tag: Any = None  # the caller's, returned untouched


@dataclass
class JobResult:
    job: Job
    value: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None
