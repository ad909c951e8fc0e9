"""A pool of real TileLang kernels (elementwise, reduction, matmul) for tests, stress and benchmarks.

Each spec builds a fresh PrimFunc on demand and knows its torch reference,
so a GPU run can check results.
"""

# No `from __future__ import annotations` here: TileLang evaluates the
# T.Tensor annotations of a prim_func, which must see the closure's values.
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CPU_TARGET = {"kind": "cuda", "arch": "sm_90a"}


@dataclass(frozen=True)
class KernelSpec:
    name: str
    build: Callable[[], Any]  # -> PrimFunc
    out_idx: list[int]
    make_inputs: Callable[[Any], list[Any]]  # torch device -> input tensors
    reference: Callable[..., Any]  # inputs -> expected output
    tolerance: float = 1e-5
    params: dict[str, Any] = field(default_factory=dict)
    symbol: str = ""  # the PrimFunc's global_symbol: the kernel name in an entry's meta.json


def elementwise_add(n: int = 4096, block: int = 256, dtype: str = "float32") -> Any:
    import tilelang.language as T

    @T.prim_func
    def main(A: T.Tensor((n,), dtype), B: T.Tensor((n,), dtype), C: T.Tensor((n,), dtype)):
        with T.Kernel(T.ceildiv(n, block), threads=block) as bx:
            for i in T.Parallel(block):
                C[bx * block + i] = A[bx * block + i] + B[bx * block + i]

    return main.with_attr("global_symbol", f"add_{n}_{block}_{dtype}")


def row_sum(m: int = 256, n: int = 128, block_m: int = 32, dtype: str = "float32") -> Any:
    import tilelang.language as T

    @T.prim_func
    def main(A: T.Tensor((m, n), dtype), B: T.Tensor((m,), dtype)):
        with T.Kernel(T.ceildiv(m, block_m), threads=128) as bx:
            tile = T.alloc_fragment((block_m, n), dtype)
            sums = T.alloc_fragment((block_m,), dtype)
            T.copy(A[bx * block_m, 0], tile)
            T.reduce_sum(tile, sums, dim=1)
            T.copy(sums, B[bx * block_m])

    return main.with_attr("global_symbol", f"rowsum_{m}_{n}_{block_m}_{dtype}")


def matmul(m: int = 256, n: int = 256, k: int = 256, block_m: int = 64, block_n: int = 64, block_k: int = 32,
           dtype: str = "float16", accum: str = "float32") -> Any:
    import tilelang.language as T

    @T.prim_func
    def main(A: T.Tensor((m, k), dtype), B: T.Tensor((k, n), dtype), C: T.Tensor((m, n), dtype)):
        with T.Kernel(T.ceildiv(n, block_n), T.ceildiv(m, block_m), threads=128) as (bx, by):
            a_shared = T.alloc_shared((block_m, block_k), dtype)
            b_shared = T.alloc_shared((block_k, block_n), dtype)
            c_local = T.alloc_fragment((block_m, block_n), accum)
            T.clear(c_local)
            for ko in T.Pipelined(T.ceildiv(k, block_k), num_stages=2):
                T.copy(A[by * block_m, ko * block_k], a_shared)
                T.copy(B[ko * block_k, bx * block_n], b_shared)
                T.gemm(a_shared, b_shared, c_local)
            T.copy(c_local, C[by * block_m, bx * block_n])

    return main.with_attr("global_symbol", f"matmul_{m}_{n}_{k}_{block_m}_{block_n}_{block_k}")


def _rand(device: Any, *shape: int, dtype: str = "float32") -> Any:
    import torch

    return torch.randn(*shape, device=device, dtype=getattr(torch, dtype))


def _add_spec(n: int, block: int) -> KernelSpec:
    return KernelSpec(
        name=f"add_{n}_{block}", build=lambda: elementwise_add(n, block), out_idx=[2],
        make_inputs=lambda dev: [_rand(dev, n), _rand(dev, n)], reference=lambda a, b: a + b,
        params={"n": n, "block": block}, symbol=f"add_{n}_{block}_float32",
    )


def _rowsum_spec(m: int, n: int, block_m: int) -> KernelSpec:
    return KernelSpec(
        name=f"rowsum_{m}_{n}_{block_m}", build=lambda: row_sum(m, n, block_m), out_idx=[1],
        make_inputs=lambda dev: [_rand(dev, m, n)], reference=lambda a: a.sum(dim=1), tolerance=1e-4,
        params={"m": m, "n": n, "block_m": block_m}, symbol=f"rowsum_{m}_{n}_{block_m}_float32",
    )


def _matmul_spec(size: int, block_m: int, block_n: int, block_k: int) -> KernelSpec:
    return KernelSpec(
        name=f"matmul_{size}_{block_m}x{block_n}x{block_k}",
        build=lambda: matmul(size, size, size, block_m, block_n, block_k), out_idx=[2],
        make_inputs=lambda dev: [_rand(dev, size, size, dtype="float16"), _rand(dev, size, size, dtype="float16")],
        reference=lambda a, b: (a.float() @ b.float()).half(), tolerance=1e-2,
        params={"size": size, "block": (block_m, block_n, block_k)},
        symbol=f"matmul_{size}_{size}_{size}_{block_m}_{block_n}_{block_k}",
    )


# Ordered so that the first few are the cheapest to compile.
POOL: list[KernelSpec] = [
    _add_spec(4096, 256),
    _rowsum_spec(256, 128, 32),
    _matmul_spec(256, 64, 64, 32),
    _add_spec(8192, 128),
    _rowsum_spec(512, 64, 16),
    _matmul_spec(512, 128, 128, 32),
    _add_spec(1 << 16, 512),
    _matmul_spec(512, 64, 128, 64),
]


def pool(count: int) -> list[KernelSpec]:
    if not 1 <= count <= len(POOL):
        raise ValueError(f"the kernel pool has {len(POOL)} kernels; asked for {count}")
    return POOL[:count]
