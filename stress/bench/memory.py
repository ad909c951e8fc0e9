"""The memory hit of `python -m stress.bench --only memory`: repeated calls in one process, on the same
PrimFunc object and on a structurally equal fresh one, kcache's against TileLang's. The calls are
timed in a child interpreter (`python -m stress.bench.memory ROOT`), apart from the bench's own state."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from ..procs import run_for_result, worker_report
from .suite.rows import row
from .suite.timing import percentile


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    us = run_for_result([sys.executable, "-m", "stress.bench.memory", str(work / "memory")], "memory-hit worker", env)
    return [
        row("memory hit", "same PrimFunc, p50", us["kcache_same_p50"], us["tilelang_same_p50"], "us"),
        row("memory hit", "same PrimFunc, p99", us["kcache_same_p99"], us["tilelang_same_p99"], "us"),
        row("memory hit", "equal PrimFunc, p50", us["kcache_equal_p50"], us["tilelang_equal_p50"], "us"),
        row("memory hit", "equal PrimFunc, p99", us["kcache_equal_p99"], us["tilelang_equal_p99"], "us"),
    ]


def child(work: Path, calls: int = 2000) -> None:
    os.environ["TILELANG_CACHE_DIR"] = str(work / "tilelang")
    import logging

    import tilelang

    import kcache

    from ..programs.kernels import CPU_TARGET, elementwise_add

    # TileLang logs a warning on every memory hit; keep it out of the timing.
    logging.getLogger("tilelang").setLevel(logging.ERROR)
    cache = kcache.KernelCache(work / "kcache")
    getters = {
        "kcache": lambda f: cache.get_or_compile(f, CPU_TARGET, out_idx=[2]),
        "tilelang": lambda f: tilelang.compile(f, out_idx=[2], target=CPU_TARGET, execution_backend="tvm_ffi"),
    }
    out: dict[str, float] = {}
    for name, get in getters.items():
        func = elementwise_add()
        get(func)
        for mode, funcs in (("same", [func] * calls), ("equal", [elementwise_add() for _ in range(calls // 4)])):
            samples = []
            for f in funcs:
                start = time.perf_counter()
                get(f)
                samples.append((time.perf_counter() - start) * 1e6)
            out[f"{name}_{mode}_p50"] = statistics.median(samples)
            out[f"{name}_{mode}_p99"] = percentile(samples, 99)
    worker_report(out)


if __name__ == "__main__":
    child(Path(sys.argv[1]))
