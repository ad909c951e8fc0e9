"""`python -m stress.bench --only triton`: Triton's kernels with kcache's cache manager beside Triton's
own (`FileCacheManager`), in one run, on the same kernels (stress.programs.triton_programs.compile; compiled for sm_90,
no GPU needed):
- hit: a fresh process, the kernel in the cache, times its `triton.compile` call (from the call
  until the kernel is usable, Triton's own key computation included, as the user waits for it);
  kcache and Triton take turns, `repeats` each. Goal: kcache's p50 at most Triton's plus 1 ms.
- herd: `procs` fresh processes miss one kernel at once (a start barrier after their imports);
  compiles counted by wrappers of Triton's assemblers (stress.programs.triton_programs.assemblers). Goal: 1
  compile, against Triton's one per process.
- cold (issue 56): a fresh process's compile of the kernel on empty caches, kcache's isolated
  (kcache.triton.isolation: the first turn's back half in a fork of the process, the later turns' in the
  compile service's workers) against Triton's in the process, taking turns, `repeats` each (at most 9:
  a fresh compile's time spreads by 10-20% on the GPU machine). Goal: kcache's median at most 1.05x Triton's.
- precompile (issue 57): Helion's default precompile, compile only (stress.programs.triton_programs.precompile):
  a caller compiles one config, then 8 forks of it compile a config each, at once; the time until the
  last is reaped, kcache's manager against Triton's, taking turns (at most 5 each). No goal of its own
  (Helion's first tune has one): what kcache costs in those forks.
- autotune (issue 56): the compile phase of a 16-config `@triton.autotune` matmul in a fresh
  process (stress.programs.triton_programs.tune: the first tune less the same tune with every config compiled),
  kcache's configs at once (their back halves in the compile service's workers) against Triton's one
  after another, taking turns, `repeats` each (at most 5: a fresh process's tune spreads by 10-20% on the
  GPU machine). Goal: at most 0.35x Triton's on a 16-core GPU machine. Without a GPU, a row of its own
  with no goal: the same tune under a driver that compiles for sm_90 and launches nothing
  (stress.programs.triton_programs.cpu_tune), the tune's time being its compiles'.
- tunes at once (issue 67, GPU only): stress.bench.triton_tunes.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..procs import PROJECT, release_gated
from ..programs.triton_programs.assemblers import assembler_runs, counting_assemblers
from ..programs.triton_programs.precompile import CONFIGS as PRECOMPILE_CONFIGS
from .suite.rows import row
from .suite.timing import percentile
from .triton_lanes import KCACHE, plain_env
from .triton_tunes import tunes_at_once_rows

KERNEL = "matmul"


def run_program(env: dict[str, str], gated: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "stress.programs.triton_programs.compile", KERNEL], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=str(PROJECT),
                            env={**env, "KT_TIMED": "1", "KT_GATE": "1" if gated else "0"})


def result(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate(timeout=600)
    if process.returncode != 0:
        raise RuntimeError(f"stress.programs.triton_programs.compile exited {process.returncode}")
    return json.loads(out.splitlines()[-1])


ROWS = ("hit", "cold", "precompile", "autotune", "tunes")  # `--triton-rows`: a part of them


def measure(work: Path, repeats: int, procs: int, env: dict[str, str], only: tuple[str, ...] = ROWS) -> list[dict[str, Any]]:
    work.mkdir(parents=True, exist_ok=True)
    base = {**env, **counting_assemblers(work)}
    caches = {"kcache": {**base, **KCACHE, "KCACHE_DIR": str(work / "kcache-root")},
              "triton": {**base, "TRITON_CACHE_DIR": str(work / "triton-cache")}}
    rows = hit_and_herd_rows(work, caches, repeats, procs) if "hit" in only else []
    rows += cold_rows(work, caches, min(repeats, 9)) if "cold" in only else []
    rows += precompile_rows(work, caches, min(repeats, 5)) if "precompile" in only else []
    rows += autotune_rows(work, env, min(repeats, 5)) if "autotune" in only else []
    return rows + (tunes_at_once_rows(work, env, turns=min(repeats, 5)) if "tunes" in only else [])


def hit_and_herd_rows(work: Path, caches: dict[str, dict[str, str]], repeats: int,
                      procs: int) -> list[dict[str, Any]]:
    """A fresh process's hit, kcache's and Triton's in turns; then a herd of `procs` on an empty cache."""
    for cache_env in caches.values():  # fill both caches
        result(run_program(cache_env))
    hits: dict[str, list[float]] = {"kcache": [], "triton": []}
    for _ in range(repeats):  # taking turns: a drift of the machine weighs on both
        for name, cache_env in caches.items():
            hits[name].append(result(run_program(cache_env))[f"{KERNEL}_seconds"] * 1000)
    rows = [row("triton hit (fresh process)", f"p{q} ms", percentile(hits["kcache"], q), percentile(hits["triton"], q),
                "ms", "triton FileCacheManager") for q in (50, 90)]
    rows[0].update(samples=hits["kcache"], baseline_samples=hits["triton"])  # in the order measured, in turns
    # The rows' p50 is a nearest-rank one (an even count of samples: the lower middle one); the medians
    # and the turns' differences are printed beside it, so that no reading is taken for another.
    nearest = percentile(hits["kcache"], 50) - percentile(hits["triton"], 50)
    difference = statistics.median(hits["kcache"]) - statistics.median(hits["triton"])
    paired = statistics.median(ours - theirs for ours, theirs in zip(hits["kcache"], hits["triton"]))
    print(f"triton: hit p50 (nearest rank, as in the rows) kcache - triton = {nearest:+.2f} ms (goal: at most +1 ms); "
          f"medians {difference:+.2f} ms; median of the turns' differences {paired:+.2f} ms", flush=True)
    for name, cache_env in caches.items():  # the herd, on empty caches
        herd_env = {**cache_env, "KCACHE_DIR": str(work / f"herd-{name}"), "TRITON_CACHE_DIR": str(work / f"herd-{name}")}
        before = assembler_runs(work)
        processes = [run_program(herd_env, gated=True) for _ in range(procs)]
        started = release_gated(processes)
        outputs = {result(process)[KERNEL] for process in processes}
        wall = time.perf_counter() - started
        if len(outputs) != 1:
            raise RuntimeError(f"triton herd ({name}): {len(outputs)} different cubins for one kernel")
        hits[f"herd-{name}"] = [float(assembler_runs(work) - before), wall]
    rows.append(row(f"triton herd ({procs} procs)", "compiles", hits["herd-kcache"][0], hits["herd-triton"][0],
                    "runs", "triton FileCacheManager"))
    rows.append(row(f"triton herd ({procs} procs)", "wall s", hits["herd-kcache"][1], hits["herd-triton"][1], "s",
                    "triton FileCacheManager"))
    return rows


