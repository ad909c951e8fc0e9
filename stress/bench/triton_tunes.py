"""`python -m stress.bench --only triton --triton-rows tunes` (issue 67, GPU only): 8 processes at once,
each starting a 16-config tune of its own.

8 fresh processes, one machine's cache, each starting a different 16-config tune at the same moment
(stress.programs.triton_programs.tune, KT_VARIANT: each its own register cap, so no two share a key),
taking turns (at most 5 each); the compile phases together: the longest of the processes' times spent
compiling (within Triton's `compile` calls, as its compilation listener reports them, overlapping calls
counted once: plain Triton's one after another between its benchmarks, kcache's at once ahead of
them); and the most assemblies (ptxas) that ran at once. Goals: at most 0.55x plain Triton's (0.5x is
the limit: plain Triton keeps 8 cores busy, kcache 16), with at most as many compiles at once as the
machine has usable cores. kcache's lane runs each program as the README does, `kcache run -m`: Triton's
key of its own installation is then computed as the program imports Triton (kcache.triton.key_ahead),
where plain Triton computes it in its first compile.

Beside them, two floors:
- kcache's own floor, each kcache turn: a tune's first compile runs alone in its process (Triton's
  first-compile work, the first config's front half, and the key of Triton's installation where it is
  not computed yet) before its configs fan out; from then on the lane's CPU time (the machine's,
  sampled from /proc/stat while it ran: compiles, kcache and the programs) spread evenly on every core.
  No schedule of that same work finishes sooner, so a ratio under it needs less work, not better order.
  Printed beside it, each turn: the window's ramp and tail, the seconds from its start until 90% of the
  cores were first busy and from the last such moment to its end (where kcache's time above that floor
  goes).
- the machine's floor, with no kcache and no tune (stress.programs.triton_programs.wide_floor): the same
  128 compiles from one queue in as many processes as cores, against 8 processes compiling 16 each one
  after another.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..procs import PROJECT, release_gated
from ..programs.triton_programs.assemblers import most_at_once, timed_assemblers
from .cpu_busy import CpuSampler
from .suite.rows import row
from .triton_lanes import KCACHE, plain_env

SCENARIO = "triton {procs} tunes at once (16 configs each)"
PROGRAM = "stress.programs.triton_programs.tune"
COMMANDS = {"kcache": [sys.executable, "-m", "kcache", "run", "-m", PROGRAM], "triton": [sys.executable, "-m", PROGRAM]}


def tunes_at_once_rows(work: Path, env: dict[str, str], procs: int = 8, turns: int = 2) -> list[dict[str, Any]]:
    """`procs` processes each starting a 16-config tune of its own at once, kcache's and Triton's in turns;
    none without a GPU."""
    import torch

    if not torch.cuda.is_available():
        print("triton: tunes at once not measured: Triton's autotuner needs a GPU to benchmark", flush=True)
        return []
    phases: dict[str, list[float]] = {"kcache": [], "triton": []}
    at_once: dict[str, list[int]] = {"kcache": [], "triton": []}
    own_floors: list[tuple[float, float]] = []
    windows: list[tuple[float, float] | None] = []
    floors: list[dict[str, float]] = []
    for turn in range(turns):
        for name in ("kcache", "triton"):
            folder = work / f"tunes-{name}-{turn}"
            results, cpu = run_lane(folder, name, env, procs)
            phases[name].append(max(found["compiling_s"] for found in results))
            at_once[name].append(most_at_once(folder))
            if name == "kcache":
                own_floors.append(own_work_floor(folder / "compile-spans", cpu))
                windows.append(ramp_and_tail(folder / "compile-spans", cpu))
        floors.append(wide_floor(env))
    kcache, triton = statistics.median(phases["kcache"]), statistics.median(phases["triton"])
    cores = len(os.sched_getaffinity(0))
    wide, eight = (statistics.median(floor[part] for floor in floors) for part in ("wide_s", "eight_s"))
    own = statistics.median(floor for floor, _ in own_floors)
    spread = statistics.median(even for _, even in own_floors)
    scenario = SCENARIO.format(procs=procs)
    print(f"triton: {procs} different 16-config tunes at once, compile phases together, median of {turns}: kcache "
          f"{kcache:.3f} s, Triton {triton:.3f} s, {kcache / triton:.3f}x (goal: at most 0.55x); most assemblies at "
          f"once: kcache {max(at_once['kcache'])}, Triton {max(at_once['triton'])} (goal: at most {cores}, the usable "
          f"cores); kcache's own floor (each tune's first compile alone, then the lane's CPU time on every core): "
          f"{own:.3f} s, {own / triton:.3f}x (its CPU time on every core from the start: {spread:.3f} s, "
          f"{spread / triton:.3f}x); the machine's floor, plain Triton's 128 compiles from one queue in {cores} "
          f"processes against 8 processes one after another: {wide:.3f} s against {eight:.3f} s, {wide / eight:.3f}x; "
          f"per turn (kcache's lane, then Triton's): {turn_ratios(phases['kcache'], phases['triton'])}; kcache's "
          f"window per turn, s until 90% of the cores were busy / from the last such moment to its end: "
          f"{', '.join('-' if found is None else f'{found[0]:.2f}/{found[1]:.2f}' for found in windows)}", flush=True)
    return [row(scenario, "compile phases together median s", kcache, triton, "s", "triton in-process compiles"),
            row(scenario, "kcache's floor: first compiles alone, then its CPU time on every core, median s", own,
                triton, "s", "triton in-process compiles"),
            row(scenario, f"the floor: their 128 compiles, plain, {cores} processes from one queue, median s", wide,
                eight, "s", "plain, 8 processes, 16 compiles each"),
            row(scenario, f"most assemblies at once (usable cores: {cores})", max(at_once["kcache"]),
                max(at_once["triton"]), "runs", "triton in-process compiles")]


def run_lane(folder: Path, name: str, env: dict[str, str], procs: int,
             extra: dict[str, str] | None = None) -> tuple[list[dict[str, Any]], CpuSampler]:
    """One turn of a lane ("kcache" or "triton"): `procs` processes released at once, each starting a
    16-config tune of its own, with `extra` in their environment; their results (each checked correct)
    and the machine's CPU samples over them. Each process's compile spans land in
    `folder`/compile-spans."""
    (folder / "compile-spans").mkdir(parents=True)
    run_env = plain_env(env)
    run_env.update(KCACHE if name == "kcache" else {})
    run_env.update(timed_assemblers(folder), KCACHE_DIR=str(folder / "cache"), TRITON_CACHE_DIR=str(folder / "cache"),
                   KT_GATE="1", KT_SPANS_DIR=str(folder / "compile-spans"), **(extra or {}))
    processes = [subprocess.Popen(COMMANDS[name], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=str(PROJECT),
                                  env={**run_env, "KT_VARIANT": str(index)}) for index in range(procs)]
    with CpuSampler() as cpu:
        release_gated(processes)
        outputs = [process.communicate(timeout=900)[0] for process in processes]
    if any(process.returncode != 0 for process in processes):
        raise RuntimeError(f"stress.programs.triton_programs.tune ({name}, {procs} at once) failed")
    results = [json.loads(out.splitlines()[-1]) for out in outputs]
    if not all(found["correct"] for found in results):
        raise RuntimeError(f"stress.programs.triton_programs.tune ({name}, {procs} at once): a wrong result")
    return results, cpu


def turn_ratios(kcache: list[float], triton: list[float]) -> str:
    """Each turn's two lanes, run one after the other, as a ratio: how far the machine's speed moved
    between turns shows beside the ratio of the medians, which is the goal's reading."""
    return ", ".join(f"{mine:.2f}/{theirs:.2f} s {mine / theirs:.3f}x" for mine, theirs in zip(kcache, triton))


