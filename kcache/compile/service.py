"""The compile service: one long-lived server per user, machine and environment, shared by every process.

    python -m kcache.compile.service --name NAME --workers N --idle SECONDS --preload JSON --ready-fd FD

Started on demand by a client (`kcache.compile.service_client`), detached (it forks once and its
parent exits, so it is nobody's child), it keeps a `CompilePool` of warm workers (TileLang imported)
for all of this user's processes: a fresh process's first compile costs a compile, not an import.
At most `N` compiles run machine-wide, whoever asks, in the order they were asked.

- Only one server per name: it holds `compile-NAME.lock` (flock) for its life. A stale socket file
  left by a dead server is removed under that lock, never one in use.
- Every connection's peer is checked with SO_PEERCRED: only this uid is served. The socket is in a
  0700 directory of this user (`service_address`), and nothing listens on a network.
- A job is `(fn, args)` pickled by the client; it is passed to the pool as it came, and its result or
  exception goes back pickled. A crash, segfault or hang kills that job's worker only (the pool's
  isolation): the client gets `CompilerCrashed` or `CompileTimeout` as from its own pool.
- A client that disconnects has its queued jobs cancelled.
- With no job for `--idle` seconds the server exits; the next miss starts a new one.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import select
import socket
import struct
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any

log = logging.getLogger("kcache")

PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_uid(conn: socket.socket) -> int:
    _pid, uid, _gid = PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))
    return uid


class Server:
    def __init__(self, listener: socket.socket, pool: Any, idle_s: float) -> None:
        self.listener = listener
        self.pool = pool
        self.idle_s = idle_s
        self.started = time.time()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._running = 0
        self._last_activity = time.monotonic()
        self._clients = 0
        self.counts = {"jobs": 0, "failed": 0, "cancelled": 0, "clients_served": 0, "refused": 0}

    def serve(self) -> None:
        while not self.stopping.is_set():
            with self._lock:
                idle_for = time.monotonic() - self._last_activity if self._running == 0 else 0.0
            if idle_for >= self.idle_s:
                log.info("kcache service: idle for %.0f s, exiting", idle_for)
                return
            readable, _, _ = select.select([self.listener], [], [], max(0.05, min(1.0, self.idle_s - idle_for)))
            if not readable:
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
            with self._lock:
                self._clients += 1
                self.counts["clients_served"] += 1
            fd = conn.fileno()
            send_lock = threading.Lock()
            futures: dict[int, Future[Any]] = {}

            def send(message: Any) -> None:
                with send_lock, contextlib.suppress(OSError):
                    wire.send(fd, message)

            try:
                while True:
                    try:
                        message = wire.cloudpickle.loads(wire.recv_bytes(fd))
                    except (EOFError, OSError):
                        return
                    kind = message[0]
                    if kind == "job":
                        _, job_id, payload, name, timeout_s = message
                        future = futures[job_id] = self._submit(job_id, payload, name, timeout_s, send)
                        future.add_done_callback(lambda _done, finished=job_id: futures.pop(finished, None))
                    elif kind == "hello":
                        send(("hello", os.getpid()))
                    elif kind == "status":
                        send(("status", self.status()))
                    elif kind == "warm":
                        threading.Thread(target=self.pool.warm, args=(message[1],), daemon=True).start()
                        send(("warm", True))
                    elif kind == "stop":
                        send(("stop", os.getpid()))
                        self.stopping.set()
                        with contextlib.suppress(OSError):
                            self.listener.shutdown(socket.SHUT_RDWR)
                        return
            finally:
                cancelled = sum(future.cancel() for future in list(futures.values()))  # a gone client's queued jobs
                with self._lock:
                    self._clients -= 1
                    self.counts["cancelled"] += cancelled

    def _submit(self, job_id: int, payload: bytes, name: str, timeout_s: float | None, send: Any) -> Future[Any]:
        from kcache.compile import protocol as wire

        with self._lock:
            self._running += 1
            self._last_activity = time.monotonic()
        future = self.pool.submit_payload(payload, name, timeout_s)

        def done(finished: Future[Any]) -> None:
            with self._lock:
                self._running -= 1
                self._last_activity = time.monotonic()
                self.counts["jobs"] += 1
            if finished.cancelled():
                return
            error = finished.exception()
            if error is None:
                try:
                    wire.cloudpickle.dumps(finished.result())
                    send(("ok", job_id, finished.result()))
                    return
                except Exception as err:  # an unpicklable result: say so
                    error = RuntimeError(f"the job's result could not be sent back: {err!r}")
            with self._lock:
                self.counts["failed"] += 1
            send(("err", job_id, error))

        future.add_done_callback(done)
        return future

    def status(self) -> dict[str, Any]:
        workers = self.pool.worker_pids()
        with self._lock:
            return {
                "pid": os.getpid(),
                "uptime_s": round(time.time() - self.started, 1),
                "max_workers": self.pool.max_workers,
                "workers": len(workers),
                "worker_rss_bytes": sum(_rss(pid) for pid in workers),
                "running": self._running,
                "clients": self._clients,
                "idle_timeout_s": self.idle_s,
                **self.counts,
            }


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kcache.compile.service")
    parser.add_argument("--name", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--idle", type=float, required=True)
    parser.add_argument("--preload", default="[]")
    parser.add_argument("--ready-fd", type=int, default=-1)
    parser.add_argument("--sys-path", default=None, help="the client's sys.path (JSON): jobs import as there")
    args = parser.parse_args(argv)
    if args.sys_path:
        sys.path[:] = json.loads(args.sys_path)
    if os.fork() > 0:  # detach: the starter reaps this parent at once, the server is nobody's child
        os._exit(0)
    ready = args.ready_fd

    def tell(word: bytes) -> None:
        nonlocal ready
        if ready >= 0:
            with contextlib.suppress(OSError):
                os.write(ready, word)
            os.close(ready)
            ready = -1

    from kcache.compile import service_address as address

    lock_fd = os.open(address.lock_path(args.name), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        tell(b"busy")  # another server of this name runs or is starting
        return 0
    path = address.socket_path(args.name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # stale: its server is dead, or it would hold the lock
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o077)
    try:
        listener.bind(str(path))
    finally:
        os.umask(previous)
    listener.listen(128)
    identity = os.stat(path)

    from kcache.compile.pool import CompilePool

    pool = CompilePool(args.workers, None, preload=json.loads(args.preload))
    server = Server(listener, pool, args.idle)
    threading.Thread(target=pool.warm, args=(1,), daemon=True).start()  # overlaps the first client's imports
    tell(b"ready")
    try:
        server.serve()
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path)[:2] == identity[:2]:
                os.unlink(path)
        listener.close()
        pool.close()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    sys.exit(main())