def cold_rows(work: Path, caches: dict[str, dict[str, str]], repeats: int) -> list[dict[str, Any]]:
    """A fresh process's compile on empty caches: kcache's in a fork, Triton's in the process."""
    seconds: dict[str, list[float]] = {"kcache": [], "triton": []}
    for turn in range(repeats):
        for name, cache_env in caches.items():
            empty = str(work / f"cold-{name}-{turn}")
            seconds[name].append(result(run_program({**cache_env, "KCACHE_DIR": empty, "TRITON_CACHE_DIR": empty}))
                                 [f"{KERNEL}_seconds"])
    kcache, triton = statistics.median(seconds["kcache"]), statistics.median(seconds["triton"])
    print(f"triton: cold compile of {KERNEL}, median of {repeats}: kcache {kcache:.3f} s, Triton {triton:.3f} s, "
          f"{kcache / triton:.3f}x (goal: at most 1.05x)", flush=True)
    return [row("triton cold compile (fresh process)", "cold compile median s", kcache, triton, "s",
                "triton in-process compile")]


def precompile_rows(work: Path, caches: dict[str, dict[str, str]], repeats: int) -> list[dict[str, Any]]:
    """Helion's precompile, compile only (stress.programs.triton_programs.precompile): 8 forks of a caller that
    compiled once, each compiling a config at once, kcache's manager against Triton's, taking turns."""
    seconds: dict[str, list[float]] = {"kcache": [], "triton": []}
    for turn in range(repeats):
        for name, cache_env in caches.items():
            empty = str(work / f"precompile-{name}-{turn}")
            done = subprocess.run([sys.executable, "-m", "stress.programs.triton_programs.precompile"], capture_output=True,
                                  text=True, cwd=str(PROJECT), timeout=600,
                                  env={**cache_env, "KCACHE_DIR": empty, "TRITON_CACHE_DIR": empty})
            found = json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0 else {}
            if found.get("statuses") != [0] * len(PRECOMPILE_CONFIGS):
                raise RuntimeError(f"stress.programs.triton_programs.precompile ({name}) failed: {done.stderr[-800:]}")
            seconds[name].append(found["children_s"])
    kcache, triton = statistics.median(seconds["kcache"]), statistics.median(seconds["triton"])
    print(f"triton: 8 forks of the caller compiling at once (Helion's precompile), median of {repeats}: kcache "
          f"{kcache:.3f} s, Triton {triton:.3f} s, {kcache / triton:.3f}x", flush=True)
    return [row("triton precompile (8 forks of the caller, as Helion's)", "children median s", kcache, triton, "s",
                "triton in the same forks")]


