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
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import cloudpickle

from kcache.compile import protocol as wire
from kcache.compile.compile_slots import CompileSlot, CompileSlots
from kcache.compile.fork import caller_fork
from kcache.compile.jobs import UNSET, JobOutput, JobRunner, usable_cpu_count
from kcache.compile.protocol import CallByName
from kcache.compile.service import address
from kcache.compile.service.connection import START_TIMEOUT_S, connect, connect_or_start, request
from kcache.compile.workers.worker import current_umask
from kcache.compile.workers.worker_process import answer_call
from kcache.errors import CompileAborted
from kcache.setting_values import caller_fork_setting

log = logging.getLogger("kcache")

RETRY_AFTER_S = 30.0  # after a failure, the own pool serves this long before the service is tried again


class ServicePool(JobRunner):
    """The CompilePool interface (`submit`, `run`, `compile_many`, `warm`, `max_workers`) over the
    compile service, with the process's own pool (`fallback()`) when the service is not there."""

    def __init__(self, workers: int | None, timeout_s: float | None, preload: Iterable[str], idle_s: float,
                 fallback: Callable[[], Any]) -> None:
        self.max_workers = workers or usable_cpu_count()
        self.timeout_s = timeout_s
        self.preload = tuple(preload)
        self.idle_s = idle_s
        self.name = address.identity(self.preload, self.max_workers)
        self._fallback = fallback
        self._lock = threading.Lock()
        self._conn: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._close_lock = threading.Lock()  # a connection's shutdown against its close (`_shut`, `_read`)
        # job id -> (its future, payload, name, time limit, the caller's functions it may call)
        self._pending: dict[int, tuple[Future[Any], bytes, str, float | None, Any]] = {}
        self._pongs: dict[int, threading.Event] = {}
        self._left_idle: set[int] = set()  # connections whose server said it exits when idle
        self._ids = itertools.count()
        self._down_until = 0.0
        self._warned: set[str] = set()
        self.server_pid: int | None = None
        self.owner_pid = os.getpid()
        self._warm = False  # the connected service has a worker ready (its greeting, or ("warmed",) after it)
        self.caller_fork = caller_fork_setting()
        self.caller_forks = 0  # jobs this process ran in a fork of itself (`caller_fork`)
        self._slots = CompileSlots(self.name, self.max_workers)

    # ------------------------------------------------------------ the CompilePool interface

    def submit(self, fn: Callable[..., Any], *args: Any, name: str | None = None,
               timeout_s: float | None = UNSET, output: JobOutput | None = None, calls: Any = None) -> Future[Any]:
        label = name or getattr(fn, "__qualname__", None) or repr(fn)
        limit = self.timeout_s if timeout_s is UNSET else timeout_s
        return self.submit_payload(cloudpickle.dumps((fn, args)), label, limit, output, calls=calls)

    def _wrapped(self, payload: bytes, umask: int | None) -> bytes:
        """The job as the service runs it: with this process's sys.path and umask (worker.run_client_job)."""
        return cloudpickle.dumps((CallByName("kcache.compile.workers.worker", "run_client_job"), (list(sys.path), umask, payload)))

    def submit_payload(self, payload: bytes, name: str, timeout_s: float | None = UNSET,
                       output: JobOutput | None = None, *, retried: bool = False, calls: Any = None) -> Future[Any]:
        limit = self.timeout_s if timeout_s is UNSET else timeout_s
        conn = self._connection()
        if conn is None:
            return self._fallback().submit_payload(payload, name, limit, calls)
        future: Future[Any] = Future()
        job_id = next(self._ids)
        with self._lock:
            self._pending[job_id] = (future, payload, name, limit, calls)
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
            self._send(conn, ("job", job_id, self._wrapped(payload, umask), name, limit, merge_as))
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
            return self.submit_payload(payload, name, limit, output, retried=True, calls=calls)
        return future

    def run(self, fn: Callable[..., Any], *args: Any, name: str | None = None, timeout_s: float | None = UNSET,
            output: JobOutput | None = None, calls: Any = None) -> Any:
        """`submit(...).result()`; or, while the service is not warm and this process may (`caller_fork`),
        the job in a fork of this process, from memory, with the service started after it for later
        jobs. The job's calls to this process (`calls`) are answered in this thread either way."""
        slot = self._caller_fork_slot()
        if slot is None:
            return super().run(fn, *args, name=name, timeout_s=timeout_s, output=output, calls=calls)
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
        return super().run(fn, *args, name=name, timeout_s=timeout_s, output=output, calls=calls)

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
        for future, _payload, name, _limit, _calls in unfinished.values():
            future.set_exception(CompileAborted(name, "its ServicePool was closed"))
        if conn is not None:
            self._shut(conn)  # its reader closes it

    # ------------------------------------------------------------ the connection

    def _connection(self) -> socket.socket | None:
        with self._lock:
            if self._conn is not None:
                return self._conn
            if time.monotonic() < self._down_until:
                return None
            try:
                connected = connect_or_start(self.name, self.max_workers, self.preload, self.idle_s)
            except Exception as err:  # whatever it is, the compile goes on in the own pool
                self._down_until = time.monotonic() + RETRY_AFTER_S
                self._warn("unavailable", f"the compile service is unavailable ({err}); compiling without it, "
                           "in this process's own pool or in forks of this process")
                return None
            return self._adopt(*connected)

    def _adopt(self, conn: socket.socket, pid: int, warm: bool) -> socket.socket:
        """Make `conn` this process's connection and start reading it (under the lock)."""
        self._conn, self.server_pid, self._warm = conn, pid, warm
        threading.Thread(target=self._read, args=(conn,), name=caller_fork.SERVICE_READER_THREAD, daemon=True).start()
        return conn

    def _send(self, conn: socket.socket, message: Any) -> None:
        with self._send_lock:  # the reader closes the socket under it: no write between fileno() and os.write
            wire.send(conn.fileno(), message)

    def _shut(self, conn: socket.socket) -> None:
        """End the connection both ways without freeing its descriptor: the reader, blocked in a read or
        about to read, gets EOF and closes it (`_read`); a sender blocked in a write gets EPIPE. The
        close lock keeps the reader from freeing the number meanwhile (shutting down whatever reused it).
        Never under the send lock: a sender may be blocked in a write to a service that is not reading."""
        with self._close_lock, contextlib.suppress(OSError):
            if conn.fileno() != -1:  # not closed yet, and not while this lock is held
                conn.shutdown(socket.SHUT_RDWR)

    def _read(self, conn: socket.socket) -> None:
        """The connection's reader, and the only closer of its socket. The protocol reads and writes by
        descriptor number: a socket closed by another thread while this one is about to read would
        free its number for the next open of this process (a pipe, a file), and this thread would read
        from that instead, 8 bytes of a message's header taken from someone else's data. So the
        others only shut the socket down (this thread reads EOF), and it is closed here, once read
        for the last time, under the send lock (no write is between its fileno() and os.write)."""
        try:
            self._read_until_lost(conn)
        finally:
            with self._send_lock, self._close_lock:
                conn.close()

    def _read_until_lost(self, conn: socket.socket) -> None:
        try:
            while True:
                # A message begun must end within protocol.MESSAGE_DEADLINE_S; one that cannot be
                # rebuilt here loses its job id: either way the connection is given up as lost.
                message = wire.receive_reply(conn.fileno(), None, "reading the compile service's answers")
                if message[0] == "bye":  # it exits when idle: what it has not answered, it never ran
                    self._left_idle.add(id(conn))
                    continue
                if message[0] == "warmed":
                    self._warm = True
                    continue
                if message[0] == "pong":
                    answered = self._pongs.get(message[1])
                    if answered is not None:
                        answered.set()
                    continue
                if message[0] == "call":  # ("call", job id, name, pickled args): a job calls this process
                    self._answer_call(conn, *message[1:])
                    continue
                if message[0] not in ("ok", "err"):
                    continue
                with self._lock:
                    entry = self._pending.pop(message[1], None)
                if entry is None:
                    continue
                if message[0] == "ok":
                    entry[0].set_result(message[2])
                else:
                    entry[0].set_exception(message[2])
        except (EOFError, OSError, wire.WorkerDied, wire.ReplyUnreadable) as err:
            self._lost(conn, f"the connection closed ({err})" if str(err) else "the connection closed")

    def _lost(self, conn: socket.socket, why: str) -> None:
        """The service went away: its unfinished jobs run again in the own pool."""
        with self._lock:
            if self._conn is conn:
                self._conn, self._warm = None, False
            orphans, self._pending = self._pending, {}
        self._shut(conn)
        left_idle = id(conn) in self._left_idle
        self._left_idle.discard(id(conn))
        if not orphans:
            return  # an idle service that exited: the next job reconnects (or starts a new one)
        if left_idle:
            # The jobs crossed the server's idle exit on the way: none of them ran. A new service.
            for future, payload, name, limit, calls in orphans.values():
                _chain(self.submit_payload(payload, name, limit, retried=True, calls=calls), future)
            return
        self._down_until = time.monotonic() + RETRY_AFTER_S
        self._warn("lost", f"the compile service (pid {self.server_pid}) went away with {len(orphans)} job(s) running: "
                   f"{why}; running them in this process's own pool")
        for future, payload, name, limit, calls in orphans.values():
            _chain(self._fallback().submit_payload(payload, name, limit, calls), future)

    def _answer_call(self, conn: socket.socket, job_id: int, name: str, args: bytes) -> None:
        """A running job calls a function of this process: call it (in the thread waiting for the
        job, if one does) and send the answer back, pickled, through the service to the job."""
        with self._lock:
            entry = self._pending.get(job_id)
        answer = answer_call(entry[4] if entry is not None else None, name, args)
        with contextlib.suppress(OSError):
            self._send(conn, ("return", job_id, answer))

    def _warn(self, topic: str, message: str) -> None:
        if topic not in self._warned:  # once per kind of trouble and process
            self._warned.add(topic)
            log.warning("kcache: %s", message)


