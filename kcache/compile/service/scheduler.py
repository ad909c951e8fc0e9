"""Which client's job the compile service runs next: round-robin across clients, within bounds.

The service's pool runs at most `max_workers` jobs at once. Were every client's jobs put straight
into its queue, one process that asks for 64 autotuning configs would make a process asking for
one kernel wait behind all 64. Here each client has its own queue and the pool is fed one job at a
time, taking the clients in turn, so a client waits for at most one job of each other client per
free worker.

Of a client's own queued jobs, the costliest by its estimate goes first (a Triton back half's, from
kcache.triton.compile_cost): a tune waits for all its configs, and when the long ones start first its
last seconds are spent on short ones, not on one long compile with the other cores idle. Jobs without
an estimate (TileLang's) keep their arrival order, ahead of estimated ones. A job passed over
`max_workers` times goes next whatever the estimates, so none waits for long behind later arrivals.
An estimate orders its own client's jobs only: it cannot move another client's.

The memory budget (`KCACHE_COMPILE_MEMORY`) bounds the same dispatch: a job starts only while the
workers' memory (proportional set size: pages shared with the template count once) plus one
more worker's (the largest seen) fits the budget, or an idle worker can take it; one job always
may run, so a budget below one worker slows compiles down but never stops them.

The machine-wide bound (`compile_slots`) bounds it too: each running job holds a compile slot, and
clients that compile in a fork of themselves while the service is not warm hold the others. With
every slot held, a job waits; nothing tells the service when a client's slot is free, so it looks
again every SLOT_RETRY_S while jobs wait for a slot (only at a cold start, while clients compile
in forks of themselves).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kcache.compile.compile_slots import CompileSlot, CompileSlots

SLOT_RETRY_S = 0.05


@dataclass(eq=False)
class QueuedJob:
    client: int
    payload: bytes
    name: str
    timeout_s: float | None
    done: Callable[[Future[Any]], None]  # called once, with the pool's finished future
    calls: Any = None  # the relay of the job's calls to its client (service.CallRelay)
    cost: float | None = None  # the client's estimate of its run time, relative to its other jobs
    future: Future[Any] | None = field(default=None, init=False)
    passed_over: int = field(default=0, init=False)  # later jobs of its client that started before it
    slot: CompileSlot | None = field(default=None, init=False)


class FairScheduler:
    """Feeds `pool` (a CompilePool) from per-client queues, round-robin."""

    def __init__(self, pool: Any, memory_budget: int | None, rss_of: Callable[[list[int]], list[int]],
                 slots: CompileSlots | None = None) -> None:
        self.pool = pool
        self.slots = slots
        self.memory_budget = memory_budget
        self._rss_of = rss_of  # resident bytes of each of these pids
        self._lock = threading.Lock()
        self._queues: dict[int, deque[QueuedJob]] = {}
        self._turns: deque[int] = deque()  # clients with queued jobs, in the order they are served
        self._running: set[QueuedJob] = set()
        self.largest_worker_rss = 0
        self.held_back = 0  # dispatches the memory budget delayed
        self.waited_for_slot = 0  # dispatches delayed because clients' forks held every compile slot
        self._retry: threading.Timer | None = None

    def add(self, job: QueuedJob) -> None:
        with self._lock:
            queue = self._queues.setdefault(job.client, deque())
            if not queue:
                self._turns.append(job.client)
            queue.append(job)
        self._dispatch()

    def drop_client(self, client: int) -> int:
        """A client went away: its queued jobs are dropped and its running ones killed with their
        worker (a hang it left behind would hold a worker forever). Returns how many."""
        with self._lock:
            queued = self._queues.pop(client, deque())
            if client in self._turns:
                self._turns.remove(client)
            running = [job for job in self._running if job.client == client]
        for job in queued:
            never_run: Future[Any] = Future()
            never_run.cancel()
            job.done(never_run)
        for job in running:
            assert job.future is not None
            self.pool.abort(job.future, "its client went away")
        return len(queued) + len(running)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"queued": sum(len(q) for q in self._queues.values()), "running": len(self._running),
                    "clients_waiting": len(self._turns)}

    def _dispatch(self) -> None:
        while True:
            with self._lock:
                if not self._turns or len(self._running) >= self.pool.max_workers or not self._memory_allows():
                    return
                may_run, slot = self._take_slot()
                if not may_run:
                    return
                client = self._turns.popleft()
                queue = self._queues[client]
                job = self._next_of(queue)
                if queue:
                    self._turns.append(client)
                else:
                    del self._queues[client]
                job.slot = slot
                self._running.add(job)
            job.future = self.pool.submit_payload(job.payload, job.name, job.timeout_s, job.calls)
            job.future.add_done_callback(lambda finished, job=job: self._finished(job, finished))

    def _next_of(self, queue: deque[QueuedJob]) -> QueuedJob:
        """A client's next job (and out of its queue): its costliest, jobs without an estimate first
        and equals in arrival order, unless its oldest has been passed over `max_workers` times."""
        chosen = queue[0]
        if chosen.passed_over < self.pool.max_workers:
            chosen = max(queue, key=lambda job: math.inf if job.cost is None else job.cost)
        for waiting in queue:
            if waiting is chosen:
                break
            waiting.passed_over += 1
        queue.remove(chosen)
        return chosen

    def _memory_allows(self) -> bool:
        if self.memory_budget is None or not self._running:
            return True
        workers = self.pool.worker_pids()
        if len(self._running) < len(workers):
            return True  # an idle worker takes it: no new memory (and no reading of every worker's: a
            # dispatch reads /proc per worker, slow where /proc is emulated, as under gVisor)
        sizes = self._rss_of(workers)
        self.largest_worker_rss = max([self.largest_worker_rss, *sizes])
        if sum(sizes) + self.largest_worker_rss <= self.memory_budget:
            return True
        self.held_back += 1
        return False

    def _take_slot(self) -> tuple[bool, CompileSlot | None]:
        """(whether the next job may run, the compile slot it holds). Without slots, or where they
        cannot be had, it runs without one: the scheduler's own bound still holds. When clients hold
        every slot it waits, and the dispatch is tried again in SLOT_RETRY_S. Called under the lock."""
        if self.slots is None:
            return True, None
        try:
            slot = self.slots.try_take()
        except OSError:
            return True, None
        if slot is not None:
            return True, slot
        self.waited_for_slot += 1
        if self._retry is None:
            self._retry = threading.Timer(SLOT_RETRY_S, self._retry_dispatch)
            self._retry.daemon = True
            self._retry.start()
        return False, None

    def _retry_dispatch(self) -> None:
        with self._lock:
            self._retry = None
        self._dispatch()

    def _finished(self, job: QueuedJob, finished: Future[Any]) -> None:
        with self._lock:
            self._running.discard(job)
            if job.slot is not None:
                job.slot.release()
        self._dispatch()
        job.done(finished)


def worker_memory(pid: int) -> int:
    """A worker's proportional set size: pages it shares with the template and its siblings count
    by their share, so the sum over workers is what they cost together (RSS would count the
    template's TileLang once per worker)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
