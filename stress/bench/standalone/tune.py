"""`python -m stress.bench.standalone.tune`: one matmul tuned over 16 configs by kcache's tuner and by TileLang's
AutoTuner, in the same run, on the GPU (the autotuner issue's goal: kcache no slower, while isolated).

Both start cold: kcache on an empty root (its compile workers not yet started), TileLang with its
cache off. Each is timed from the call to the returned result, with the same warmup and rep. kcache
runs first, so anything the first run warms (the page cache, nvcc's files) favours TileLang.
Prints one line "result {json}" (`--rows FILE` writes both kcache tunes against TileLang's as the bench's
rows); with no GPU visible, one line saying why, and exits 0. SIGINT or
SIGTERM: one line naming the tunes that finished, exit status 130 or 143, nothing left running.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kcache.interruption import Interrupted, ignore_further_signals
from stress.command_scope import command_scope

from ..suite.own_run import own_parser, skipped, write_rows
from ..suite.rows import row


def bench_rows(out: dict[str, Any]) -> list[dict[str, Any]]:
    """The cold tune and the tune with kcache's workers started, each against TileLang's AutoTuner."""
    configs = out["configs"]
    return [row("tune", f"cold tune of {configs} configs", out["kcache_s"], out["tilelang_s"], "s",
                "TileLang's AutoTuner"),
            row("tune", f"tune of {configs} configs, pool workers started", out["kcache_warm_pool_s"],
                out["tilelang_s"], "s", "TileLang's AutoTuner")]


def main(argv: list[str] | None = None) -> int:
    rows: Path | None = own_parser("tune").parse_args(argv).rows
    from stress.gpu import gpu_missing

    if skipped("tune", gpu_missing()):
        return 0
    work = tempfile.mkdtemp(prefix="kcache-bench-tune-")
    out: dict[str, object] = {}
    try:
        # The tunes' compile services in a runtime directory of the bench's own, stopped at its end with
        # everything else it started, however it ends (stress.command_scope).
        with command_scope():
            tune_both(work, out)
    except Interrupted as stop:
        ignore_further_signals()
        finished = [name for name in ("kcache", "kcache_warm_pool", "tilelang") if f"{name}_s" in out]
        print(f"stress.bench.standalone.tune: interrupted by {stop.name}: tunes finished: {', '.join(finished) or 'none'}; "
              f"their roots in {work} removed", file=sys.stderr)
        return stop.exit_status
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("result " + json.dumps(out, default=str), flush=True)
    write_rows(rows, bench_rows(out))
    return 0


def tune_both(work: str, out: dict[str, object]) -> None:
    """kcache's tune (cold, then again with its workers started) and TileLang's, into `out`."""
    os.environ["TILELANG_CACHE_DIR"] = os.path.join(work, "tilelang")
    import tilelang
    import torch

    import autotuner
    import kcache
    from stress.gpu import gpu_target
    from stress.programs.tune_kernels import CONFIGS, matmul

    target = gpu_target()
    a, b = (torch.randn(1024, 1024, device="cuda", dtype=torch.float16) for _ in range(2))
    out.update(configs=len(CONFIGS), device=torch.cuda.get_device_name())
    a @ b  # the CUDA context and cuBLAS start here, timed for neither tuner
    torch.cuda.synchronize()

    start = time.perf_counter()
    result = autotuner.tune(matmul, CONFIGS, inputs=[a, b], ref_prog=lambda x, y: x @ y, target=target,
                            out_idx=[2], cache=kcache.KernelCache(os.path.join(work, "kcache")), verbose=False)
    out["kcache_s"] = time.perf_counter() - start
    out["kcache_phases_s"] = result.metadata["seconds"]
    out["kcache_best"] = result.config
    out["kcache_latency_ms"] = result.latency
    # The same tune into another empty root, its compile workers already started: what the
    # workers' start cost the cold tune above.
    start = time.perf_counter()
    warm = autotuner.tune(matmul, CONFIGS, inputs=[a, b], ref_prog=lambda x, y: x @ y, target=target,
                          out_idx=[2], cache=kcache.KernelCache(os.path.join(work, "kcache-warm")), verbose=False)
    out["kcache_warm_pool_s"] = time.perf_counter() - start
    out["kcache_warm_pool_phases_s"] = warm.metadata["seconds"]

    tilelang.disable_cache()
    start = time.perf_counter()
    tuner = tilelang.autotuner.AutoTuner.from_kernel(kernel=matmul, configs=CONFIGS)
    tuner.set_compile_args(out_idx=[2], target=target, execution_backend="tvm_ffi")
    tuner.set_profile_args(ref_prog=lambda x, y: x @ y, supply_prog=lambda params: [a, b])
    tl_result = tuner.run()
    out["tilelang_s"] = time.perf_counter() - start
    out["tilelang_best"] = tl_result.config
    out["tilelang_latency_ms"] = tl_result.latency
    out["ratio"] = out["kcache_s"] / out["tilelang_s"]


if __name__ == "__main__":
    sys.exit(main())
