"""How the scenarios of `python -m stress.bench` time what they measure: lanes taking turns, a fresh
process's wall time, percentiles."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

Sample = TypeVar("Sample")


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (of an even count, p50 is the lower middle value)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def take_turns(lanes: Sequence[Sample], turns: int,
               sample: Callable[[Sample, int], float]) -> dict[Sample, list[float]]:
    """`sample(lane, turn)` of each lane, `turns` times, the lanes taking turns: a drift of the machine over
    the run (page cache, clocks, other tenants) then weighs on every lane alike instead of on one."""
    found: dict[Sample, list[float]] = {lane: [] for lane in lanes}
    for turn in range(turns):
        for lane in lanes:
            found[lane].append(sample(lane, turn))
    return found


def seconds_of(command: list[str], env: dict[str, str], cwd: Path | None = None) -> float:
    """The wall time of `command`, a fresh process run to its end as a user types it (its output dropped)."""
    start = time.perf_counter()
    subprocess.run(command, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def utc_now() -> str:
    """This minute, for a report's heading: "2026-11-29 04:45 UTC"."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
