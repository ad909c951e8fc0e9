"""`CompilePool`: long-lived compile workers, so a compiler crash kills a worker, not the program.

Each worker is a fresh interpreter (fork+exec, never a fork of this
process: it may hold a CUDA context or locks of other threads) that has
imported TileLang once and then runs job after job. One thread of this
process drives each worker, so that:

- a job that outlives its timeout gets its worker's whole process group
  (the worker and its nvcc) SIGKILLed and raises `CompileTimeout`;
- a worker that dies mid-job raises `CompilerCrashed` with the signal and
  the worker's last lines of stderr, and is replaced;
- the workers die with this process: PR_SET_PDEATHSIG fires when the
  thread that started a worker ends, and that thread lives as long as the
  pool.

Workers start lazily, one per job running at once, up to `workers`. With
`start="fork"` (the compile service's), they are forked by a worker
template (`worker_source`) and every job gets a fresh one (it serves one job
and is replaced at once), so nothing of one client's job reaches another's;
where the template is unusable, workers start by exec (and such a pool still
gives every job a fresh worker: slower, as isolated). What becomes of a job's
future when its worker answers, hangs or dies: `job_on_worker`.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import cloudpickle

from kcache.compile.jobs import UNSET, Job, JobOutput, JobResult, JobRunner, usable_cpu_count

__all__ = ["CompilePool", "Job", "JobResult", "TILELANG_PRELOAD", "usable_cpu_count"]
from kcache.compile.pool import live_pools
from kcache.compile.pool.job_on_worker import PendingJob, PoolSlot, run_job
from kcache.compile.pool.spare_workers import spare_count
from kcache.compile.pool.worker_source import WorkerSource
from kcache.compile.workers.worker_process import EXIT_GRACE_S
from kcache.errors import CompilePoolError

log = logging.getLogger("kcache")

# What a worker imports before it says it is ready: a compile then starts warm.
TILELANG_PRELOAD = ("tilelang", "kcache.tilelang.compiler")
START_TIMEOUT_S = 300.0
START_METHODS = ("exec", "fork")


class CompilePool(JobRunner):
    """Long-lived compile workers. `submit(fn, *args)` runs fn(*args) in one and returns a Future.

    `workers`: at most this many jobs run at once (default: the usable CPU
    count). `timeout_s`: the default limit of one job (None: no limit).
    `preload`: modules each worker imports before its first job. `start`:
    "exec" (a fresh interpreter per worker) or "fork" (from a worker template).
    """

    def __init__(self, workers: int | None = None, timeout_s: float | None = None, *,
                 preload: Iterable[str] = TILELANG_PRELOAD, start_timeout_s: float = START_TIMEOUT_S,
                 start: str = "exec") -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"workers={workers}: a compile pool needs at least one worker")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s}: use None for no limit")
        if start not in START_METHODS:
            raise ValueError(f"start={start!r}: one of {', '.join(START_METHODS)}")
        self.max_workers = workers or usable_cpu_count()
        self.timeout_s = timeout_s
        self.preload = tuple(preload)
        self.start_timeout_s = start_timeout_s
        self._jobs: queue.SimpleQueue[PendingJob | None] = queue.SimpleQueue()
        self._slots: list[PoolSlot] = []
        self._outstanding = 0
        self._lock = threading.Lock()
        self.closed = False
        self.owner_pid = os.getpid()
        self._numbers = itertools.count()
        self.start_method = start
        self._workers = WorkerSource(self.preload, start_timeout_s, fork=start == "fork",
                                     spares=spare_count(self.max_workers))
        live_pools.track(self)

    # ------------------------------------------------------------ public

    def submit(self, fn: Callable[..., Any], *args: Any, name: str | None = None, timeout_s: float | None = UNSET,
               output: JobOutput | None = None, calls: Any = None, cost: float | None = None) -> Future[Any]:
        """Run `fn(*args)` in a worker. fn, args and the result must pickle (cloudpickle). `output` and
        `cost` matter to the compile service only (this pool takes jobs in arrival order); `calls`
        answers the job's calls to this process (`worker.call_caller`).

        The future raises what fn raised, `CompilerCrashed` if the worker
        died, `CompileTimeout` past the time limit, `CompilePoolError` if no
        worker could start.
        """
        label = name or getattr(fn, "__qualname__", None) or repr(fn)
        return self.submit_payload(cloudpickle.dumps((fn, args)), label, timeout_s, calls)

    def submit_payload(self, payload: bytes, name: str, timeout_s: float | None = UNSET,
                       calls: Any = None) -> Future[Any]:
        """`submit` of a job already pickled as `(fn, args)` (the compile service passes its clients'
        jobs on without unpickling them)."""
        self._check_usable()
        future: Future[Any] = Future()
        label = name
        limit = self.timeout_s if timeout_s is UNSET else timeout_s
        with self._lock:
            self._outstanding += 1
            if self._outstanding > len(self._slots) and len(self._slots) < self.max_workers:
                self._add_slot()
        self._jobs.put(PendingJob(future, payload, label, limit, calls))
        return future

    def warm(self, count: int | None = None) -> float:
        """Start `count` workers (default: all, and a fork pool's spares) and wait until every worker is
        ready, replacements of dead ones included; returns the seconds it took. A count, as the compile
        service's first warm-up gives (`warm(1)`), waits for no spare: its first worker is what makes
        the service warm."""
        self._check_usable()
        started = time.monotonic()
        with self._lock:
            while len(self._slots) < min(count or self.max_workers, self.max_workers):
                self._add_slot()
            slots = list(self._slots)
        for slot in slots:
            slot.ready.wait()
        if count is None:
            self._workers.wait_for_spares()
        return time.monotonic() - started

    def abort(self, future: Future[Any], why: str) -> bool:
        """Stop the job of `future`: cancelled if it waits, its worker killed if it runs (the future
        then raises CompileAborted). Returns whether it was stopped."""
        if future.cancel():
            return True
        # Under the lock that guards `slot.pending`: a slot whose job just finished may already run
        # another client's job on the same worker, and that one must not be killed. A kill that
        # lands after the job's reply was read leaves a dead worker, so `_drive` discards the
        # worker of every aborted job (see there).
        with self._lock:
            for slot in self._slots:
                pending, worker = slot.pending, slot.worker
                if pending is not None and pending.future is future and worker is not None:
                    pending.aborted = why
                    worker.kill_process()
                    return True
        return False

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [slot.worker.pid for slot in self._slots if slot.worker is not None]

    def template_pid(self) -> int | None:
        """The worker template's pid, if workers are forked from one now."""
        return self._workers.template_pid()

    def start_template(self, *, forked: bool = False) -> None:
        """Start the worker template now, without waiting for its imports (`WorkerSource.start_template`)."""
        self._workers.start_template(forked=forked)

    def close(self) -> None:
        """Stop the workers: idle ones exit, busy ones are killed, and jobs still queued never start
        (their futures fail)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            slots = list(self._slots)
        for _ in slots:
            self._jobs.put(None)
        for slot in slots:
            worker = slot.worker
            if slot.busy and worker is not None:
                # A signal only: the slot's thread, reading the worker's reply pipe, sees it die and
                # closes the pipes itself. Closed here, their numbers could be taken by this
                # process's next open while that thread is about to read them.
                worker.kill_process()
        for slot in slots:
            if slot.thread is not None and slot.thread is not threading.current_thread():
                slot.thread.join(EXIT_GRACE_S * 2)
        self._workers.close()
        live_pools.forget(self)

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    def _check_usable(self) -> None:
        if self.closed:
            raise RuntimeError("this CompilePool is closed")
        if os.getpid() != self.owner_pid:
            # A fork of the owner: the pool's threads did not come along.
            raise RuntimeError("a CompilePool cannot be used in a forked child; make a new one there")

    def _add_slot(self) -> None:
        slot = PoolSlot()
        slot.thread = threading.Thread(
            target=self._drive, args=(slot,), name=f"kcache-compile-{next(self._numbers)}", daemon=True
        )
        self._slots.append(slot)
        slot.thread.start()

    def _drive(self, slot: PoolSlot) -> None:
        """The loop of one pool thread: start its worker, then run jobs until the pool closes. Nothing
        that goes wrong here leaves a caller waiting: a job this thread took gets an error whatever
        happens, and the thread goes on with a fresh worker."""
        start_error: CompilePoolError | None = None
        try:
            slot.worker = self._workers.start_worker()
        except CompilePoolError as err:
            start_error = err
        slot.ready.set()
        while True:
            pending = self._jobs.get()
            if pending is None:
                break
            try:
                if not pending.future.set_running_or_notify_cancel():
                    continue
                if slot.worker is not None and slot.worker.has_exited():  # it died idle (its template was
                    slot.worker.kill()  # killed, say): the job gets a live one, never that death
                    slot.worker = None
                if slot.worker is None:
                    if start_error is not None:
                        # Reported once to the job that was waiting; the next job retries the start.
                        error, start_error = start_error, None
                        pending.future.set_exception(error)
                        continue
                    try:
                        slot.worker = self._workers.start_worker()
                    except CompilePoolError as err:
                        pending.future.set_exception(err)
                        continue
                with self._lock:  # close() reads `busy` after setting `closed` under this lock
                    closed_first = self.closed
                    if not closed_first:
                        slot.busy, slot.pending = True, pending
                if closed_first:  # queued before close(), taken after: never run (close kills none of it)
                    pending.future.set_exception(RuntimeError(f"the CompilePool closed before {pending.name!r} started"))
                    continue
                if self.start_method == "fork":
                    slot.ready.clear()  # its worker is replaced after this job: `warm` waits for the new one
                run_job(slot, pending, lambda: self.closed)
                if self.start_method == "fork" and slot.worker is not None and pending.aborted is None:
                    # The compile service's: a fresh fork of the template for every job, so that no
                    # module, global or registration of one client's job is seen by the next.
                    self._workers.retire(slot.worker)
                    slot.worker = None
                if pending.aborted is not None and slot.worker is not None:
                    # abort() killed it, or is about to, after its reply came: never hand it a job.
                    slot.worker.kill()
                    slot.worker = None
                if slot.worker is None and not self.closed:
                    # Replace a dead worker now, not when the next job is already waiting.
                    slot.ready.clear()
                    try:
                        slot.worker = self._workers.start_worker()
                    except CompilePoolError as err:
                        start_error = err
                    slot.ready.set()
            except BaseException as err:  # noqa: BLE001 - a bug or a broken environment: see the docstring
                log.warning("kcache: a compile pool thread failed on %s: %r", pending.name, err)
                if not pending.future.done():
                    pending.future.set_exception(CompilePoolError(f"the pool's thread failed: {err!r}", ""))
                if slot.worker is not None:
                    slot.worker.kill()  # in an unknown state: the next job gets a fresh one
                    slot.worker = None
                slot.ready.set()
            finally:
                with self._lock:
                    slot.busy, slot.pending = False, None
                    self._outstanding -= 1
        if slot.worker is not None:
            slot.worker.close()
            slot.worker = None