def _chain(source: Future[Any], target: Future[Any]) -> None:
    def copy(done: Future[Any]) -> None:
        error = done.exception()
        if error is not None:
            target.set_exception(error)
        else:
            target.set_result(done.result())

    source.add_done_callback(copy)


_shared: dict[tuple[object, ...], ServicePool] = {}
_shared_lock = threading.Lock()


def shared_service_pool(workers: int | None, timeout_s: float | None, preload: Iterable[str],
                        idle_s: float) -> ServicePool:
    """The process's ServicePool for these settings; its fallback is the process's shared pool. A pool
    reads KCACHE_CALLER_FORK and XDG_RUNTIME_DIR once, when it is made, so both are part of its key: a
    compile after either changed goes through a pool of the new values, never one made under the old."""
    from kcache.compile.pool.process_pool import shared_pool

    preload = tuple(preload)
    key = (workers, timeout_s, preload, idle_s, caller_fork_setting(), os.environ.get("XDG_RUNTIME_DIR"), os.getpid())
    with _shared_lock:
        found = _shared.get(key)
        if found is None:
            found = _shared[key] = ServicePool(workers, timeout_s, preload, idle_s,
                                               lambda: shared_pool(workers, timeout_s, preload))
        return found


def close_shared_service_pools() -> None:
    """Disconnect every ServicePool of this process (`close`): their unfinished jobs stop, none runs
    again in a fallback pool. For a process that stops what it started before it ends (the stress
    harness's commands, interrupted), before it stops its services."""
    with _shared_lock:
        pools = list(_shared.values())
    for pool in pools:
        pool.close()
