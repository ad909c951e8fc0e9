"""`@tilelang.jit` in its eager form (the kernel is built from the tensors' annotations and runs at
once), in the style of TileLang's examples; nothing here knows about kcache."""

import torch

import tilelang
import tilelang.language as T
from report import finish


@tilelang.jit
def add(A, B, C, block: int = 256):
    N = T.const("N")
    A: T.Tensor[[N], "float32"]
    B: T.Tensor[[N], "float32"]
    C: T.Tensor[[N], "float32"]
    with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
        for i in T.Parallel(block):
            C[bx * block + i] = A[bx * block + i] + B[bx * block + i]


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    a, b = (torch.randn(1 << 20, device=device) for _ in range(2))
    c = torch.empty_like(a)
    kernel = add.compile(a, b, c)  # what a call builds; on a GPU the call below also runs it

    def check():
        add(a, b, c)
        torch.testing.assert_close(c, a + b)
        return {"add": c}

    finish("eager_add", {"add": kernel}, check)


if __name__ == "__main__":
    main()
