"""A process's side of the compile service: the CompilePool interface, served by this user's server.

`ServicePool.submit(fn, *args)` sends the pickled job to the service of this environment
(`address`), starting it when none listens, and returns a Future. Whatever goes wrong with
the service (it cannot start, its directory is not private, it is unreachable, it dies mid-job)
costs one warning and nothing else: the job, and every later one for a while, runs in this
process's own pool, as with `KCACHE_COMPILE_ISOLATION=pool`. A job the service lost mid-way is run
again there; a compile job first empties its staging directory, so a second run starts clean.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import cloudpickle

from kcache.compile.compile_slots import CompileSlot, CompileSlots
from kcache.compile.fork import caller_fork
from kcache.compile.jobs import UNSET, JobOutput, JobRunner, usable_cpu_count
from kcache.compile.protocol import CallByName
from kcache.compile.service import address
from kcache.compile.service.connection import START_TIMEOUT_S, connect, request
from kcache.compile.service.service_connection import SentJob, ServiceConnection
from kcache.compile.workers.worker import current_umask
from kcache.errors import CompileAborted
from kcache.setting_values import caller_fork_setting


class ServicePool(ServiceConnection, JobRunner):
    """The CompilePool interface (`submit`, `run`, `compile_many`, `warm`, `max_workers`) over the
    compile service, with the process's own pool (`fallback()`) when the service is not there (the
    connection and its loss: `ServiceConnection`)."""

    def __init__(self, workers: int | None, timeout_s: float | None, preload: Iterable[str], idle_s: float,
                 fallback: Callable[[], Any]) -> None:
        self.max_workers = workers or usable_cpu_count()
        self.timeout_s = timeout_s
        self.preload = tuple(preload)
        self.idle_s = idle_s
        self.name = address.identity(self.preload, self.max_workers)
        ServiceConnection.__init__(self, fallback)
        self._ids = itertools.count()
        self.owner_pid = os.getpid()
        self.caller_fork = caller_fork_setting()
        self.caller_forks = 0  # jobs this process ran in a fork of itself (`caller_fork`)
        self._slots = CompileSlots(self.name, self.max_workers)

    # ------------------------------------------------------------ the CompilePool interface

    def submit(self, fn: Callable[..., Any], *args: Any, name: str | None = None, timeout_s: float | None = UNSET,
               output: JobOutput | None = None, calls: Any = None, cost: float | None = None) -> Future[Any]:
        label = name or getattr(fn, "__qualname__", None) or repr(fn)
        limit = self.timeout_s if timeout_s is UNSET else timeout_s
        return self.submit_payload(cloudpickle.dumps((fn, args)), label, limit, output, calls=calls, cost=cost)

    def _wrapped(self, payload: bytes, umask: int | None) -> bytes:
        """The job as the service runs it: with this process's sys.path and umask (worker.run_client_job)."""
        return cloudpickle.dumps((CallByName("kcache.compile.workers.worker", "run_client_job"), (list(sys.path), umask, payload)))

    def submit_payload(self, payload: bytes, name: str, timeout_s: float | None = UNSET, output: JobOutput | None = None,
                       *, retried: bool = False, calls: Any = None, cost: float | None = None) -> Future[Any]:
        limit = self.timeout_s if timeout_s is UNSET else timeout_s
        conn = self._connection()
        if conn is None:
            return self._fallback().submit_payload(payload, name, limit, calls)
        future: Future[Any] = Future()
        job_id = next(self._ids)
        with self._lock:
            self._pending[job_id] = SentJob(future, payload, name, limit, calls, cost)
        try:
            umask = current_umask()
            merge_as = output
            if calls is not None and calls.functions:
                # A job that calls its caller's code never merges with another client's: each caller's
                # callbacks run once for its own compile, as with plain TileLang.
                merge_as = None
            elif output is not None and umask is not None:
                # Jobs merge only when their outputs would be the same files, modes included.
                merge_as = JobOutput(f"{output.key} umask {umask:o}", output.directory)
            self._send(conn, ("job", job_id, self._wrapped(payload, umask), name, limit, merge_as, cost))
        except OSError as err:
            # The server closed this connection before it could read the job (it exited when idle,
            # the usual case, or died): this job never ran, so it goes to a new connection, which
            # starts a new service, or to the own pool if the loss of running jobs marks the
            # service down. Running jobs the loss took are the own pool's (`_lost`).
            with self._lock:
                self._pending.pop(job_id, None)
            self._lost(conn, f"sending a job failed: {err}")
            if retried:
                return self._fallback().submit_payload(payload, name, limit, calls)
            return self.submit_payload(payload, name, limit, output, retried=True, calls=calls, cost=cost)
        return future

    def run(self, fn: Callable[..., Any], *args: Any, name: str | None = None, timeout_s: float | None = UNSET,
            output: JobOutput | None = None, calls: Any = None, cost: float | None = None) -> Any:
        """`submit(...).result()`; or, while the service is not warm and this process may (`caller_fork`),
        the job in a fork of this process, from memory, with the service started after it for later
        jobs. The job's calls to this process (`calls`) are answered in this thread either way."""
        slot = self._caller_fork_slot()
        if slot is None:
            return super().run(fn, *args, name=name, timeout_s=timeout_s, output=output, calls=calls, cost=cost)
        label = name or getattr(fn, "__qualname__", None) or repr(fn)
        limit = self.timeout_s if timeout_s is UNSET else timeout_s
        with slot:
            forks_before = self.caller_forks
            try:
                return caller_fork.run_in_fork(fn, args, label, limit, self._forked, calls)
            except caller_fork.ForkUnavailable as err:  # the job did not run
                self._warn("fork", f"could not compile in a fork of this process ({err}); using the compile service")
            finally:
                if self.caller_forks != forks_before:  # the job ran in a fork, however it ended
                    self._reach_service_later()
        return super().run(fn, *args, name=name, timeout_s=timeout_s, output=output, calls=calls, cost=cost)

    def _caller_fork_slot(self) -> CompileSlot | None:
        """A compile slot when this job should run in a fork of this process: the service is not
        warm (or not there), the fork is safe, and the machine-wide bound leaves room."""
        if not self.caller_fork or self._warm or os.getpid() != self.owner_pid:
            return None
        if caller_fork.unsafe_reason(self.preload) is not None:
            return None
        if self._conn is None and time.monotonic() >= self._down_until:
            # A service already running answers at once whether it is warm; none running is started
            # only after the fork (`_forked`), so that its start does not delay the compile.
            with self._lock:
                if self._conn is None:
                    with contextlib.suppress(OSError, EOFError):
                        self._adopt(*connect(self.name))
            if self._warm:
                return None
        try:
            return self._slots.try_take()
        except OSError:
            return None

    def _forked(self) -> None:
        """A job runs in a fork of this process."""
        self.caller_forks += 1

    def _reach_service_later(self) -> None:
        """After a job in a fork of this process: reach or start the service in the background, for
        the jobs after this one. Not while the fork compiles: a service starting beside it (its
        interpreter and template importing TileLang) slowed the fork's nvcc by up to 30% on an H100."""
        if self._conn is None:
            threading.Thread(target=self._connection, name=caller_fork.SERVICE_START_THREAD, daemon=True).start()

    def warm(self, count: int | None = None, *, wait: bool = False) -> float:
        """Reach (or start) the service and ask it to start `count` workers (default: 1 without `wait`,
        all with it); `wait`: until every worker is ready, replacements of dead ones included, as
        `CompilePool.warm`. The own pool's `warm` when there is no service."""
        started = time.monotonic()
        conn = self._connection()
        if conn is None:
            return float(self._fallback().warm(count))
        if wait:
            request(self.name, ("warm", count or self.max_workers, True))
        else:
            self._send(conn, ("warm", count or 1))
        return time.monotonic() - started

    def submit_to_service(self, fn: Callable[..., Any], *args: Any, name: str | None = None,
                          output: JobOutput | None = None) -> Future[Any] | None:
        """`submit`, to the service only: None when it cannot be reached, for a job that is not worth
        starting the own pool's worker (which imports TileLang) for."""
        if self._connection() is None:
            return None
        return self.submit(fn, *args, name=name, output=output)

    def ping(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        """Whether the service answered a ping on this process's connection: then it has taken in
        every job submitted before (messages on one connection are handled in order)."""
        conn = self._connection()
        if conn is None:
            return False
        token = next(self._ids)
        answered = self._pongs[token] = threading.Event()
        try:
            self._send(conn, ("ping", token))
            return answered.wait(timeout_s)
        finally:
            self._pongs.pop(token, None)

    def worker_pids(self) -> list[int]:
        """The service's worker pids (the own pool's when there is no service)."""
        if self._connection() is None:
            return list(self._fallback().worker_pids())
        return list(request(self.name, ("status",))["worker_pids"])

    def __enter__(self) -> ServicePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Disconnect: the service drops this process's queued jobs and stops its running ones, whose
        futures raise CompileAborted."""
        with self._lock:
            conn, self._conn = self._conn, None
            unfinished, self._pending = self._pending, {}  # not run again anywhere: closing stops them
        for sent in unfinished.values():
            sent.future.set_exception(CompileAborted(sent.name, "its ServicePool was closed"))
        if conn is not None:
            self._shut(conn)  # its reader closes it
