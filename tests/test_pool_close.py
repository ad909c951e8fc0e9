"""Closing a compile pool with a job running leaves the running worker's pipes to the thread that
drives it. That thread reads the worker's reply by descriptor number; a pipe closed by the closing
thread would free its number for the next open of the process, and the driving thread could then read
from that instead (the compile service's client had that race: tests/test_service_client_close.py).
A real pool, a real worker held in a real job; the closes are watched, not replaced."""

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
