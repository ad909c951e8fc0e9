"""`python -m tests.tune_jobs`: one process tuning a small kernel, for the tune-once tests.

The profiler stands in for the GPU with a latency drawn from this process's pid and the config: two
processes that both tuned would (almost always) pick differently, so one pick across processes
means one tune. `--hold`: the first timing prints "benchmarking" and blocks until a line arrives on
stdin (the test then kills this process, or lets it go on). Prints one line "result {json}".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from typing import Any

CONFIGS = [{"block": 128}, {"block": 256}, {"block": 512}]


def scale(block: int, n: int = 4096) -> Any:
    """B = 2 * A, `block` elements per CTA: each config a distinct kernel."""
    import tilelang.language as T

    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, block), threads=128) as bx:
            for i in T.Parallel(block):
                B[bx * block + i] = A[bx * block + i] * 2.0

    return main.with_attr("global_symbol", f"scale_{block}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.tune_jobs")
    parser.add_argument("--root", required=True)
    parser.add_argument("--hold", action="store_true", help="block in the first timing until stdin has a line")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--device", help="JSON device identity (default: this process's)")
    args = parser.parse_args(argv)

    import autotuner
    import kcache
    from stress.programs.kernels import CPU_TARGET

    draw = random.Random(os.getpid())
    latency = {str(c["block"]): draw.random() for c in CONFIGS}
    timed: list[str] = []

    def profiler(kernel: Any, inputs: Any) -> float:
        block = str(kernel.prim_func.attrs["global_symbol"]).rsplit("_", 1)[1]
        if args.hold and not timed:
            print("benchmarking", flush=True)
            sys.stdin.readline()
        timed.append(block)
        return latency[block]

    cache = kcache.KernelCache(args.root)
    result = autotuner.tune(scale, CONFIGS, inputs=[], target=CPU_TARGET, out_idx=[1], cache=cache,
                            profiler=profiler, verbose=False, force=args.force,
                            device=json.loads(args.device) if args.device else None)
    compiles = cache.stats()["compiles"]
    result.load_kernel(cache)  # the best kernel: a local hit where tuned, else from a node that tuned it
    print("result " + json.dumps({"config": result.config, "timed": len(timed), "pid": os.getpid(),
                                  "compiles": compiles, "after_load": cache.stats()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
