"""`python -m stress.bench --only triton`: Triton's kernels with kcache's cache manager beside Triton's
own (`FileCacheManager`), in one run, on the same kernels (the programs of stress/programs/triton_programs:
`compile` for sm_90, no GPU needed, unless the row says GPU only):
- hit: a fresh process, the kernel in the cache, times its `triton.compile` call (from the call
  until the kernel is usable, Triton's own key computation included, as the user waits for it);
  kcache and Triton take turns, `repeats` each. Goal: kcache's p50 at most Triton's plus 1 ms.
- herd: `procs` fresh processes miss one kernel at once (a start barrier after their imports);
  compiles counted by wrappers of Triton's assemblers (`assemblers`). Goal: 1 compile, against
  Triton's one per process.
- cold (issue 56): a fresh process's compile of the kernel on empty caches, kcache's in a fork of the
  process (kcache.triton.isolation) against Triton's in the process, taking turns, `repeats` each
  (at most 5). Goal: kcache's median at most 1.05x Triton's.
- precompile (issue 57): Helion's default precompile, compile only (`precompile`): a caller compiles
  one config, then 8 forks of it compile a config each, at once; the time until the last is reaped,
  kcache's manager against Triton's, taking turns (at most 5 each). No goal of its own (Helion's first
  tune has one): what kcache costs in those forks.
- autotune (issue 56, GPU only): the compile phase of a 16-config `@triton.autotune` matmul in a fresh
  process (`tune`: the first tune less the same tune with every config compiled), kcache's configs at
  once (their back halves in the compile service's workers) against Triton's one after another, 3
  turns. Goal: at most 0.35x Triton's on a 16-core GPU machine.
- tunes at once (issue 67, GPU only): 8 fresh processes, one machine's cache, each starting a different
  16-config tune at the same moment (`tune`, KT_VARIANT: each its own register cap, so no two share a
  key); the compile phases together: the longest of the processes' times spent compiling (within
  Triton's `compile` calls, as its compilation listener reports them, overlapping calls counted once:
  plain Triton's one after another between its benchmarks, kcache's at once ahead of them); and the
  most assemblies (ptxas) that ran at once. Goals: at most 0.55x plain Triton's (0.5x is the limit:
  plain Triton keeps 8 cores busy, kcache 16), with at most as many compiles at once as the machine
  has usable cores.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..procs import PROJECT, release_gated, worker_env
from ..programs.triton_programs.assemblers import assembler_runs, counting_assemblers, most_at_once, timed_assemblers
from ..programs.triton_programs.precompile import CONFIGS as PRECOMPILE_CONFIGS
from .suite.rows import row
from .suite.timing import percentile, take_turns

KCACHE = {"TRITON_CACHE_MANAGER": "kcache.triton:CacheManager"}
KERNEL = "matmul"
ROWS = ("hit", "cold", "precompile", "autotune", "tunes")  # `--triton-rows`: a part of them


def start(program: str, env: dict[str, str], *args: str, gated: bool = False,
          stderr: int = subprocess.DEVNULL) -> subprocess.Popen[str]:
    """A fresh `python -m stress.programs.triton_programs.PROGRAM ARGS` in exactly `env`; `gated`: it waits
    at its gate (release_gated). Its stderr is dropped unless asked for (a herd's would fill pipes that
    nobody reads until the end)."""
    return subprocess.Popen([sys.executable, "-m", f"stress.programs.triton_programs.{program}", *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=str(PROJECT),
                            env={**env, "KT_GATE": "1" if gated else "0"})


def finish(process: subprocess.Popen[str], what: str, timeout: float = 900) -> tuple[dict[str, Any], str]:
    """A program's reading (the JSON object it prints last) and its stderr ("" where dropped); a program
    that failed raises, naming `what`."""
    out, err = process.communicate(timeout=timeout)
    if process.returncode != 0:
        raise RuntimeError(f"stress.programs.triton_programs.{what} exited {process.returncode}: {(err or '')[-800:]}")
    return json.loads(out.splitlines()[-1]), err or ""


def compiled(env: dict[str, str], gated: bool = False) -> subprocess.Popen[str]:
    """The compile program of KERNEL, timed."""
    return start("compile", {**env, "KT_TIMED": "1"}, KERNEL, gated=gated)


def tune_env(env: dict[str, str], folder: Path, kcache: bool, **extra: str) -> dict[str, str]:
    """A tune program's environment: this one, its caches in `folder`, with kcache's manager or none."""
    plain = {key: value for key, value in worker_env(env).items() if key != "TRITON_CACHE_MANAGER"}
    return {**plain, **(KCACHE if kcache else {}), "KCACHE_DIR": str(folder), "TRITON_CACHE_DIR": str(folder), **extra}


def measure(work: Path, repeats: int, procs: int, env: dict[str, str],
            only: tuple[str, ...] = ROWS) -> list[dict[str, Any]]:
    work.mkdir(parents=True, exist_ok=True)
    base = {**env, **counting_assemblers(work)}
    caches = {"kcache": {**base, **KCACHE, "KCACHE_DIR": str(work / "kcache-root")},
              "triton": {**base, "TRITON_CACHE_DIR": str(work / "triton-cache")}}
    rows = hit_and_herd_rows(work, caches, repeats, procs) if "hit" in only else []
    rows += cold_rows(work, caches, min(repeats, 5)) if "cold" in only else []
    rows += precompile_rows(work, caches, min(repeats, 5)) if "precompile" in only else []
    rows += autotune_rows(work, env) if "autotune" in only else []
    return rows + (tunes_at_once_rows(work, env) if "tunes" in only else [])


def hit_and_herd_rows(work: Path, caches: dict[str, dict[str, str]], repeats: int,
                      procs: int) -> list[dict[str, Any]]:
    """A fresh process's hit, kcache's and Triton's in turns; then a herd of `procs` on an empty cache."""
    for cache_env in caches.values():  # fill both caches
        finish(compiled(cache_env), "compile", 600)
    hits = take_turns(list(caches), repeats,
                      lambda name, _turn: finish(compiled(caches[name]), "compile", 600)[0][f"{KERNEL}_seconds"] * 1000)
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
    herds: dict[str, tuple[int, float]] = {}
    for name, cache_env in caches.items():  # the herd, on empty caches
        empty = str(work / f"herd-{name}")
        herd_env = {**cache_env, "KCACHE_DIR": empty, "TRITON_CACHE_DIR": empty}
        before = assembler_runs(work)
        processes = [compiled(herd_env, gated=True) for _ in range(procs)]
        released = release_gated(processes)
        outputs = {finish(process, "compile", 600)[0][KERNEL] for process in processes}
        wall = time.perf_counter() - released
        if len(outputs) != 1:
            raise RuntimeError(f"triton herd ({name}): {len(outputs)} different cubins for one kernel")
        herds[name] = (assembler_runs(work) - before, wall)
    return rows + [row(f"triton herd ({procs} procs)", "compiles", herds["kcache"][0], herds["triton"][0], "runs",
                       "triton FileCacheManager"),
                   row(f"triton herd ({procs} procs)", "wall s", herds["kcache"][1], herds["triton"][1], "s",
                       "triton FileCacheManager")]


