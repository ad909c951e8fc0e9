"""A row reduction in the style of TileLang's examples; nothing here knows about kcache."""

import tilelang
import tilelang.language as T
from report import finish


@tilelang.jit(out_idx=[-1])
def row_sum(M, N, block_M, dtype="float32"):
    @T.prim_func
    def reduce(A: T.Tensor((M, N), dtype), B: T.Tensor((M,), dtype)):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            tile = T.alloc_fragment((block_M, N), dtype)
            sums = T.alloc_fragment((block_M,), dtype)
            T.copy(A[bx * block_M, 0], tile)
            T.reduce_sum(tile, sums, dim=1)
            T.copy(sums, B[bx * block_M])

    return reduce


def main():
    kernel = row_sum(4096, 128, 32)

    def check():
        import torch

        torch.manual_seed(0)
        a = torch.randn(4096, 128, device="cuda")
        b = kernel(a)
        torch.testing.assert_close(b, a.sum(dim=1), rtol=1e-4, atol=1e-4)
        return {"row_sum": b}

    finish("reduction", {"row_sum": kernel}, check)


if __name__ == "__main__":
    main()
