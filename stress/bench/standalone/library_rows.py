"""The rows of `python -m stress.bench --only triton-library` (stress.bench.standalone.triton_library):
each lane's median against plain Triton's cold run, the floors under it, and the report, which fails
where a test's verdict differs between runs."""

from __future__ import annotations

import statistics
import sys
from typing import Any

from ..suite.dataset import this_machine
from ..suite.own_run import print_readings
from ..suite.rows import row
from ..suite.timing import utc_now
from .library_floors import compiled_at_once_s
from .library_run import Library, Run
from .library_verdicts import differing, summary

PLAIN = "plain Triton, cold (empty TRITON_CACHE_DIR)"
FLOOR_AT_ONCE = ("tuning alone and each tune's longest compile or C build, s: the floor of a cold run whose tunes' "
                 "configs compile at once")
FLOOR_ONE_GIL = ("tuning alone and each tune's compiles, their front halves in turn, s: the floor of a cold run that "
                 "runs the program's code only in its process")


def bench_rows(library: Library, runs: list[Run]) -> list[dict[str, Any]]:
    """The bench's rows: medians of each lane, against plain Triton's; none for a lane that did not run."""

    def median(lane: str) -> float | None:
        walls = [run.wall_s for run in runs if run.lane == lane]
        return statistics.median(walls) if walls else None

    def compiles(lane: str) -> float | None:  # None where a root was never made (nothing compiled or fetched)
        counted = [run.stats.get("lookups", {}).get("triton", {}).get("compiles") for run in runs if run.lane == lane]
        return None if not counted or None in counted else max(counted)

    def compiled_at_once(one_gil: bool = False) -> float | None:  # each turn's tuning alone, and its compiles
        plain = {run.turn: run.compile_spans for run in runs if run.lane == "plain cold" and run.compile_spans}
        floors = [run.wall_s + compiled_at_once_s(plain[run.turn], one_gil=one_gil) for run in runs
                  if run.lane == "tuning alone" and run.turn in plain]
        return statistics.median(floors) if floors else None

    cold = median("plain cold")
    readings: list[tuple[str, float | None, float | None, str, str]] = [
        ("cold, wall median s", median("kcache cold"), cold, "s", PLAIN),
        ("warm, wall median s", median("kcache warm"), median("plain warm"), "s", "plain Triton on its own warm cache"),
        ("second machine (empty root, the first's entries in S3), wall median s", median("second machine"), cold,
         "s", PLAIN),
        ("first machine (empty root, uploading to S3), wall median s", median("first machine"), cold, "s", PLAIN),
        ("tuning alone (every kernel compiled, no tune's result), wall median s: the floor of a cold run",
         median("tuning alone"), cold, "s", PLAIN),
        (FLOOR_AT_ONCE, compiled_at_once(), cold, "s", PLAIN),
        (FLOOR_ONE_GIL, compiled_at_once(one_gil=True), cold, "s", PLAIN),
        ("Triton compiles, second machine (most of a turn)", compiles("second machine"), compiles("first machine"),
         "runs", "the first machine's"),
        (f"tests whose verdict differs between runs ({len(runs)} runs)",
         len(differing({run.name: run.verdicts for run in runs})), None, "tests", "")]
    return [row(library.label, metric, value, baseline, unit, against)
            for metric, value, baseline, unit, against in readings if value is not None]


def report(library: Library, runs: list[Run], rows: list[dict[str, Any]]) -> int:
    """The table and the verdicts' comparison; 1 where a verdict differs between runs."""
    device, cores = this_machine()
    print(f"triton-library: {library.label}, {device}, {cores} cores, {utc_now()}")
    print_readings(rows, 70)
    different = differing({run.name: run.verdicts for run in runs})
    if not different:
        print(f"  verdicts identical in all {len(runs)} runs: {summary(runs[0].verdicts)}")
        return 0
    print(f"triton-library: VERDICTS DIFFER: {len(different)} tests do not have one verdict in all {len(runs)} "
          "runs; the timings compare different work", file=sys.stderr)
    for test, seen in different.items():
        print(f"  {test}: " + "; ".join(f"{run}: {verdict}" for run, verdict in seen.items()), file=sys.stderr)
    return 1
