"""A job's estimated cost crosses from the client to the compile service, which starts a client's
costliest queued job first (service.scheduler); what a client sends that is not a finite number
orders nothing."""

from __future__ import annotations

import math
import os
from pathlib import Path

from kcache.compile.service.server import _cost_or_none

from . import pool_jobs
from .test_service import service_pool


def test_the_service_runs_a_clients_queued_jobs_costliest_first(runtime: Path, tmp_path: Path) -> None:
    gates, runs, order = [tmp_path / f"gate{index}" for index in range(4)], tmp_path / "runs", tmp_path / "order"
    pool = service_pool(workers=4)
    running = []
    for gate in gates:  # every worker held
        os.mkfifo(gate)
        running.append(pool.submit(pool_jobs.gated_run, str(gate), str(runs)))
    queued = [pool.submit(pool_jobs.append_line, str(order), name, cost=cost)
              for name, cost in (("small", 1.0), ("large", 500.0), ("unestimated", None), ("medium", 20.0))]
    assert pool.ping()  # the service has taken every job in: they wait in its queue, in this order
    gates[0].write_text("go")  # one worker runs them, one after another
    for future in queued:
        future.result(timeout=60)
    assert order.read_text().split() == ["unestimated", "large", "medium", "small"]
    for gate in gates[1:]:
        gate.write_text("go")
    assert all(future.result(timeout=60) for future in running)


def test_a_cost_that_is_not_a_finite_number_leaves_the_job_in_arrival_order() -> None:
    assert [_cost_or_none(cost) for cost in (3, 2.5, None, "9", True, math.nan, math.inf, [1], 10**400)] == [
        3.0, 2.5, None, None, None, None, None, None, None]
