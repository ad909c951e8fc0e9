"""The tunes-at-once profile (stress.bench.profiles.tunes), on the CPU: its site hook times a Triton
compile's steps in every process kcache starts for it (the caller, the compile service, its workers),
and its timeline reads them. The profile itself needs the GPU; the hook and the reading do not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from stress.bench.profiles.events import LOG_ENV
from stress.bench.profiles.tunes import SITE, timeline

from .helpers import PROJECT, child_env


def test_the_site_hook_times_each_step_where_it_runs_caller_service_and_worker(tmp_path: Path, runtime: Path) -> None:
    log = tmp_path / "events.jsonl"
    env = child_env(TRITON_CACHE_MANAGER="kcache.triton:CacheManager", KCACHE_DIR=str(tmp_path / "root"),
                    **{LOG_ENV: str(log)})
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), env["PYTHONPATH"]])
    done = subprocess.run([sys.executable, "-m", "stress.programs.triton_programs.cpu_tune"], env=env,
                          cwd=str(PROJECT), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    where = {what: {e["pid"] for e in events if e["what"] == what} for what in
             ("front half", "back half asked", "job queued", "slot runs job", "back half")}
    caller, = where["front half"]
    assert where["back half asked"] == {caller}
    service, = where["job queued"]
    assert where["slot runs job"] == {service} and service != caller
    assert len(where["back half"]) == 17 and not where["back half"] & {caller, service}  # a fresh worker each
    ran_on = {int(e["detail"]) for e in events if e["what"] == "slot runs job"}
    # Each back half ran on the worker its slot named, but the worker template's own warm-up compile
    # (kcache.triton.stages.warm_up_template), before it forked its first.
    assert len(where["back half"] - ran_on) == 1
    backs = [e for e in events if e["what"] == "back half"]
    start, end = min(e["start"] for e in events), max(e["end"] for e in events)
    found = timeline(events, start, end, 2)
    assert sum(len(config) for config in found["back_half_s"]) and all(
        detail.startswith("stages=") for detail in {e["detail"] for e in backs})
    assert 0 < found["busy_while_queued"] <= 2 and found["tail_s"] > 0 and found["window_s"] == end - start


def test_the_timeline_reads_a_slots_gap_its_workers_busy_while_jobs_wait_and_the_tail() -> None:
    def event(what: str, start: float, end: float, thread: str = "", detail: str = "") -> dict:
        return {"pid": 1, "thread": thread, "what": what, "start": start, "end": end, "detail": detail}

    # Two slots; slot a runs 0.0-1.0 then 1.1-2.0, slot b 0.0-2.5: each back half within its job.
    events = [event("job queued", 0.0, 0.0), event("job queued", 0.0, 0.0), event("job queued", 0.5, 0.5),
              event("slot runs job", 0.0, 1.0, "a"), event("slot runs job", 1.1, 2.0, "a"),
              event("slot runs job", 0.0, 2.5, "b"),
              event("back half", 0.0, 1.0, detail="stages=3 warps=4"), event("back half", 1.1, 2.0, detail="stages=3 warps=4"),
              event("back half", 0.0, 2.5, detail="stages=4 warps=8")]
    found = timeline(events, 0.0, 2.5, 2)
    assert found["last_queued_s"] == 0.5
    assert found["slot_gap_ms"] == (100.0, 100.0)  # slot a, from 1.0 to 1.1
    # From the 2nd start (0.0) to the last (1.1): slot b busy throughout, slot a but for its gap.
    assert abs(found["busy_while_queued"] - 2.1 / 1.1) < 1e-9
    assert abs(found["tail_s"] - 1.4) < 1e-9  # the last back half began at 1.1
    assert found["back_half_s"] == {"stages=3 warps=4": 0.95, "stages=4 warps=8": 2.5}
