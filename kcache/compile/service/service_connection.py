"""A `ServicePool`'s connection to its compile service: reached or started on demand, read by one
thread (its only closer), and lost: the jobs it leaves unfinished then go to a new service or to
the process's own pool.

Apart from `client` because this is the life of one socket (reaching it, reading its answers,
closing it without freeing its descriptor under a reader, what a loss means for the jobs on it),
while `client` is the CompilePool interface over it and the choice of a fork of the caller.
`ServicePool` is this class with that interface; the state both use is made here.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NamedTuple

from kcache.compile import protocol as wire
from kcache.compile.fork import caller_fork
from kcache.compile.jobs import UNSET
from kcache.compile.service.connection import connect_or_start
from kcache.compile.workers.worker_process import answer_call

log = logging.getLogger("kcache")

RETRY_AFTER_S = 30.0  # after a failure, the own pool serves this long before the service is tried again


class SentJob(NamedTuple):
    """A job sent to the service and not answered yet: what sending it again takes."""

    future: Future[Any]
    payload: bytes
    name: str
    limit: float | None
    calls: Any  # the caller's functions it may call
    cost: float | None  # its estimate (service.scheduler)


class ServiceConnection:
    """The connection half of `ServicePool` (`client`): `_connection()` reaches the service or says
    it is down, `_send` writes to it, and its reader settles the jobs in `_pending`."""

    name: str
    max_workers: int
    preload: tuple[str, ...]
    idle_s: float

    def __init__(self, fallback: Callable[[], Any]) -> None:
        self._fallback = fallback
        self._lock = threading.Lock()
        self._conn: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._close_lock = threading.Lock()  # a connection's shutdown against its close (`_shut`, `_read`)
        self._pending: dict[int, SentJob] = {}  # by job id
        self._pongs: dict[int, threading.Event] = {}
        self._left_idle: set[int] = set()  # connections whose server said it exits when idle
        self._down_until = 0.0
        self._warned: set[str] = set()
        self.server_pid: int | None = None
        self._warm = False  # the connected service has a worker ready (its greeting, or ("warmed",) after it)

    def submit_payload(self, payload: bytes, name: str, timeout_s: float | None = UNSET, output: Any = None,
                       *, retried: bool = False, calls: Any = None, cost: float | None = None) -> Future[Any]:
        raise NotImplementedError  # `ServicePool`'s: the jobs a lost connection leaves go to it again

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
                    entry.future.set_result(message[2])
                else:
                    entry.future.set_exception(message[2])
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
            for sent in orphans.values():
                _chain(self.submit_payload(sent.payload, sent.name, sent.limit, retried=True, calls=sent.calls,
                                           cost=sent.cost), sent.future)
            return
        self._down_until = time.monotonic() + RETRY_AFTER_S
        self._warn("lost", f"the compile service (pid {self.server_pid}) went away with {len(orphans)} job(s) running: "
                   f"{why}; running them in this process's own pool")
        for sent in orphans.values():
            _chain(self._fallback().submit_payload(sent.payload, sent.name, sent.limit, sent.calls), sent.future)

    def _answer_call(self, conn: socket.socket, job_id: int, name: str, args: bytes) -> None:
        """A running job calls a function of this process: call it (in the thread waiting for the
        job, if one does) and send the answer back, pickled, through the service to the job."""
        with self._lock:
            entry = self._pending.get(job_id)
        answer = answer_call(entry.calls if entry is not None else None, name, args)
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
