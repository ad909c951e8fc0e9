"""Closing a compile pool with a job running leaves the running worker's pipes to the thread that
drives it. That thread reads the worker's reply by descriptor number; a pipe closed by the closing
thread would free its number for the next open of the process, and the driving thread could then read
from that instead (the compile service's client had that race: tests/test_service_client_close.py).
The same for the worker template's control socket, which a pool thread reads while asking for a
fork. A real pool, a real template, a real worker held in a real job; the closes are watched, not
replaced."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from kcache.compile.pool.process_pool import CompilePool
from kcache.compile.workers import worker_process

from . import pool_jobs


def test_a_busy_worker_s_pipes_are_closed_by_its_own_thread_when_the_pool_closes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    closers: list[tuple[str, int, str]] = []  # (which pipe, the worker's pid, the closing thread's name)
    real_close_fd = worker_process.WorkerProcess._close_fd

    def watched_close_fd(self: worker_process.WorkerProcess, name: str) -> None:
        if getattr(self, name) >= 0:
            closers.append((name, self.pid, threading.current_thread().name))
        real_close_fd(self, name)

    monkeypatch.setattr(worker_process.WorkerProcess, "_close_fd", watched_close_fd)
    fifo = tmp_path / "held"
    os.mkfifo(fifo)
    pool = CompilePool(1, preload=("tests.pool_jobs",))
    future = pool.submit(pool_jobs.read_fifo, str(fifo))  # running, held until the FIFO is written
    with open(fifo, "w"):  # opens once the job has opened its end: the job runs now
        busy_pid = pool.worker_pids()[0]
        pool.close()
    with pytest.raises(RuntimeError, match="closed while"):
        future.result(60)
    mine = [(pipe, thread) for pipe, pid, thread in closers if pid == busy_pid]
    assert {pipe for pipe, _thread in mine} >= {"_to_worker", "_from_worker"}  # its pipes were closed
    assert all(thread.startswith("kcache-compile-") for _pipe, thread in mine), mine  # by its own thread


def test_a_job_still_queued_when_the_pool_closes_never_starts(tmp_path: Path) -> None:
    """Behind a running job, a queued one (one that would never end) when the pool closes: the running
    one's worker is killed, and the queued one fails without starting. It once started on a fresh
    worker after the close and held its pool thread forever (a thread left behind by tests/test_pool.py
    kept later tests from forking)."""
    fifo = tmp_path / "held"
    os.mkfifo(fifo)
    pool = CompilePool(1, preload=("tests.pool_jobs",))
    running = pool.submit(pool_jobs.read_fifo, str(fifo))
    queued = pool.submit(pool_jobs.hang)
    with open(fifo, "w"):  # the first job runs now, the second waits behind it
        pool.close()
    with pytest.raises(RuntimeError, match="closed while"):
        running.result(60)
    with pytest.raises(RuntimeError, match="closed before .* started"):
        queued.result(60)
    assert not any(slot.thread is not None and slot.thread.is_alive() for slot in pool._slots)


def test_the_template_s_control_socket_is_closed_after_a_request_in_flight_ends(tmp_path: Path) -> None:
    """A request to the worker template in flight on another thread (a `reap` the template answers
    only when the worker ends) when the template is closed: the close wakes it first, and closes the
    socket once it is over, never under it."""
    from kcache.compile.workers.template_process import TemplateGone, WorkerTemplate
    from kcache.compile.workers.worker_process import anonymous_append_file

    stderr = anonymous_append_file()
    template = WorkerTemplate(("tests.pool_jobs",), 60.0, stderr)
    os.close(stderr)
    job_read, job_write = os.pipe()
    reply_read, reply_write = os.pipe()
    worker_stderr = anonymous_append_file()
    try:
        template.wait_ready()
        worker = template.fork((job_read, reply_write, worker_stderr))  # waits for a job: alive
        in_flight = threading.Event()
        closed_during_request: list[bool] = []
        real_ask = template._ask

        def watched_ask(request: tuple, fds: tuple[int, ...]) -> tuple:
            in_flight.set()
            try:
                return real_ask(request, fds)
            finally:
                in_flight.clear()

        class WatchedSocket:
            def __init__(self, sock: object) -> None:
                self._sock = sock

            def __getattr__(self, name: str) -> object:
                return getattr(self._sock, name)

            def close(self) -> None:
                closed_during_request.append(in_flight.is_set())
                self._sock.close()  # type: ignore[attr-defined]

        template._control = WatchedSocket(template._control)  # type: ignore[assignment]
        template._ask = watched_ask  # type: ignore[method-assign]
        outcome: list[BaseException | object] = []

        def reap() -> None:
            try:
                outcome.append(template.reap(worker, 20.0))  # the worker lives on: answered in 20 s
            except BaseException as err:  # noqa: BLE001 - what the close made of the request
                outcome.append(err)

        asking = threading.Thread(target=reap)
        asking.start()
        assert in_flight.wait(30), "the request never started"
        template.close()
        asking.join(30)
        assert not asking.is_alive()
        assert closed_during_request == [False]  # the socket closed after the request ended
        assert len(outcome) == 1 and isinstance(outcome[0], TemplateGone)  # woken by the close
    finally:
        for fd in (job_read, job_write, reply_read, reply_write, worker_stderr):
            os.close(fd)
