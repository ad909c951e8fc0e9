"""A fork pool's spare workers (kcache.compile.pool.spare_workers): the next job's worker is forked
while jobs run, a spare is used only while its template lives, and a used worker's exit is waited
for by the pool, never by the template, whose one channel every fork goes through (issue 67)."""

from __future__ import annotations

import os
import signal
import time

from kcache.compile.pool.process_pool import CompilePool
from kcache.compile.workers.worker_process import EXIT_GRACE_S, exited_within

from . import pool_jobs

WITHIN_S = 30.0  # the bound on every wait here: a spare is forked in milliseconds


def _children(pid: int) -> set[int]:
    """The live children of process `pid` (its workers, for a template)."""
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as children:
            found.update(int(child) for child in children.read().split())
    return found


def _fork_pool(workers: int) -> CompilePool:
    return CompilePool(workers, None, preload=("tests.pool_jobs",), start="fork")


def test_the_next_jobs_worker_is_forked_before_the_job_before_it_ends() -> None:
    with _fork_pool(1) as pool:
        pool.warm()  # the slot's worker, and the spare: both forked and ready
        template = pool.template_pid()
        assert template is not None
        forked_before = _children(template)
        first = pool.submit(pool_jobs.worker_pid).result(WITHIN_S)
        second = pool.submit(pool_jobs.worker_pid).result(WITHIN_S)
        assert forked_before == {first, second}  # both forked before either job came
        assert len({pool.submit(pool_jobs.worker_pid).result(WITHIN_S) for _ in range(4)} | {first, second}) == 6


def test_workers_that_died_idle_with_their_template_are_never_handed_a_job() -> None:
    """The slot's next worker and the spares, forked ahead, die with a template that is killed (the OOM
    killer's pick, say): the next job gets a live worker of a new template, not CompilerCrashed."""
    with _fork_pool(1) as pool:
        pool.warm()
        template = pool.template_pid()
        assert template is not None
        idle = _children(template)  # the slot's next worker and the spare
        assert len(idle) == 2
        os.kill(template, signal.SIGKILL)  # its idle workers die with it (PR_SET_PDEATHSIG)
        assert all(exited_within(pid, WITHIN_S) for pid in idle)
        served_by = pool.submit(pool_jobs.worker_pid).result(WITHIN_S)  # no CompilerCrashed: a new template's
        assert served_by not in idle
        assert pool.template_pid() not in (None, template)


def test_a_worker_slow_to_exit_holds_up_no_other_workers_fork() -> None:
    with _fork_pool(2) as pool:
        slow = pool.submit(pool_jobs.linger_at_exit, 4 * EXIT_GRACE_S).result(WITHIN_S)
        started = time.monotonic()
        served_by = [job.result(WITHIN_S) for job in [pool.submit(pool_jobs.worker_pid) for _ in range(6)]]
        waited = time.monotonic() - started
        lingered = not exited_within(slow, 0)
        assert len(set(served_by)) == 6 and slow not in served_by
        # Waited for in the template, the slow worker's exit held every fork for EXIT_GRACE_S.
        assert waited < EXIT_GRACE_S / 2, f"6 jobs took {waited:.1f} s while a used worker was slow to exit"
        assert lingered, "the used worker did not linger: the fault never fired"
    assert exited_within(slow, WITHIN_S)  # killed after its grace, not left behind
