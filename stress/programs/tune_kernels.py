"""The matmul tuned by `python -m stress.bench.standalone.tune` and tests/test_gpu_tune.py, and its 16 configs."""

from __future__ import annotations

N = 1024


def matmul(block_m: int = 128, block_n: int = 128, block_k: int = 32, stages: int = 2, threads: int = 128):
    """An N x N x N float16 matmul PrimFunc (float32 accumulation) with the given tiling."""
    import tilelang.language as T

    @T.prim_func
    def main(A: T.Tensor((N, N), "float16"), B: T.Tensor((N, N), "float16"), C: T.Tensor((N, N), "float16")):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(N, block_m), threads=threads) as (bx, by):
            a = T.alloc_shared((block_m, block_k), "float16")
            b = T.alloc_shared((block_k, block_n), "float16")
            c = T.alloc_fragment((block_m, block_n), "float32")
            T.clear(c)
            for ko in T.Pipelined(T.ceildiv(N, block_k), num_stages=stages):
                T.copy(A[by * block_m, ko * block_k], a)
                T.copy(B[ko * block_k, bx * block_n], b)
                T.gemm(a, b, c)
            T.copy(c, C[by * block_m, bx * block_n])

    return main.with_attr("global_symbol", f"mm_{block_m}_{block_n}_{block_k}_{stages}_{threads}")


CONFIGS = [{"block_m": m, "block_n": n, "block_k": k, "stages": s}
           for m in (64, 128) for n in (64, 128) for k in (32, 64) for s in (2, 3)]
