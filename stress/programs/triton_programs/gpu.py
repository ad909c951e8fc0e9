"""A program that runs Triton kernels on the GPU as an operator library and a model would (issue 38):
`@triton.jit` kernels launched from Python (add, softmax, a `tl.dot` matmul), an `@triton.autotune`d
one, and a function compiled by Inductor (`torch.compile`).

    python -m stress.programs.triton_programs.gpu jit|inductor    (KT_GATE=1: wait for a line on stdin first)

Prints one JSON object: for each kernel, whether its output equals torch's (eager for Inductor) and
the sha256 of its output's bytes. Whichever cache manager Triton is told to use (TRITON_CACHE_MANAGER)
is the one under test: the bytes must not depend on it."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

import torch
import triton
import triton.language as tl

from .compile import add_kernel, matmul_kernel, softmax_kernel


@triton.autotune(configs=[triton.Config({"BLOCK": block}, num_warps=warps) for block in (256, 1024)
                          for warps in (2, 4)], key=["n"])
@triton.jit
def scaled_add_kernel(x, y, out, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out + offsets, alpha * tl.load(x + offsets, mask=mask) + tl.load(y + offsets, mask=mask), mask=mask)


def _digest(tensor: Any) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def run_jit() -> dict[str, Any]:
    torch.manual_seed(0)
    results: dict[str, Any] = {}
    n = 1 << 20
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    results["add"] = (bool(torch.equal(out, x + y)), _digest(out))
    rows = torch.randn(512, 1000, device="cuda")
    soft = torch.empty_like(rows)
    softmax_kernel[(rows.shape[0],)](soft, rows, rows.stride(0), soft.stride(0), rows.shape[1], BLOCK=1024)
    results["softmax"] = (bool(torch.allclose(soft, torch.softmax(rows, dim=1), atol=1e-6)), _digest(soft))
    a, b = (torch.randn(512, 512, device="cuda", dtype=torch.float16) for _ in range(2))
    c = torch.empty(512, 512, device="cuda", dtype=torch.float16)
    matmul_kernel[(4, 4)](a, b, c, 512, 512, 512, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                          c.stride(0), c.stride(1), BM=128, BN=128, BK=64)
    results["matmul"] = (bool(torch.allclose(c.float(), (a @ b).float(), rtol=1e-2, atol=1e-1)), _digest(c))
    scaled = torch.empty_like(x)
    scaled_add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, scaled, n, 2.0)
    results["autotuned"] = (bool(torch.allclose(scaled, 2.0 * x + y)), _digest(scaled))
    return results


def model(x: Any, weight: Any) -> Any:
    hidden = torch.nn.functional.gelu(x @ weight)
    return torch.nn.functional.layer_norm(hidden, hidden.shape[-1:]) * torch.sigmoid(hidden.sum(-1, keepdim=True))


def run_inductor() -> dict[str, Any]:
    torch.manual_seed(0)
    x, weight = torch.randn(256, 512, device="cuda"), torch.randn(512, 512, device="cuda")
    compiled = torch.compile(model)(x, weight)
    eager = model(x, weight)
    return {"inductor": (bool(torch.allclose(compiled, eager, rtol=1e-3, atol=1e-3)), _digest(compiled))}


if __name__ == "__main__":
    if os.environ.get("KT_GATE") == "1":
        print("ready", flush=True)
        sys.stdin.readline()
    run = run_jit if sys.argv[1] == "jit" else run_inductor
    results = run()
    torch.cuda.synchronize()
    print(json.dumps({name: {"correct": ok, "sha256": digest} for name, (ok, digest) in results.items()}), flush=True)
