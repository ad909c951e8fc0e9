"""`python -m stress.bench --only triton`: Triton's kernels with kcache's cache manager beside Triton's
own (`FileCacheManager`), in one run, on the same kernels (stress.triton_program; compiled for sm_90,
no GPU needed):
- hit: a fresh process, the kernel in the cache, times its `triton.compile` call (from the call
  until the kernel is usable, Triton's own key computation included, as the user waits for it);
  kcache and Triton take turns, `repeats` each. Goal: kcache's p50 at most Triton's plus 1 ms.
- herd: `procs` fresh processes miss one kernel at once (a start barrier after their imports);
  compiles counted by wrappers of Triton's assemblers (stress.triton_program). Goal: 1 compile, against Triton's one per
  process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .rows import percentile, row
from ..procs import PROJECT
from ..triton_program import assembler_runs, counting_assemblers

KCACHE = {"TRITON_CACHE_MANAGER": "kcache.triton:CacheManager"}
KERNEL = "matmul"


def run_program(env: dict[str, str], gated: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "stress.triton_program", KERNEL], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=str(PROJECT),
                            env={**env, "KT_TIMED": "1", "KT_GATE": "1" if gated else "0"})


def result(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate(timeout=600)
    if process.returncode != 0:
        raise RuntimeError(f"stress.triton_program exited {process.returncode}")
    return json.loads(out.splitlines()[-1])


def measure(work: Path, repeats: int, procs: int, env: dict[str, str]) -> list[dict[str, Any]]:
    work.mkdir(parents=True, exist_ok=True)
    base = {**env, **counting_assemblers(work)}
    caches = {"kcache": {**base, **KCACHE, "KCACHE_DIR": str(work / "kcache-root")},
              "triton": {**base, "TRITON_CACHE_DIR": str(work / "triton-cache")}}
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
        for process in processes:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        started = time.perf_counter()
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
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


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    return measure(work / "triton", options.repeats, options.procs, env)
