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
template (`template`) that imported TileLang once: a worker, and the
replacement of a crashed one, then costs a fork (milliseconds) instead of an
interpreter that imports TileLang (seconds), and every job gets a fresh one
(it serves one job and is replaced at once), so nothing of one client's job
reaches another's. Where the template cannot fork safely (it would hold
threads) or cannot start, workers start by exec (and such a pool still gives
every job a fresh worker: slower, as isolated).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from kcache.compile.jobs import UNSET, Job, JobOutput, JobResult, JobRunner, usable_cpu_count

__all__ = ["CompilePool", "Job", "JobResult", "TILELANG_PRELOAD", "shared_pool", "usable_cpu_count"]
from kcache.compile.protocol import ReplyUnreadable, WorkerDied
from kcache.compile.workers.template_process import TemplateGone, WorkerTemplate
from kcache.compile.workers.worker import job_outcome
from kcache.compile.workers.worker_process import EXIT_GRACE_S, WorkerProcess, anonymous_append_file
from kcache.errors import CompileAborted, CompilePoolError, CompilerCrashed, CompileTimeout

log = logging.getLogger("kcache")

# What a worker imports before it says it is ready: a compile then starts warm.
TILELANG_PRELOAD = ("tilelang", "kcache.tilelang.compiler")
START_TIMEOUT_S = 300.0
START_METHODS = ("exec", "fork")


@dataclass
class _Pending:
    future: Future[Any]
    payload: bytes
    name: str
    timeout_s: float | None
    calls: Any = None  # the caller's functions the job may call (worker_process.CallsOfCaller)
    aborted: str | None = None  # why abort() killed its worker


