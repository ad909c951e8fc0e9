"""One process of `python -m stress.bench.standalone.tune_once`: imports, waits at the barrier, tunes the 16-config
matmul through `autotuner.tune` on its root, and reports its pick, whether it benchmarked, and when it
finished. Run by the bench, never by hand."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from stress.procs import worker_handshake, worker_report


def counted_profiler() -> tuple[Callable[[Any, Any], float], list[Any]]:
    """autotuner's CUDA-event profiler, and the kernels it has timed: a process that benchmarked timed some."""
    import autotuner

    measure = autotuner.cuda_event_profiler()
    timed: list[Any] = []

    def profiler(kernel: Any, inputs: Any) -> float:
        timed.append(kernel)
        return measure(kernel, inputs)

    return profiler, timed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stress.bench.jobs.tune_worker")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--root", required=True)
    args = parser.parse_args(argv)

    import tilelang  # noqa: F401 - what a rank has imported before it tunes
    import torch

    import autotuner
    import kcache
    from stress.gpu import gpu_target
    from stress.programs.tune_kernels import CONFIGS, N, matmul

    a, b = (torch.randn(N, N, device="cuda", dtype=torch.float16) for _ in range(2))
    a @ b  # the CUDA context and cuBLAS start before the barrier, as in a rank that already ran
    torch.cuda.synchronize()
    cache = kcache.KernelCache(args.root)
    profiler, timed = counted_profiler()
    worker_handshake()
    result = autotuner.tune(matmul, CONFIGS, inputs=[a, b], ref_prog=lambda x, y: x @ y, target=gpu_target(),
                            out_idx=[2], cache=cache, profiler=profiler, verbose=False)
    kernel = result.load_kernel(cache)
    torch.cuda.synchronize()
    done = time.monotonic()
    ok = bool(torch.allclose(kernel(a, b).float(), (a @ b).float(), rtol=1e-2, atol=1e-2))
    worker_report({"index": args.index, "pid": os.getpid(), "config": result.config, "benchmarked": len(timed),
                   "done": done, "correct": ok, "stats": cache.stats()})


if __name__ == "__main__":
    main()
