"""One job on one pool worker: what becomes of the job's future, whatever the worker does.

A worker answers, or its answer cannot be rebuilt here, or it outlives the job's time limit, or it
dies (a crash, an abort that killed it, the pool closing). Each ends the future one way, and says
whether the worker serves on. Apart from `process_pool` because this is the mapping of a worker's
fate onto the caller's errors (`CompilerCrashed`, `CompileTimeout`, `CompileAborted`), while the
pool is about threads, slots and who runs what.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kcache.compile.protocol import ReplyUnreadable, WorkerDied
from kcache.compile.workers.worker import job_outcome
from kcache.compile.workers.worker_process import WorkerProcess
from kcache.errors import CompileAborted, CompilerCrashed, CompileTimeout

log = logging.getLogger("kcache")


@dataclass
class PendingJob:
    future: Future[Any]
    payload: bytes
    name: str
    timeout_s: float | None
    calls: Any = None  # the caller's functions the job may call (worker_process.CallsOfCaller)
    aborted: str | None = None  # why abort() killed its worker


@dataclass
class PoolSlot:
    """One pool thread and the worker it drives."""

    thread: threading.Thread | None = None
    worker: WorkerProcess | None = None
    busy: bool = False
    pending: PendingJob | None = None
    ready: threading.Event = field(default_factory=threading.Event)


def run_job(slot: PoolSlot, pending: PendingJob, pool_closed: Callable[[], bool]) -> None:
    """Run `pending` on the slot's worker and end its future. A worker that is killed or died is
    taken from the slot (`slot.worker` None) before the future ends: `abort` then finds no worker
    of this job to kill."""
    worker = slot.worker
    assert worker is not None
    try:
        reply = worker.run(pending.payload, pending.timeout_s, pending.calls)
    except ReplyUnreadable as err:  # the worker answered in full and serves on
        pending.future.set_exception(RuntimeError(
            f"the answer of {pending.name!r} came back but cannot be rebuilt in this process ({err}): "
            "an exception class whose constructor takes other arguments than it passes to Exception, say"))
        return
    except TimeoutError:
        worker.kill()
        slot.worker = None
        log.warning("kcache: killed the compile worker of %s after %g s", pending.name, pending.timeout_s)
        pending.future.set_exception(CompileTimeout(pending.name, pending.timeout_s or 0.0))
        return
    except WorkerDied:
        signal_name, exit_code = worker.death()
        tail = worker.stderr_tail()
        worker.kill()
        slot.worker = None
        if pool_closed():
            pending.future.set_exception(RuntimeError(f"the CompilePool closed while {pending.name!r} was compiling"))
            return
        if pending.aborted is not None:
            pending.future.set_exception(CompileAborted(pending.name, pending.aborted))
            return
        log.warning("kcache: the compile worker of %s died (%s)", pending.name, signal_name or f"exit {exit_code}")
        pending.future.set_exception(CompilerCrashed(pending.name, signal_name, exit_code, tail))
        return
    value, error = job_outcome(reply)
    if error is None:
        pending.future.set_result(value)
    else:
        pending.future.set_exception(error)
