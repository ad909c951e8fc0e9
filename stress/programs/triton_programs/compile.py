"""A program that compiles Triton kernels for sm_90 (no GPU needed) as an operator library's tests
would: an elementwise add, a softmax with row reductions and a blocked matmul with `tl.dot`. It imports
nothing of the project's: the tests also run a copy of this file alone, by path.

    python -m stress.programs.triton_programs.compile NAME[,NAME...]   (KT_GATE=1: wait for a line on stdin
                                                     first; KT_TIMED=1: also each compile call's seconds;
                                                     KT_OPTIONS='{"num_warps": 8}': Triton's options)

Prints one JSON object: each kernel's name -> sha256 of its cubin. Whichever cache manager Triton is
told to use (TRITON_CACHE_MANAGER) is the one under test."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out + offsets, tl.load(x + offsets, mask=mask) + tl.load(y + offsets, mask=mask), mask=mask)


@triton.jit
def softmax_kernel(out, inp, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    values = tl.load(inp + row * in_stride + cols, mask=cols < n_cols, other=-float("inf"))
    shifted = values - tl.max(values, axis=0)
    numerator = tl.exp(shifted)
    tl.store(out + row * out_stride + cols, numerator / tl.sum(numerator, axis=0), mask=cols < n_cols)


@triton.jit
def matmul_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a_tile = tl.load(a + rm[:, None] * sam + (k * BK + rk)[None, :] * sak)
        b_tile = tl.load(b + (k * BK + rk)[:, None] * sbk + rn[None, :] * sbn)
        acc += tl.dot(a_tile, b_tile)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.float16))


KERNELS = {
    "add": (add_kernel, {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"},
            {"BLOCK": 1024}),
    "softmax": (softmax_kernel, {"out": "*fp32", "inp": "*fp32", "in_stride": "i32", "out_stride": "i32",
                                 "n_cols": "i32", "BLOCK": "constexpr"}, {"BLOCK": 1024}),
    "matmul": (matmul_kernel, {**{name: "*fp16" for name in ("a", "b", "c")},
                               **{name: "i32" for name in ("M", "N", "K", "sam", "sak", "sbk", "sbn", "scm", "scn")},
                               "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"},
               {"BM": 128, "BN": 128, "BK": 64}),
}
TARGET = GPUTarget("cuda", 90, 32)
# The matmul's 16 tuning configs, (BM, BN, BK, num_warps, num_stages), as stress.programs.triton_programs.tune
# tunes them and .wide_floor compiles them; the one with num_stages=5 is the only one of its kind.
MATMUL_CONFIGS = [(bm, bn, bk, warps, stages) for bm, bn in ((128, 128), (128, 64), (64, 128), (64, 64))
                  for bk, warps, stages in ((32, 4, 3), (64, 4, 3), (32, 8, 4), (64, 8, 4))]
MATMUL_CONFIGS[5] = (128, 64, 64, 4, 5)
def compile_kernel(name: str) -> str:
    fn, signature, constexprs = KERNELS[name]
    options = json.loads(os.environ.get("KT_OPTIONS") or "{}")  # e.g. {"num_warps": 8}: another key
    compiled = triton.compile(ASTSource(fn, signature, constexprs), target=TARGET, options=options)
    return hashlib.sha256(compiled.asm["cubin"]).hexdigest()


if __name__ == "__main__":
    if os.environ.get("KT_GATE") == "1":
        print("ready", flush=True)
        sys.stdin.readline()
    results: dict[str, object] = {}
    for name in sys.argv[1].split(","):
        started = time.perf_counter()
        results[name] = compile_kernel(name)
        if os.environ.get("KT_TIMED") == "1":  # from the call until the kernel is usable
            results[f"{name}_seconds"] = time.perf_counter() - started
    print(json.dumps(results), flush=True)
