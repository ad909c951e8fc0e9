"""The compile service's dispatch (`FairScheduler`): clients in turn, within the worker and memory
bounds. Driven by a recording pool whose futures the test finishes, so the order is exact."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from kcache.compile.service.scheduler import FairScheduler, QueuedJob


class RecordingPool:
    def __init__(self, max_workers: int) -> None:
        self.max_workers = max_workers
        self.started: list[tuple[str, Future[Any]]] = []
        self.workers: list[int] = []
        self.aborted: list[str] = []

    def submit_payload(self, payload: bytes, name: str, timeout_s: float | None, calls: Any = None) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()
        self.started.append((name, future))
        if len(self.workers) < len(self.started) - sum(f.done() for _, f in self.started):
            self.workers.append(100 + len(self.workers))
        return future

    def worker_pids(self) -> list[int]:
        return list(self.workers)

    def abort(self, future: Future[Any], why: str) -> bool:
        self.aborted.append(why)
        future.set_exception(RuntimeError(why))
        return True

    def finish(self, name: str) -> None:
        (future,) = [f for n, f in self.started if n == name and not f.done()]
        future.set_result(name)

    def names(self) -> list[str]:
        return [name for name, _ in self.started]


def job(client: int, name: str, done: list[str]) -> QueuedJob:
    return QueuedJob(client, b"", name, None, lambda finished: done.append(name))


def test_clients_are_served_in_turn_not_in_arrival_order() -> None:
    pool, done = RecordingPool(1), []
    scheduler = FairScheduler(pool, None, lambda pids: [0 for _ in pids])
    for name in ("a1", "a2", "a3", "a4"):  # a tuner's batch arrives first
        scheduler.add(job(1, name, done))
    scheduler.add(job(2, "b1", done))  # one kernel of another process
    scheduler.add(job(3, "c1", done))
    assert pool.names() == ["a1"] and scheduler.counts() == {"queued": 5, "running": 1, "clients_waiting": 3}
    for name in ("a1", "a2", "b1", "c1", "a3"):
        pool.finish(name)
    assert pool.names() == ["a1", "a2", "b1", "c1", "a3", "a4"]  # FIFO would run b1 after a4
    assert done == ["a1", "a2", "b1", "c1", "a3"]


def test_no_more_jobs_run_at_once_than_the_pool_has_workers() -> None:
    pool, done = RecordingPool(2), []
    scheduler = FairScheduler(pool, None, lambda pids: [0 for _ in pids])
    for index in range(5):
        scheduler.add(job(index, f"j{index}", done))
    assert pool.names() == ["j0", "j1"]
    pool.finish("j1")
    assert pool.names() == ["j0", "j1", "j2"] and scheduler.counts()["running"] == 2


def test_the_memory_budget_holds_back_a_new_worker_but_never_the_first_job() -> None:
    pool, done = RecordingPool(4), []
    gigabyte = 1 << 30
    scheduler = FairScheduler(pool, 3 * gigabyte // 2, lambda pids: [gigabyte for _ in pids])
    for index in range(3):
        scheduler.add(job(index, f"j{index}", done))
    # One worker of 1 GiB runs; a second would make 2 GiB, over the 1.5 GiB budget.
    assert pool.names() == ["j0"] and scheduler.held_back >= 1
    pool.finish("j0")  # its worker is idle now: the next job takes it, no new memory
    assert pool.names() == ["j0", "j1"]
    unbounded = FairScheduler(RecordingPool(4), None, lambda pids: [gigabyte for _ in pids])
    for index in range(3):
        unbounded.add(job(index, f"j{index}", done))
    assert unbounded.counts()["running"] == 3


def test_a_client_that_goes_away_has_its_queued_jobs_dropped_and_its_running_one_aborted() -> None:
    pool, done = RecordingPool(1), []
    scheduler = FairScheduler(pool, None, lambda pids: [0 for _ in pids])
    for name in ("a1", "a2", "a3"):
        scheduler.add(job(1, name, done))
    scheduler.add(job(2, "b1", done))
    assert scheduler.drop_client(1) == 3
    assert pool.aborted == ["its client went away"]
    assert pool.names() == ["a1", "b1"]  # b1 got the worker a1 held
    assert sorted(done) == ["a1", "a2", "a3"]  # every dropped job was answered (as cancelled or failed)


def costed(client: int, name: str, cost: float | None, done: list[str]) -> QueuedJob:
    return QueuedJob(client, b"", name, None, lambda finished: done.append(name), cost=cost)


def test_a_clients_costliest_queued_job_starts_first_and_jobs_without_an_estimate_before_any() -> None:
    pool, done = RecordingPool(8), []
    scheduler = FairScheduler(pool, None, lambda pids: [0 for _ in pids])
    running = [f"r{index}" for index in range(8)]  # every worker busy: what comes next waits
    for name in running:
        scheduler.add(costed(1, name, None, done))
    for name, cost in (("c1", 1.0), ("c3", 3.0), ("tilelang", None), ("c2", 2.0), ("c3b", 3.0)):
        scheduler.add(costed(1, name, cost, done))
    for name in running[:5]:
        pool.finish(name)  # one worker free at a time
    # Arrival order would be c1, c3, tilelang, c2, c3b; equal estimates keep theirs.
    assert pool.names()[8:] == ["tilelang", "c3", "c3b", "c2", "c1"]


def test_a_job_passed_over_as_many_times_as_there_are_workers_goes_next_whatever_comes_after_it() -> None:
    pool, done = RecordingPool(2), []
    scheduler = FairScheduler(pool, None, lambda pids: [0 for _ in pids])
    for name, cost in (("r1", None), ("r2", None), ("small", 1.0), ("big1", 9.0)):
        scheduler.add(costed(1, name, cost, done))
    pool.finish("r1")  # big1 before small: passed over once
    scheduler.add(costed(1, "big2", 9.0, done))
    pool.finish("r2")  # big2 before small: twice, the workers' count
    scheduler.add(costed(1, "big3", 9.0, done))
    pool.finish("big1")
    assert pool.names() == ["r1", "r2", "big1", "big2", "small"]  # not big3, though it is costlier


def test_estimates_order_a_clients_own_jobs_never_another_clients_turn() -> None:
    pool, done = RecordingPool(1), []
    scheduler = FairScheduler(pool, None, lambda pids: [0 for _ in pids])
    for name, cost in (("a0", None), ("a1", 1.0), ("a9", 9.0)):
        scheduler.add(costed(1, name, cost, done))
    scheduler.add(costed(2, "b", 0.001, done))
    for name in ("a0", "a9", "b"):
        pool.finish(name)
    assert pool.names() == ["a0", "a9", "b", "a1"]
