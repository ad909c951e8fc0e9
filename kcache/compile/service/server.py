"""The compile service's serving: one long-lived server per user, machine and environment, shared by every process.

It keeps a `CompilePool` of warm workers (TileLang imported; forked from a worker template) for all
of this user's processes: a fresh process's first compile costs a compile, not an import. At most
`N` compiles run machine-wide, whoever asks, taking the clients in turn within the memory budget
(`scheduler`), and sharing `N` compile slots with the clients that compile in a fork of themselves
until the service is warm (`compile_slots`, `caller_fork`); identical jobs in flight run once
(`inflight`). Its process (start, name lock, socket, exit): `server_process`.

- Warm: a worker is ready (TileLang imported). The greeting says whether the service is warm, and
  every connected client is told ("warmed",) once it is: until then, a client that imported TileLang
  itself compiles in a fork of itself rather than wait for the service's import.
- Every connection's peer is checked with SO_PEERCRED: only this uid is served. The socket is in a
  0700 directory of this user (`address`), and nothing listens on a network.
- A job is `(fn, args)` pickled by the client; it is passed to the pool as it came, and its result or
  exception goes back pickled. A crash, segfault or hang kills that job's worker only (the pool's
  isolation): the client gets `CompilerCrashed` or `CompileTimeout` as from its own pool.
- A client that disconnects has its queued jobs dropped and its running ones stopped.
- With no job for the idle time (`--idle`) it tells its clients ("bye", "idle") and stops serving.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import socket
import threading
import time
from concurrent.futures import Future
from typing import Any

from kcache.compile.service.address import peer_uid
from kcache.compile.service.calls import CallRelay

log = logging.getLogger("kcache")

class Server:
    def __init__(self, listener: socket.socket, pool: Any, idle_s: float, memory_budget: int | None = None,
                 slots: Any = None) -> None:
        from kcache.compile.service.inflight import InflightOutputs
        from kcache.compile.service.scheduler import FairScheduler, worker_memory

        self.listener = listener
        self.pool = pool
        self.scheduler = FairScheduler(pool, memory_budget, lambda pids: [worker_memory(pid) for pid in pids], slots)
        self.warm = threading.Event()  # a worker is ready
        self.inflight = InflightOutputs()
        self.idle_s = idle_s
        self.started = time.time()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._outstanding = 0
        self._last_activity = time.monotonic()
        self._clients = 0
        self._client_ids = itertools.count()
        self._senders: dict[int, Any] = {}  # each connected client's send
        self.counts = {"jobs": 0, "failed": 0, "cancelled": 0, "clients_served": 0, "refused": 0}

    def serve(self) -> None:
        from kcache.compile import protocol as wire

        while not self.stopping.is_set():
            with self._lock:
                idle_for = time.monotonic() - self._last_activity if self._outstanding == 0 else 0.0
            if idle_for >= self.idle_s:
                log.info("kcache service: idle for %.0f s, exiting", idle_for)
                with self._lock:
                    senders = list(self._senders.values())
                for send in senders:  # a job already on its way was not run: its client may send it anew
                    send(("bye", "idle"))
                return
            if not wire.readable_within(self.listener.fileno(), max(0.05, min(1.0, self.idle_s - idle_for))):
                continue
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve_client, args=(conn,), name="kcache-service-client",
                             daemon=True).start()

    def _serve_client(self, conn: socket.socket) -> None:
        from kcache.compile import protocol as wire

        with conn:
            if peer_uid(conn) != os.geteuid():  # only this user: root, too, is refused
                with self._lock:
                    self.counts["refused"] += 1
                return
            fd = conn.fileno()
            send_lock = threading.Lock()
            client = next(self._client_ids)
            connected = [True]

            def send(message: Any) -> None:
                # Never after this connection closed: its descriptor number may then be another
                # client's connection, which would get this client's answers (job ids overlap).
                with send_lock, contextlib.suppress(OSError):
                    if connected[0]:
                        wire.send(fd, message)

            with self._lock:
                self._clients += 1
                self.counts["clients_served"] += 1
                self._senders[client] = send
            relay = CallRelay(send)

            try:
                while True:
                    try:
                        message = wire.receive_reply(fd, None, "reading a client's messages")
                    except (EOFError, OSError, wire.WorkerDied):  # gone, or stalled mid-message
                        return
                    except Exception:  # noqa: BLE001 - a message this server cannot read: see below
                        log.exception("kcache service: an unreadable message; closing the connection")
                        return
                    if not self._handle(message, client, send, relay):
                        return
            finally:
                relay.close()  # a job waiting for this client's answer hears it is gone
                with self._lock:
                    self._senders.pop(client, None)
                with send_lock:
                    connected[0] = False
                cancelled = self.scheduler.drop_client(client)  # a gone client's jobs, queued or running
                with self._lock:
                    self._clients -= 1
                    self.counts["cancelled"] += cancelled

    def _handle(self, message: Any, client: int, send: Any, relay: CallRelay) -> bool:
        """One message of a client; False when its connection should close. A message this server
        does not understand (a client of another protocol) closes it: the client then runs its jobs
        in its own pool, never waits for an answer that will not come."""
        try:
            kind = message[0]
            if kind == "job":
                _, job_id, payload, name, timeout_s, output, cost = message
                self._submit(client, job_id, payload, name, timeout_s, send, output, relay.for_job(job_id),
                             _cost_or_none(cost))
            elif kind == "return":  # ("return", job id, pickled answer): a client answered its job's call
                relay.answered(message[1], message[2])
            elif kind == "hello":
                send(("hello", os.getpid(), self.warm.is_set()))
            elif kind == "ping":  # answered after every message before it on this connection
                send(("pong", message[1]))
            elif kind == "status":
                send(("status", self.status()))
            elif kind == "warm":  # ("warm", count, wait): wait=True answers once they are ready
                count, wait = message[1], len(message) > 2 and message[2]
                if wait:
                    waited = self.pool.warm(count)
                    self.mark_warm()  # before the answer: a client that waited on it is told first
                    send(("warm", waited))
                else:
                    threading.Thread(target=self.pool.warm, args=(count,), daemon=True).start()
                    send(("warm", None))
            elif kind == "stop":
                send(("stop", os.getpid()))
                self.stopping.set()
                with contextlib.suppress(OSError):
                    self.listener.shutdown(socket.SHUT_RDWR)
                return False
            else:
                raise ValueError(f"unknown message {kind!r}")
        except Exception:  # noqa: BLE001 - see the docstring
            log.exception("kcache service: a message it cannot handle; closing the connection")
            return False
        return True

    def _submit(self, client: int, job_id: int, payload: bytes, name: str, timeout_s: float | None,
                send: Any, output: Any, calls: Any, cost: float | None) -> None:
        """Queue a client's job, or let it follow an identical one in flight (`inflight`)."""
        from kcache.compile import protocol as wire
        from kcache.compile.service.inflight import Follower, merge_key
        from kcache.compile.service.scheduler import QueuedJob
        from kcache.errors import CompileAborted

        with self._lock:
            self._outstanding += 1
            self._last_activity = time.monotonic()

        def answer(result: Any, error: BaseException | None, cancelled: bool = False) -> None:
            with self._lock:
                self._outstanding -= 1
                self._last_activity = time.monotonic()
                self.counts["jobs"] += 1
            if cancelled:
                return
            if error is None:
                try:
                    wire.cloudpickle.dumps(result)
                    send(("ok", job_id, result))
                    return
                except Exception as err:  # an unpicklable result: say so
                    error = RuntimeError(f"the job's result could not be sent back: {err!r}")
            with self._lock:
                self.counts["failed"] += 1
            send(("err", job_id, error))

        def done(finished: Future[Any]) -> None:
            cancelled = finished.cancelled()
            error = None if cancelled else finished.exception()
            result = None if cancelled or error is not None else finished.result()
            answer_followers = (self.inflight.finish(merged_as, result, error, cancelled or isinstance(error, CompileAborted))
                                if merged_as is not None else lambda: None)
            answer(result, error, cancelled)  # the leader first: its directory was copied already
            answer_followers()

        def run_own() -> None:
            self.scheduler.add(QueuedJob(client, payload, name, timeout_s, done_alone, calls, cost))

        def done_alone(finished: Future[Any]) -> None:
            cancelled = finished.cancelled()
            error = None if cancelled else finished.exception()
            answer(None if cancelled or error is not None else finished.result(), error, cancelled)

        merged_as = None if output is None else merge_key(output.key, output.directory)
        if merged_as is not None and not self.inflight.lead_or_follow(merged_as, output.directory,
                                                                      Follower(output.directory, answer, run_own)):
            return
        self.scheduler.add(QueuedJob(client, payload, name, timeout_s, done, calls, cost))

    def warm_up(self) -> None:
        """Start the first worker, then say that the service is warm (`mark_warm`)."""
        self.pool.warm(1)
        self.mark_warm()

    def mark_warm(self) -> None:
        """Once a worker is ready, tell every connected client that the service is warm, once (a
        client connecting later reads it in the greeting). A worker that could not start leaves it
        cold: the clients that can go on compiling in forks of themselves."""
        if self.warm.is_set() or not self.pool.worker_pids():
            return
        with self._lock:
            if self.warm.is_set():
                return
            self.warm.set()
            senders = list(self._senders.values())
        for send in senders:
            send(("warmed",))

    def status(self) -> dict[str, Any]:
        from kcache.compile.service.scheduler import worker_memory

        workers = self.pool.worker_pids()
        with self._lock:
            return {
                "pid": os.getpid(),
                "uptime_s": round(time.time() - self.started, 1),
                "max_workers": self.pool.max_workers,
                "workers": len(workers),
                "worker_pids": workers,
                "template_pid": self.pool.template_pid(),
                "worker_memory_bytes": sum(worker_memory(pid) for pid in workers),
                "memory_budget_bytes": self.scheduler.memory_budget,
                "held_back_by_memory": self.scheduler.held_back,
                "waited_for_slot": self.scheduler.waited_for_slot,
                "warm": self.warm.is_set(),
                "merged_jobs": self.inflight.merged,
                **self.scheduler.counts(),
                "clients": self._clients,
                "idle_timeout_s": self.idle_s,
                **self.counts,
            }


def _cost_or_none(cost: object) -> float | None:
    """A job's estimated cost as its client sent it, if it is a finite number: it only orders that
    client's own jobs (scheduler), so anything else just leaves the job in arrival order."""
    if not isinstance(cost, (int, float)) or isinstance(cost, bool):
        return None
    try:
        value = float(cost)
    except OverflowError:  # an int past a float's range
        return None
    return value if math.isfinite(value) else None
