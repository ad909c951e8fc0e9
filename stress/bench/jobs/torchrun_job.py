"""One rank of `python -m stress.bench.standalone.multigpu` (issue 40), started by torchrun: a training job's start.

It initializes NCCL on its own GPU (LOCAL_RANK), tunes the 16-config matmul and compiles the kernel
pool, runs each kernel on its GPU against torch, and all-reduces a checksum of the outputs, which must
be equal on every GPU. `--mode kcache`: `kcache.install()` and `autotuner.tune` on the default cache;
`--mode tilelang`: plain TileLang, its own AutoTuner, each rank for itself (the baseline). Writes
`<out>/rank<R>.json`. Run by the bench under torchrun, never by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

STARTED = time.monotonic()  # what the user waits for runs from the rank's start


def _tune_with_kcache(a: Any, b: Any, target: dict) -> tuple[dict, Any, int]:
    import autotuner
    import kcache
    from stress.programs.tune_kernels import CONFIGS, matmul

    from .tune_worker import counted_profiler

    kcache.install()
    profiler, timed = counted_profiler()
    result = autotuner.tune(matmul, CONFIGS, inputs=[a, b], ref_prog=lambda x, y: x @ y, target=target,
                            out_idx=[2], profiler=profiler, verbose=False)
    return result.config, result.load_kernel(), len(timed)


def _tune_with_tilelang(a: Any, b: Any, target: dict) -> tuple[dict, Any, int]:
    from tilelang.autotuner.tuner import AutoTuner

    from stress.programs.tune_kernels import CONFIGS, matmul

    tuner = AutoTuner.from_kernel(kernel=matmul, configs=CONFIGS).set_compile_args(out_idx=[2], target=target)
    tuner.set_profile_args(ref_prog=lambda x, y: x @ y, supply_prog=lambda _params: [a, b])
    result = tuner.run()
    return dict(result.config), result.kernel, len(CONFIGS)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stress.bench.jobs.torchrun_job")
    parser.add_argument("--mode", choices=("kcache", "tilelang"), required=True)
    parser.add_argument("--kernels", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    import tilelang
    import torch
    import torch.distributed as dist

    from stress.gpu import gpu_target
    from stress.programs.kernels import pool
    from stress.programs.tune_kernels import N

    local_rank, rank = int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    target = gpu_target()
    generator = torch.Generator(device="cuda").manual_seed(0)  # the same inputs on every rank
    a, b = (torch.randn(N, N, device="cuda", dtype=torch.float16, generator=generator) for _ in range(2))
    tune_started = time.monotonic()
    tune = _tune_with_kcache if args.mode == "kcache" else _tune_with_tilelang
    config, tuned, benchmarked = tune(a, b, target)
    tune_s = time.monotonic() - tune_started
    compile_started = time.monotonic()
    specs = pool(args.kernels)
    kernels = [tilelang.compile(spec.build(), out_idx=spec.out_idx, target=target) for spec in specs]
    torch.cuda.synchronize()
    ready_s = time.monotonic() - STARTED
    compile_s = time.monotonic() - compile_started

    device = torch.device("cuda", local_rank)
    correct, checksum = [], torch.zeros((), dtype=torch.float64, device=device)
    product = tuned(a, b)
    correct.append(bool(torch.allclose(product.float(), (a @ b).float(), rtol=1e-2, atol=1e-2)))
    checksum += product.double().sum()
    for spec, kernel in zip(specs, kernels):
        torch.manual_seed(1)
        inputs = spec.make_inputs(device)
        output = kernel(*inputs)
        expected = spec.reference(*inputs)
        correct.append(bool(torch.allclose(output.float(), expected.float(), rtol=spec.tolerance,
                                           atol=spec.tolerance)))
        checksum += output.double().sum()
    low, high = checksum.clone(), checksum.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    Path(args.out, f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "local_rank": local_rank, "pid": os.getpid(), "device": torch.cuda.get_device_name(device),
        "config": config, "benchmarked": benchmarked, "tune_s": tune_s, "compile_s": compile_s,
        "ready_s": ready_s, "correct": all(correct), "checksum": checksum.item(),
        "checksums_equal_across_ranks": bool(low.item() == high.item()),
    }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