def autotune_rows(work: Path, env: dict[str, str], turns: int = 3) -> list[dict[str, Any]]:
    """The compile phase of a 16-config tune on the GPU, kcache's and Triton's in turns; without a GPU,
    the same tune's compiles under a driver that launches nothing (`cpu_tune_rows`)."""
    import torch

    if not torch.cuda.is_available():
        return cpu_tune_rows(work, env, turns)
    kcache, triton = tune_medians(work, env, turns, "tune", "compile_phase_s")
    fronts = front_halves_s(work, env)
    print(f"triton: autotune compile phase (16 configs), median of {turns}: kcache {kcache:.3f} s, Triton "
          f"{triton:.3f} s, {kcache / triton:.3f}x (goal: at most 0.35x on 16 cores); the front halves alone, "
          f"one after another in the caller: {fronts:.3f} s, {fronts / triton:.3f}x", flush=True)
    return [row("triton autotune (16 configs, fresh process)", "autotune compile phase median s", kcache, triton,
                "s", "triton in-process compiles"),
            row("triton autotune (16 configs, fresh process)", "front halves in the caller s", fronts, triton,
                "s", "triton in-process compiles")]


def cpu_tune_rows(work: Path, env: dict[str, str], turns: int) -> list[dict[str, Any]]:
    """Without a GPU: the 16-config tune under a driver that compiles for sm_90 and launches nothing
    (stress.programs.triton_programs.cpu_tune), where the tune's time is its compiles'. No goal (the
    goal is the GPU's 16 cores'): it shows a change to the compile-ahead on any machine."""
    kcache, triton = tune_medians(work, env, turns, "cpu_tune", "tune_s")
    print(f"triton: no GPU: a 16-config tune's compiles under a driver that launches nothing, median of {turns}: "
          f"kcache {kcache:.3f} s, Triton {triton:.3f} s, {kcache / triton:.3f}x", flush=True)
    return [row("triton autotune (16 configs, fresh process, a driver that launches nothing)",
                "tune's compiles median s", kcache, triton, "s", "triton in-process compiles")]


def tune_medians(work: Path, env: dict[str, str], turns: int, program: str, field: str) -> tuple[float, float]:
    """The medians of `field` in the JSON of `stress.programs.triton_programs.<program>`, a fresh process
    each, kcache's and Triton's in turns, each on an empty root: (kcache's, Triton's)."""
    seen: dict[str, list[float]] = {"kcache": [], "triton": []}
    run_env = plain_env(env)
    for turn in range(turns):
        for name, extra in (("kcache", KCACHE), ("triton", {})):
            folder = work / f"{program}-{name}-{turn}"
            done = subprocess.run([sys.executable, "-m", f"stress.programs.triton_programs.{program}"],
                                  capture_output=True, text=True, cwd=str(PROJECT), timeout=900,
                                  env={**run_env, **extra, "KCACHE_DIR": str(folder), "TRITON_CACHE_DIR": str(folder)})
            if done.returncode != 0:
                raise RuntimeError(f"stress.programs.triton_programs.{program} ({name}) exited {done.returncode}: "
                                   f"{done.stderr[-800:]}")
            seen[name].append(json.loads(done.stdout.splitlines()[-1])[field])
    return statistics.median(seen["kcache"]), statistics.median(seen["triton"])


def front_halves_s(work: Path, env: dict[str, str]) -> float:
    """The CPU time of a tune's front halves (each config's kernel to Triton's IR, in the caller, as
    kcache.triton.isolation logs it): a floor under kcache's compile phase, since they share the GIL."""
    folder = work / "tune-fronts"
    run_env = plain_env(env)
    done = subprocess.run([sys.executable, "-m", "stress.programs.triton_programs.tune"], capture_output=True, text=True,
                          cwd=str(PROJECT), timeout=900, env={**run_env, **KCACHE, "KCACHE_LOG": "debug",
                                                               "KT_LOG_TIMES": "1", "KCACHE_DIR": str(folder),
                                                               "TRITON_CACHE_DIR": str(folder)})
    (work / "tune-fronts.log").write_text(done.stderr)  # each line's time: where a tune's compile phase goes
    if done.returncode != 0:
        raise RuntimeError(f"stress.programs.triton_programs.tune (front halves) exited {done.returncode}: {done.stderr[-800:]}")
    taken = re.findall(r"front half of Triton's .* took ([0-9.]+) ms of CPU", done.stderr)
    return sum(float(ms) for ms in taken) / 1000


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    return measure(work / "triton", options.repeats, options.procs, env, tuple(options.triton_rows or ROWS))
