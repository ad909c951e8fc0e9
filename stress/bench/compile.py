"""The compile-isolation benchmark of `python -m stress.bench` (run in its own interpreter).

- sequential: the same distinct kernels compiled one after another through
  `get_or_compile`, in-process and through an already started pool (fresh
  cache roots, so every call compiles). The pool's start-up is measured on
  its own.
- parallel: all configs at once through the pool (one thread per config
  calling `get_or_compile`), against the same configs compiled one after
  another in-process.

Prints one line "result {json}" for the parent bench.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..procs import run_for_result, worker_report
from .suite.rows import row

# Matmul configs: sizes and tiles, every one a distinct kernel.
VERBOSE = bool(os.environ.get("KCACHE_BENCH_VERBOSE"))
CONFIGS = [(size, bm, bn, bk) for size in (512, 1024) for bm in (64, 128) for bn in (64, 128) for bk in (32, 64)]


def measure(sequential: int, parallel: int, workers: int | None) -> dict[str, Any]:
    import tilelang  # noqa: F401 - before kcache opens, as in any TileLang program

    import kcache
    from kcache.config import Settings

    from ..programs.kernels import CPU_TARGET, matmul

    work = Path(tempfile.mkdtemp(prefix="kcache-bench-compile-"))
    if max(sequential, parallel) > len(CONFIGS):
        raise SystemExit(f"stress.bench.compile: at most {len(CONFIGS)} distinct configs")
    configs = CONFIGS[:max(sequential, parallel)]

    def cache(name: str, isolation: str, pool: Any = None) -> kcache.KernelCache:
        settings = dataclasses.replace(Settings.from_env(work / name), compile_isolation=isolation)
        return kcache.KernelCache(work / name, settings=settings, compile_pool=pool)

    def compile_one(target_cache: kcache.KernelCache, config: tuple[int, ...]) -> float:
        size, bm, bn, bk = config
        start = time.perf_counter()
        target_cache.get_or_compile(matmul(size, size, size, bm, bn, bk), CPU_TARGET, out_idx=[2])
        seconds = time.perf_counter() - start
        if VERBOSE:
            print(target_cache.settings.compile_isolation, config, round(seconds, 3), file=sys.stderr, flush=True)
        return seconds

    pool = kcache.CompilePool(workers)
    started = time.perf_counter()
    pool.warm()
    startup = time.perf_counter() - started
    inprocess = cache("inprocess", "inprocess")
    pooled = cache("pool", "pool", pool)
    # Warm both paths once (first-use imports, nvcc's first run) on a config not measured,
    # then interleave them, so that drift in the machine's speed hits both alike.
    warmup = (256, 64, 64, 32)
    compile_one(inprocess, warmup)
    compile_one(pooled, warmup)
    in_process_each, pool_each = [], []
    for config in configs[:sequential]:
        in_process_each.append(compile_one(inprocess, config))
        pool_each.append(compile_one(pooled, config))
    in_process_each += [compile_one(inprocess, c) for c in configs[sequential:parallel]]

    parallel_cache = cache("parallel", "pool", pool)
    started = time.perf_counter()
    with ThreadPoolExecutor(parallel) as threads:
        list(threads.map(lambda c: compile_one(parallel_cache, c), configs[:parallel]))
    parallel_wall = time.perf_counter() - started
    pool.close()
    return {
        "workers": pool.max_workers,
        "pool_startup_s": startup,
        "sequential_kernels": sequential,
        "sequential_pool_s": sum(pool_each),
        "sequential_inprocess_s": sum(in_process_each[:sequential]),
        "sequential_pool_each_s": pool_each,
        "sequential_inprocess_each_s": in_process_each[:sequential],
        "parallel_configs": parallel,
        "parallel_pool_wall_s": parallel_wall,
        "parallel_inprocess_sequential_s": sum(in_process_each[:parallel]),
    }


def main(argv: list[str]) -> int:
    sequential, parallel = int(argv[0]), int(argv[1])
    workers = int(argv[2]) if len(argv) > 2 and argv[2] != "auto" else None
    worker_report(measure(sequential, parallel, workers))
    return 0


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """Run in an interpreter of its own (`python -m stress.bench.compile`), so that the pool starts cold."""
    sequential, parallel = options.sequential, options.parallel
    r = run_for_result([sys.executable, "-m", "stress.bench.compile", str(sequential), str(parallel),
                        options.compile_workers], "compile bench", env)
    scenario = f"compile ({r['workers']} workers)"
    return [
        row(scenario, f"pool start-up, {r['workers']} workers", r["pool_startup_s"], None, "s"),
        row(scenario, f"{sequential} sequential compiles", r["sequential_pool_s"], r["sequential_inprocess_s"], "s",
            baseline="in-process"),
        row(scenario, f"{parallel} configs: parallel (pool) vs sequential", r["parallel_pool_wall_s"],
            r["parallel_inprocess_sequential_s"], "s", baseline="in-process"),
    ]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
