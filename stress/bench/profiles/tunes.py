"""Where kcache's lane of 8 tunes at once spends its window: a diagnostic beside the bench's tunes row
(`stress.bench.triton_tunes`), not a goal. GPU only, as the row.

    python -m stress.bench --only triton --profile --tunes [--repeats 5]

Each turn runs kcache's lane alone (8 fresh processes, each starting a 16-config tune of its own), with
every step of every compile timed where it runs (`tunes_site/sitecustomize.py`, on the children's
PYTHONPATH, kcache's own interpreters included): the front halves and back halves asked for in the
callers, the jobs queued and run by the compile service's slots, the back halves in its workers. Per
turn it prints the window (the first compile's start to the last one's end); when the last back half
was queued; how many workers ran while back halves still waited to start, against the pool's width;
how long a slot stood between one job's end and its next job's start; the tail, from the last back
half's start to the window's end; and the back halves' medians by their config's stages and warps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from .events import LOG_ENV

SITE = Path(__file__).resolve().parent / "tunes_site"


def timeline(events: list[dict[str, Any]], start: float, end: float, width: int) -> dict[str, Any]:
    """From the events of a turn's window (those begun within it) the numbers the profile prints (see
    the docstring). `width`: the service's workers (its pool's bound)."""
    events = [e for e in events if start <= e["start"] <= end]
    backs = sorted((e["start"], e["end"], e["detail"]) for e in events if e["what"] == "back half")
    queued = [e["start"] for e in events if e["what"] == "job queued"]
    starts = [b[0] for b in backs]  # in order
    full_from, last_start = starts[min(width, len(starts)) - 1], starts[-1]
    busy = sum(max(0.0, min(b, last_start) - max(a, full_from)) for a, b, _ in backs)
    slots: dict[tuple[int, str], list[tuple[float, float]]] = {}  # the service's pool threads, each one slot
    for e in events:
        if e["what"] == "slot runs job":
            slots.setdefault((e["pid"], e["thread"]), []).append((e["start"], e["end"]))
    gaps: list[float] = []
    for runs in slots.values():
        runs.sort()
        gaps += [later[0] - earlier[1] for earlier, later in zip(runs, runs[1:]) if later[0] <= last_start]
    by_config: dict[str, list[float]] = {}
    for a, b, config in backs:
        by_config.setdefault(config, []).append(b - a)
    return {
        "window_s": end - start,
        "last_queued_s": max(queued) - start if queued else None,
        "busy_while_queued": busy / (last_start - full_from) if last_start > full_from else None,
        "width": width,
        "slot_gap_ms": _median_and_p90(gaps),
        "tail_s": end - last_start,
        "back_half_s": {config: round(statistics.median(times), 3) for config, times in sorted(by_config.items())},
    }


def _median_and_p90(values: list[float]) -> tuple[float, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * statistics.median(ordered), 2), round(1000 * ordered[int(0.9 * (len(ordered) - 1))], 2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stress.bench --only triton --profile --tunes")
    parser.add_argument("--repeats", type=int, default=5, help="turns")
    parser.add_argument("--procs", type=int, default=8)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("triton: the tunes profile needs a GPU: Triton's autotuner benchmarks each config", flush=True)
        return
    from ...command_scope import command_scope
    from ..suite.children import bytecode_as_installed
    from ..triton_lanes import plain_env
    from ..triton_tunes import compile_window, run_lane

    env = bytecode_as_installed()
    width = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="kcache-tunes-profile-") as work, command_scope():
        # One log for every turn: the compile service, started by the first turn's processes, serves the
        # later ones with the environment it started with. Each turn reads the events of its window.
        log = Path(work) / "events.jsonl"
        path = os.pathsep.join(filter(None, [str(SITE), plain_env(env).get("PYTHONPATH", "")]))
        for turn in range(args.repeats):
            folder = Path(work) / f"turn-{turn}"
            run_lane(folder, "kcache", env, args.procs, {"PYTHONPATH": path, LOG_ENV: str(log)})
            _, start, end = compile_window(folder / "compile-spans")
            events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            print(f"turn {turn}: " + json.dumps(timeline(events, start, end, width)), flush=True)
