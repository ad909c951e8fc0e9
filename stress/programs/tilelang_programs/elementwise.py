"""An elementwise kernel in the style of TileLang's examples; nothing here knows about kcache."""

import tilelang
import tilelang.language as T
from report import finish


@tilelang.jit(out_idx=[-1])
def elementwise_add(N, block_N, dtype="float32"):
    @T.prim_func
    def add(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), threads=block_N) as bx:
            for i in T.Parallel(block_N):
                C[bx * block_N + i] = A[bx * block_N + i] + B[bx * block_N + i]

    return add


def main():
    kernel = elementwise_add(1 << 20, 256)

    def check():
        import torch

        torch.manual_seed(0)
        a, b = (torch.randn(1 << 20, device="cuda") for _ in range(2))
        c = kernel(a, b)
        torch.testing.assert_close(c, a + b)
        return {"add": c}

    finish("elementwise", {"add": kernel}, check)


if __name__ == "__main__":
    main()