def own_work_floor(spans_folder: Path, cpu: CpuSampler) -> tuple[float, float]:
    """From a lane's compile spans (each process's, stress.programs.triton_programs.tune's KT_SPANS_DIR)
    and the machine's CPU time while it ran: (the floor, the lane's CPU time spread on every core).

    The floor: each process's first compile alone (the median of its time until a second compile
    starts), then whatever CPU time the window held beyond those first compiles, spread on every core."""
    spans, start, end = compile_window(spans_folder)
    busy = cpu.core_seconds(start, end)
    if busy is None:
        raise RuntimeError("the machine's CPU time was not sampled over the tunes (no /proc/stat?)")
    cores = len(os.sched_getaffinity(0))
    alone = statistics.median(sorted(s for s, _ in process)[1] - min(s for s, _ in process) for process in spans)
    return alone + max(0.0, busy - len(spans) * alone) / cores, busy / cores


def ramp_and_tail(spans_folder: Path, cpu: CpuSampler) -> tuple[float, float] | None:
    """Where a lane's window (its first compile's start to its last compile's end) left cores idle: the
    seconds until the machine first ran 90% of its cores busy, and from the last such moment to the end."""
    _, start, end = compile_window(spans_folder)
    return cpu.full_between(start, end, len(os.sched_getaffinity(0)))


def compile_window(spans_folder: Path) -> tuple[list[list[list[float]]], float, float]:
    """Each process's compile spans (stress.programs.triton_programs.tune's KT_SPANS_DIR), the first
    start and the last end."""
    spans = [json.loads(path.read_text())["spans"] for path in sorted(spans_folder.glob("*.json"))]
    if not spans or any(len(process) < 2 for process in spans):
        raise RuntimeError(f"{spans_folder}: a tune's process left fewer than 2 compile spans")
    return spans, min(s for process in spans for s, _ in process), max(e for process in spans for _, e in process)


def wide_floor(env: dict[str, str]) -> dict[str, float]:
    """The machine's floor under the tunes at once (stress.programs.triton_programs.wide_floor), no kcache."""
    run_env = plain_env(env)
    done = subprocess.run([sys.executable, "-m", "stress.programs.triton_programs.wide_floor",
                           str(len(os.sched_getaffinity(0)))], capture_output=True, text=True, cwd=str(PROJECT),
                          timeout=900, env=run_env)
    if done.returncode != 0:
        raise RuntimeError(f"stress.programs.triton_programs.wide_floor exited {done.returncode}: {done.stderr[-800:]}")
    found: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return found
