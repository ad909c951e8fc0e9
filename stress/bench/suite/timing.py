"""How the scenarios of `python -m stress.bench` time what they measure: lanes taking turns, a fresh
process's wall time, percentiles."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

Lane = TypeVar("Lane")
Reading = TypeVar("Reading")


def percentile(values: list[float], q: float) -> float:
    """The value at rank round(q% of n - 1) of the sorted values, no interpolation (Python's round: half to
    even; p50 of 10 values is the 5th, the lower middle one, of 4 the 3rd)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def take_turns(lanes: Sequence[Lane], turns: int, sample: Callable[[Lane, int], Reading]) -> dict[Lane, list[Reading]]:
    """`sample(lane, turn)` of each lane, `turns` times, the lanes taking turns: a drift of the machine over
    the run (page cache, clocks, other tenants) then weighs on every lane alike instead of on one."""
    found: dict[Lane, list[Reading]] = {lane: [] for lane in lanes}
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
