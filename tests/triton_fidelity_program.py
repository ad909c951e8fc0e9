"""Triton kernels as real libraries write them, compiled for sm_90 (no GPU needed), each in several
configs: the operator library's add, softmax and blocked matmul (`tl.dot`, on Hopper's wgmma), a
grouped matmul with TMA descriptors (`tl.make_tensor_descriptor`), an fp8 matmul, an Inductor-style
fused kernel (a persistent reduction with `tl.where` and libdevice) and a Gluon copy (Gluon's front half
makes TTGIR, not TTIR), and a kernel whose code reads its `num_warps`. Prints one JSON object: for
each kernel and config, the sha256 of every file of its group, read through the paths Triton's `compile`
got (`CompiledKernel.metadata_group`); and for each kernel, how many front halves were made
(`ASTSource.make_ir` calls, in this process).

    python tests/triton_fidelity_program.py      (KT_AT_ONCE=1: every config at once, each from a thread
                                                  of its own, in kcache's `shared_fronts.sharing()` as a
                                                  tune's compile-ahead compiles them)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource

from stress.programs.triton_programs.compile import KERNELS
from tests.gluon_program import copy_kernel

TARGET = GPUTarget("cuda", 90, 32)


@triton.jit
def tma_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      GROUP_M: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % size_m)
    pid_n = (pid % (GROUP_M * num_n)) // size_m
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a = a_desc.load([pid_m * BM, k * BK])
        b = b_desc.load([pid_n * BN, k * BK])
        acc = tl.dot(a, b.T, acc)
    c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.float16))


@triton.jit
def fp8_matmul_kernel(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a_tile = tl.load(a + rm[:, None] * K + (k * BK + rk)[None, :])
        b_tile = tl.load(b + (k * BK + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(a_tile, b_tile, acc)
    tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))


@triton.jit
def fused_norm_gelu_kernel(in_ptr, weight_ptr, out_ptr, xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    # Inductor's shape: a persistent reduction over a row, then pointwise work on it.
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    rindex = tl.arange(0, RBLOCK)[None, :]
    xmask, rmask = xindex < xnumel, rindex < rnumel
    values = tl.load(in_ptr + (rindex + rnumel * xindex), xmask & rmask, other=0.0)
    mean = tl.sum(tl.where(xmask & rmask, values, 0.0), 1)[:, None] / rnumel
    centered = values - mean
    var = tl.sum(tl.where(xmask & rmask, centered * centered, 0.0), 1)[:, None] / rnumel
    normed = centered * tl.extra.cuda.libdevice.rsqrt(var + 1e-5) * tl.load(weight_ptr + rindex, rmask)
    gelu = 0.5 * normed * (1.0 + tl.extra.cuda.libdevice.erf(normed * 0.7071067811865476))
    tl.store(out_ptr + (rindex + rnumel * xindex), gelu, xmask & rmask)


@triton.jit
def warps_kernel(out, BLOCK: tl.constexpr):
    # Its IR depends on num_warps: no config may take another's front half.
    offsets = tl.arange(0, BLOCK)
    tl.store(out + offsets, offsets * tl.extra.cuda.num_warps())


def sources() -> dict[str, tuple[object, dict]]:
    """Each kernel and config: (its source, Triton's options)."""
    found: dict[str, tuple[object, dict]] = {}
    for name, (fn, signature, constexprs) in KERNELS.items():
        for warps, stages in ((4, 3), (8, 4)):
            found[f"{name} w{warps} s{stages}"] = (ASTSource(fn, signature, constexprs),
                                                   {"num_warps": warps, "num_stages": stages})
    tma = {**{name: "*fp16" for name in ("a_ptr", "b_ptr", "c_ptr")}, "M": "i32", "N": "i32", "K": "i32",
           **{name: "constexpr" for name in ("BM", "BN", "BK", "GROUP_M")}}
    for bm, bn, bk, stages in ((128, 128, 64, 3), (128, 256, 64, 4), (64, 128, 32, 2)):
        found[f"tma_matmul {bm}x{bn}x{bk} s{stages}"] = (
            ASTSource(tma_matmul_kernel, tma, {"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8}),
            {"num_warps": 8 if bn == 256 else 4, "num_stages": stages})
    fp8 = {"a": "*fp8e4nv", "b": "*fp8e4nv", "c": "*bf16", "M": "i32", "N": "i32", "K": "i32",
           **{name: "constexpr" for name in ("BM", "BN", "BK")}}
    found["fp8_matmul 128x128x128"] = (ASTSource(fp8_matmul_kernel, fp8, {"BM": 128, "BN": 128, "BK": 128}),
                                       {"num_warps": 8, "num_stages": 3})
    fused = {"in_ptr": "*fp32", "weight_ptr": "*fp32", "out_ptr": "*fp32", "xnumel": "i32", "rnumel": "i32",
             "XBLOCK": "constexpr", "RBLOCK": "constexpr"}
    found["fused_norm_gelu"] = (ASTSource(fused_norm_gelu_kernel, fused, {"XBLOCK": 8, "RBLOCK": 512}),
                                {"num_warps": 4})
    for warps in (4, 8):
        found[f"warps w{warps}"] = (ASTSource(warps_kernel, {"out": "*i32", "BLOCK": "constexpr"}, {"BLOCK": 128}),
                                    {"num_warps": warps})
    found["gluon copy"] = (GluonASTSource(copy_kernel, {"x": "*fp32", "out": "*fp32", "BLOCK": "constexpr"},
                                          {"BLOCK": 128}), {"num_warps": 4})
    return found


def compile_all(at_once: bool) -> dict[str, dict[str, str]]:
    """Each config compiled, one after another or at once; the sha256 of each file of its group."""
    def digests(source: object, options: dict) -> dict[str, str]:
        compiled = triton.compile(source, target=TARGET, options=options)
        return {Path(path).name.rsplit(".", 1)[-1]: hashlib.sha256(Path(path).read_bytes()).hexdigest()
                for path in compiled.metadata_group.values()}

    found = sources()
    if not at_once:
        return {label: digests(*job) for label, job in found.items()}
    from kcache.triton.shared_fronts import sharing

    with sharing(), ThreadPoolExecutor(len(found)) as pool:
        futures = {label: pool.submit(digests, *job) for label, job in found.items()}
        return {label: future.result() for label, future in futures.items()}


if __name__ == "__main__":
    from triton.compiler.compiler import ASTSource as TritonsASTSource

    fronts: Counter[str] = Counter()
    make_ir = TritonsASTSource.make_ir

    def counted_make_ir(self, *args, **kwargs):  # noqa: ANN001, ANN202 - Triton's own signature
        fronts[self.fn.__name__] += 1
        return make_ir(self, *args, **kwargs)

    TritonsASTSource.make_ir = counted_make_ir
    files = compile_all(os.environ.get("KT_AT_ONCE") == "1")
    print(json.dumps({"files": files, "fronts": dict(fronts)}), flush=True)
