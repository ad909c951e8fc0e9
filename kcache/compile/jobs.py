"""Jobs for the compile pool: what the caller hands in, what comes back."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, as_completed
from dataclasses import dataclass
from typing import Any

# "Not given" for a job's timeout: the pool's own applies (None means no limit).
UNSET: Any = object()


def usable_cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class JobOutput:
    """What a job writes: the regular files of `directory`, a function of `key` alone (a compile job
    writing the entry of a cache key, say), or with `directory` None nothing but its result (the
    toolchain's identification of a root, which the job persists itself). The compile service runs
    one of the identical jobs in flight and copies its directory, if any, for the others
    (`service.inflight`); a pool ignores it."""

    key: str
    directory: str | None


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


class JobRunner:
    """`run` and `compile_many` for anything that has `submit(fn, *args, name=, timeout_s=)`: the
    compile pool and the compile service's client."""

    def submit(self, fn: Callable[..., Any], *args: Any, name: str | None = None, timeout_s: float | None = UNSET,
               output: JobOutput | None = None, calls: Any = None, cost: float | None = None) -> Future[Any]:
        raise NotImplementedError

    def run(self, fn: Callable[..., Any], *args: Any, name: str | None = None, timeout_s: float | None = UNSET,
            output: JobOutput | None = None, calls: Any = None, cost: float | None = None) -> Any:
        """`submit(...).result()`; the job's calls to its caller (`calls`, a `caller_calls.CallerCalls`)
        are answered in this thread meanwhile. `cost`: an estimate of the job's run time, relative to
        this process's other jobs; the compile service starts the costliest first (service.scheduler)."""
        future = self.submit(fn, *args, name=name, timeout_s=timeout_s, output=output, calls=calls, cost=cost)
        return calls.wait(future) if calls is not None else future.result()

    def compile_many(self, jobs: Iterable[Job]) -> Iterator[JobResult]:
        """Run every job, up to `max_workers` at once, and yield their results as they finish."""
        futures = {self.submit(job.fn, *job.args, name=job.name, timeout_s=job.timeout_s): job for job in jobs}
        for future in as_completed(futures):
            error = future.exception()
            yield JobResult(futures[future], None if error is not None else future.result(), error)