@dataclass
class _Slot:
    """One pool thread and the worker it drives."""

    thread: threading.Thread | None = None
    worker: WorkerProcess | None = None
    busy: bool = False
    pending: _Pending | None = None
    ready: threading.Event = field(default_factory=threading.Event)


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
        self._jobs: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._slots: list[_Slot] = []
        self._outstanding = 0
        self._lock = threading.Lock()
        self.closed = False
        self.owner_pid = os.getpid()
        self._numbers = itertools.count()
        self.start_method = start
        self._template: WorkerTemplate | None = None
        self._template_lock = threading.Lock()
        self._template_unusable = start != "fork"
        _live_pools.add(self)

    # ------------------------------------------------------------ public

    def submit(self, fn: Callable[..., Any], *args: Any, name: str | None = None,
               timeout_s: float | None = UNSET, output: JobOutput | None = None, calls: Any = None) -> Future[Any]:
        """Run `fn(*args)` in a worker. fn, args and the result must pickle (cloudpickle). `output`
        matters to the compile service only; `calls` answers the job's calls to this process
        (`worker.call_caller`).

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
        self._jobs.put(_Pending(future, payload, label, limit, calls))
        return future

    def warm(self, count: int | None = None) -> float:
        """Start `count` workers (default: all) and wait until every worker is ready, replacements of
        dead ones included; returns the seconds it took."""
        self._check_usable()
        started = time.monotonic()
        with self._lock:
            while len(self._slots) < min(count or self.max_workers, self.max_workers):
                self._add_slot()
            slots = list(self._slots)
        for slot in slots:
            slot.ready.wait()
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
        template = self._template
        return template.pid if template is not None and template.alive else None

    def close(self) -> None:
        """Stop the workers: idle ones exit, busy ones are killed (their futures fail)."""
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
        with self._template_lock:
            if self._template is not None:
                self._template.close()
                self._template = None
            self._template_unusable = True
        _live_pools.discard(self)

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
        slot = _Slot()
        slot.thread = threading.Thread(
            target=self._drive, args=(slot,), name=f"kcache-compile-{next(self._numbers)}", daemon=True
        )
        self._slots.append(slot)
        slot.thread.start()

    def _drive(self, slot: _Slot) -> None:
        """The loop of one pool thread: start its worker, then run jobs until the pool closes. Nothing
        that goes wrong here leaves a caller waiting: a job this thread took gets an error whatever
        happens, and the thread goes on with a fresh worker."""
        start_error: CompilePoolError | None = None
        try:
            slot.worker = self._start_worker()
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
                if slot.worker is None:
                    if start_error is not None:
                        # Reported once to the job that was waiting; the next job retries the start.
                        error, start_error = start_error, None
                        pending.future.set_exception(error)
                        continue
                    try:
                        slot.worker = self._start_worker()
                    except CompilePoolError as err:
                        pending.future.set_exception(err)
                        continue
                with self._lock:
                    slot.busy, slot.pending = True, pending
                if self.start_method == "fork":
                    slot.ready.clear()  # its worker is replaced after this job: `warm` waits for the new one
                self._run_one(slot, pending)
                if self.start_method == "fork" and slot.worker is not None and pending.aborted is None:
                    # The compile service's: a fresh fork of the template for every job, so that no
                    # module, global or registration of one client's job is seen by the next.
                    slot.worker.close()
                    slot.worker = None
                if pending.aborted is not None and slot.worker is not None:
                    # abort() killed it, or is about to, after its reply came: never hand it a job.
                    slot.worker.kill()
                    slot.worker = None
                if slot.worker is None and not self.closed:
                    # Replace a dead worker now, not when the next job is already waiting.
                    slot.ready.clear()
                    try:
                        slot.worker = self._start_worker()
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

    def _run_one(self, slot: _Slot, pending: _Pending) -> None:
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
            if self.closed:
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

    def _start_worker(self) -> WorkerProcess:
        template = self._usable_template()
        if template is not None:
            try:
                return WorkerProcess(self.preload, self.start_timeout_s, template)
            except TemplateGone as err:  # the next start makes a new template
                log.warning("kcache: the compile worker template is gone (%s); starting a new one", err)
        return WorkerProcess(self.preload, self.start_timeout_s)

    def start_template(self, *, forked: bool = False) -> None:
        """Start the worker template now, without waiting for its imports; the first worker start
        waits for them. `forked`: fork this process into it (only while it holds one thread: the
        compile service does this first thing)."""
        with self._template_lock:
            if not self._template_unusable and self._template is None:
                self._template = self._new_template(forked)

    def _new_template(self, forked: bool = False) -> WorkerTemplate | None:
        stderr = anonymous_append_file()
        try:
            return WorkerTemplate(self.preload, self.start_timeout_s, stderr, forked=forked)
        except (TemplateGone, CompilePoolError, OSError) as err:
            self._template_unusable = True
            log.warning("kcache: the compile worker template could not start (%s); workers start by exec", err)
            return None
        finally:
            os.close(stderr)  # the template holds its own copy

    def _usable_template(self) -> WorkerTemplate | None:
        """The worker template, started on first use unless `start_template` did (the first worker
        waits for its imports, the others fork from it); None where workers start by exec."""
        with self._template_lock:
            if self._template_unusable:
                return None
            if self._template is not None and not self._template.alive:
                self._template.close()
                self._template = None
            template = self._template or self._new_template()
            if template is None:
                return None
            try:
                template.wait_ready()
            except TemplateGone as err:
                self._template = None
                self._template_unusable = True
                log.warning("kcache: the compile worker template could not start (%s); workers start by exec", err)
                return None
            threads = template.threads or []
            if len(threads) > 1:
                # A fork would copy a process whose other threads may hold locks: not safe.
                self._template = None
                self._template_unusable = True
                log.warning("kcache: the compile worker template holds %d threads after importing %s (%s); "
                            "workers start by exec", len(threads), ", ".join(self.preload) or "nothing",
                            ", ".join(threads[1:]))
                template.close()
                return None
            self._template = template
            return template


_live_pools: weakref.WeakSet[CompilePool] = weakref.WeakSet()
_shared: dict[tuple[object, ...], CompilePool] = {}
_shared_lock = threading.Lock()


def shared_pool(workers: int | None, timeout_s: float | None, preload: Iterable[str]) -> CompilePool:
    """The process's pool for these settings, made on first use. Every KernelCache of a process shares it.

    Workers copy the environment when they start: set CUDA_HOME, TILELANG_*
    and friends before the first compile.
    """
    key = (workers, timeout_s, tuple(preload), os.getpid())
    with _shared_lock:
        pool = _shared.get(key)
        if pool is None or pool.closed:
            pool = _shared[key] = CompilePool(workers, timeout_s, preload=preload)
        return pool


@atexit.register
def close_all_pools() -> None:
    """Close every CompilePool of this process (its workers stopped): at exit, or earlier where a
    process stops what it started before it ends."""
    for pool in list(_live_pools):
        pool.close()
