"""A 16-config `@triton.autotune` fp16 matmul on the GPU, as an operator library tunes one (issue 56).

    python -m stress.programs.triton_programs.tune      (KT_ABORT=1: one config's compile aborts, in its `llir` stage;
                                               KT_VARIANT=N: a tune of its own, every config's `maxnreg`
                                               232 - 8 N, so that N processes tune N sets of keys;
                                               KT_GATE=1: print "ready" and wait for a line first;
                                               KT_LOG_TIMES=1: kcache's log with each line's time;
                                               KT_SPANS_DIR=D: the tune's compile spans, as epoch seconds,
                                               written to D/<pid>.json, for a timeline)

Times, in a fresh process: the first call (the tune: every config compiled, then benchmarked) and a
second tune of the same key with every config already compiled (the benchmarks alone). Their
difference is the tune's compile phase, for plain Triton (one config after another, in this process)
and for kcache (the configs at once, each in a fork) alike. Prints one JSON object: tune_s, bench_s,
compile_phase_s, the best config, whether the result equals torch's, and where the abort fired.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import triton
from triton import knobs

from .compile import MATMUL_CONFIGS
from .compile import matmul_kernel as plain_matmul_kernel

M = N = K = 2048
# 16 configs; the one with num_stages=5 is the only one of its kind: KT_ABORT aborts its compile.
CONFIGS = [triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=warps, num_stages=stages)
           for bm, bn, bk, warps, stages in MATMUL_CONFIGS]
ABORTED = CONFIGS[5]
if os.environ.get("KT_VARIANT"):  # another tune: the same configs, each with a register cap of its own
    CONFIGS = [triton.Config(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages,
                             maxnreg=232 - 8 * int(os.environ["KT_VARIANT"])) for config in CONFIGS]


# The blocked tl.dot matmul of stress.programs.triton_programs.compile, tuned over CONFIGS as an operator library
# tunes it.
matmul_kernel = triton.autotune(configs=CONFIGS, key=["M", "N", "K"])(plain_matmul_kernel)


def abort_one_config() -> None:
    def hook(self=None, stages=None, options=None, language=None, capability=None):  # noqa: ANN001, ANN202
        if self is None and stages is None:  # Triton 3.7 and later ask it what it adds to the cache key
            return "", ""
        if stages is None or options.num_stages != ABORTED.num_stages:
            return
        llir = stages["llir"]

        def aborting(src, metadata):  # noqa: ANN001, ANN202
            with open(os.environ["KT_FIRED"], "a") as fired:
                fired.write(f"{os.getpid()}\n")
            os.abort()
            return llir(src, metadata)

        stages["llir"] = aborting

    knobs.runtime.add_stages_inspection_hook = hook


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = torch.empty((M, N), device=a.device, dtype=torch.float16)
    grid = lambda meta: (triton.cdiv(M, meta["BM"]), triton.cdiv(N, meta["BN"]))  # noqa: E731
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    return c


def compile_times() -> list[tuple[float, float]]:
    """(start, end) of every Triton `compile` call of this process from now on, as Triton's compilation
    listener reports them (its end, and the call's duration)."""
    spans: list[tuple[float, float]] = []

    def listen(*, src: object, metadata: object, metadata_group: object, times: object, cache_hit: bool) -> None:
        took = (times.ir_initialization + sum(ms for _, ms in times.lowering_stages) + times.store_results) / 1e6
        ended = time.time()
        spans.append((ended - took, ended))

    knobs.compilation.listener = listen
    return spans


def time_compiling(spans: list[tuple[float, float]]) -> float:
    """The time within `spans` during which at least one compile ran (overlapping calls counted once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def main() -> None:
    if os.environ.get("KT_LOG_TIMES") == "1":
        import logging

        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(relativeCreated)8.0f ms %(threadName)s %(message)s"))
        logging.getLogger("kcache").addHandler(handler)
        logging.getLogger("kcache").setLevel(logging.DEBUG)
    if os.environ.get("KT_ABORT"):
        abort_one_config()
    spans = compile_times()
    torch.manual_seed(0)
    a = torch.randn((M, K), device="cuda", dtype=torch.float16)
    b = torch.randn((K, N), device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    if os.environ.get("KT_GATE") == "1":
        print("ready", flush=True)
        sys.stdin.readline()
    started = time.perf_counter()
    c = matmul(a, b)
    torch.cuda.synchronize()
    tune_s = time.perf_counter() - started
    compiling_s = time_compiling(spans)
    if os.environ.get("KT_SPANS_DIR"):
        with open(os.path.join(os.environ["KT_SPANS_DIR"], f"{os.getpid()}.json"), "w") as out:
            json.dump({"variant": os.environ.get("KT_VARIANT"), "cache": os.environ.get("TRITON_CACHE_DIR"), "spans": spans}, out)
    best = matmul_kernel.best_config
    matmul_kernel.cache.clear()  # the same tune again: every config compiled, in Triton's memory
    started = time.perf_counter()
    matmul(a, b)
    torch.cuda.synchronize()
    bench_s = time.perf_counter() - started
    expected = a @ b
    print(json.dumps({"tune_s": tune_s, "bench_s": bench_s, "compile_phase_s": tune_s - bench_s,
                      "compiling_s": compiling_s,
                      "best": str(best), "aborted_config": str(ABORTED), "pid": os.getpid(),
                      "correct": bool(torch.allclose(c.float(), expected.float(), atol=1e-1, rtol=1e-2))}))


if __name__ == "__main__":
    main()
