"""The machine's floor under "8 tunes at once": the same compiles with no kcache and no tune, plain
Triton only (for sm_90, no GPU needed). The 8 tunes' 128 configs (stress.programs.triton_programs.tune's
16 configs in 8 variants of `maxnreg`) compiled by 8 processes, 16 each one after another (what plain
Triton's tunes do), against a pool of WIDE processes taking the 128 from one queue (what kcache's
workers at their best could do). Both pools fork from this process past its first compile (as kcache's
template is), and each compile has an empty cache directory of its own.

    python -m stress.programs.triton_programs.wide_floor WIDE

Prints one JSON object: `eight_s` and `wide_s`, each from the first compile until the last ends.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import tempfile
import time

import triton
from triton.compiler import ASTSource

from stress.programs.triton_programs.compile import KERNELS, MATMUL_CONFIGS, TARGET

TUNES = 8


def compile_config(job: tuple[int, int]) -> None:
    variant, index = job
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="kcache-wide-floor-")
    bm, bn, bk, warps, stages = MATMUL_CONFIGS[index]
    fn, signature, _ = KERNELS["matmul"]
    triton.compile(ASTSource(fn, signature, {"BM": bm, "BN": bn, "BK": bk}), target=TARGET,
                   options={"num_warps": warps, "num_stages": stages, "maxnreg": 232 - 8 * variant})


def one_tune(variant: int) -> None:
    for index in range(len(MATMUL_CONFIGS)):
        compile_config((variant, index))


def timed(processes: int, work: object, jobs: list) -> float:
    """The wall time of `jobs` through a pool of `processes`."""
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        started = time.perf_counter()
        pool.map(work, jobs, chunksize=1)
        return time.perf_counter() - started


def main() -> None:
    wide = int(sys.argv[1])
    compile_config((TUNES, 0))  # a key no timed job has: Triton's first-compile initialization, once
    eight = timed(TUNES, one_tune, list(range(TUNES)))
    every = [(variant, index) for variant in range(TUNES) for index in range(len(MATMUL_CONFIGS))]
    print(json.dumps({"eight_s": eight, "wide_s": timed(wide, compile_config, every)}), flush=True)


if __name__ == "__main__":
    main()