def cold_rows(work: Path, caches: dict[str, dict[str, str]], repeats: int) -> list[dict[str, Any]]:
    """A fresh process's compile on empty caches: kcache's in a fork, Triton's in the process."""

    def seconds(name: str, turn: int) -> float:
        empty = str(work / f"cold-{name}-{turn}")
        return finish(compiled({**caches[name], "KCACHE_DIR": empty, "TRITON_CACHE_DIR": empty}), "compile",
                      600)[0][f"{KERNEL}_seconds"]

    medians = {name: statistics.median(found) for name, found in take_turns(list(caches), repeats, seconds).items()}
    kcache, triton = medians["kcache"], medians["triton"]
    print(f"triton: cold compile of {KERNEL}, median of {repeats}: kcache {kcache:.3f} s, Triton {triton:.3f} s, "
          f"{kcache / triton:.3f}x (goal: at most 1.05x)", flush=True)
    return [row("triton cold compile (fresh process)", "cold compile median s", kcache, triton, "s",
                "triton in-process compile")]


def precompile_rows(work: Path, caches: dict[str, dict[str, str]], repeats: int) -> list[dict[str, Any]]:
    """Helion's precompile, compile only (stress.programs.triton_programs.precompile): 8 forks of a caller that
    compiled once, each compiling a config at once, kcache's manager against Triton's, taking turns."""

    def seconds(name: str, turn: int) -> float:
        empty = str(work / f"precompile-{name}-{turn}")
        found, _ = finish(start("precompile", {**caches[name], "KCACHE_DIR": empty, "TRITON_CACHE_DIR": empty},
                                stderr=subprocess.PIPE), f"precompile ({name})", 600)
        if found.get("statuses") != [0] * len(PRECOMPILE_CONFIGS):
            raise RuntimeError(f"stress.programs.triton_programs.precompile ({name}): a fork failed: {found}")
        return found["children_s"]

    medians = {name: statistics.median(found) for name, found in take_turns(list(caches), repeats, seconds).items()}
    kcache, triton = medians["kcache"], medians["triton"]
    print(f"triton: 8 forks of the caller compiling at once (Helion's precompile), median of {repeats}: kcache "
          f"{kcache:.3f} s, Triton {triton:.3f} s, {kcache / triton:.3f}x", flush=True)
    return [row("triton precompile (8 forks of the caller, as Helion's)", "children median s", kcache, triton, "s",
                "triton in the same forks")]


def gpu_missing_for(what: str) -> bool:
    """Whether no GPU is visible, saying that `what` is not measured then (Triton's autotuner benchmarks on one)."""
    import torch

    if torch.cuda.is_available():
        return False
    print(f"triton: {what} not measured: Triton's autotuner needs a GPU to benchmark", flush=True)
    return True


def autotune_rows(work: Path, env: dict[str, str], turns: int = 3) -> list[dict[str, Any]]:
    """The compile phase of a 16-config tune on the GPU, kcache's and Triton's in turns (none without a GPU)."""
    if gpu_missing_for("autotune compile phase"):
        return []

    def phase(name: str, turn: int) -> float:
        process = start("tune", tune_env(env, work / f"tune-{name}-{turn}", name == "kcache"), stderr=subprocess.PIPE)
        return finish(process, f"tune ({name})")[0]["compile_phase_s"]

    medians = {name: statistics.median(found) for name, found in take_turns(("kcache", "triton"), turns, phase).items()}
    kcache, triton = medians["kcache"], medians["triton"]
    fronts = front_halves_s(work, env)
    print(f"triton: autotune compile phase (16 configs), median of {turns}: kcache {kcache:.3f} s, Triton "
          f"{triton:.3f} s, {kcache / triton:.3f}x (goal: at most 0.35x on 16 cores); the front halves alone, "
          f"one after another in the caller: {fronts:.3f} s, {fronts / triton:.3f}x", flush=True)
    return [row("triton autotune (16 configs, fresh process)", "autotune compile phase median s", kcache, triton,
                "s", "triton in-process compiles"),
            row("triton autotune (16 configs, fresh process)", "front halves in the caller s", fronts, triton,
                "s", "triton in-process compiles")]


def front_halves_s(work: Path, env: dict[str, str]) -> float:
    """The CPU time of a tune's front halves (each config's kernel to Triton's IR, in the caller, as
    kcache.triton.isolation logs it): a floor under kcache's compile phase, since they share the GIL."""
    process = start("tune", tune_env(env, work / "tune-fronts", True, KCACHE_LOG="debug", KT_LOG_TIMES="1"),
                    stderr=subprocess.PIPE)
    out, err = process.communicate(timeout=900)
    (work / "tune-fronts.log").write_text(err)  # each line's time: where a tune's compile phase goes
    if process.returncode != 0:
        raise RuntimeError(f"stress.programs.triton_programs.tune (front halves) exited {process.returncode}: "
                           f"{err[-800:]}")
    taken = re.findall(r"front half of Triton's .* took ([0-9.]+) ms of CPU", err)
    return sum(float(ms) for ms in taken) / 1000


def tunes_at_once_rows(work: Path, env: dict[str, str], procs: int = 8, turns: int = 2) -> list[dict[str, Any]]:
    """`procs` processes each starting a 16-config tune of its own at once, kcache's and Triton's in turns;
    none without a GPU."""
    if gpu_missing_for("tunes at once"):
        return []
    at_once: dict[str, list[int]] = {"kcache": [], "triton": []}

    def compile_phases(name: str, turn: int) -> float:
        """The longest of the processes' times in Triton's compile; the most assemblies at once, noted."""
        folder = work / f"tunes-{name}-{turn}"
        folder.mkdir(parents=True)
        run_env = tune_env(env, folder / "cache", name == "kcache", **timed_assemblers(folder))
        processes = [start("tune", {**run_env, "KT_VARIANT": str(index)}, gated=True) for index in range(procs)]
        release_gated(processes)
        results = [finish(process, f"tune ({name}, {procs} at once)")[0] for process in processes]
        if not all(found["correct"] for found in results):
            raise RuntimeError(f"stress.programs.triton_programs.tune ({name}, {procs} at once): a wrong result")
        at_once[name].append(most_at_once(folder))
        return max(found["compiling_s"] for found in results)

    phases = take_turns(("kcache", "triton"), turns, compile_phases)
    kcache, triton = statistics.median(phases["kcache"]), statistics.median(phases["triton"])
    cores = len(os.sched_getaffinity(0))
    print(f"triton: {procs} different 16-config tunes at once, compile phases together, median of {turns}: kcache "
          f"{kcache:.3f} s, Triton {triton:.3f} s, {kcache / triton:.3f}x (goal: at most 0.55x); most assemblies at "
          f"once: kcache {max(at_once['kcache'])}, Triton {max(at_once['triton'])} (goal: at most {cores}, the usable "
          f"cores)", flush=True)
    return [row(f"triton {procs} tunes at once (16 configs each)", "compile phases together median s", kcache, triton,
                "s", "triton in-process compiles"),
            row(f"triton {procs} tunes at once (16 configs each)", f"most assemblies at once (usable cores: {cores})",
                max(at_once["kcache"]), max(at_once["triton"]), "runs", "triton in-process compiles")]


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    return measure(work / "triton", options.repeats, options.procs, env, tuple(options.triton_rows or ROWS))
