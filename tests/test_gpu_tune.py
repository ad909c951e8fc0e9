"""On a GPU: a real matmul tune, out-of-resources at launch, and wrong results, through autotuner.tune."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")

import autotuner  # noqa: E402
import kcache  # noqa: E402
from autotuner.trials import OK, OUT_OF_RESOURCES, WRONG_RESULT  # noqa: E402

from .test_gpu import gpu_target  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible; run these on the GPU machine"),
]
N = 1024


def matmul(block_m: int = 128, block_n: int = 128, block_k: int = 32, stages: int = 2, threads: int = 128):
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


def inputs() -> list:
    return [torch.randn(N, N, device="cuda", dtype=torch.float16) for _ in range(2)]


def test_a_matmul_tune_over_16_configs_picks_a_correct_fast_config(cache_root: Path) -> None:
    args = inputs()
    result = autotuner.tune(matmul, CONFIGS, inputs=args, ref_prog=lambda a, b: a @ b, target=gpu_target(),
                            out_idx=[2], cache=kcache.KernelCache(cache_root), rep=20, warmup=5, verbose=False)
    assert len(result.configs) == 16 and all(c.status == OK for c in result.configs)
    assert result.latency == min(c.latency for c in result.configs) and result.ref_latency > 0
    kernel = result.load_kernel(kcache.KernelCache(cache_root))
    torch.testing.assert_close(kernel(*args), args[0] @ args[1], rtol=1e-2, atol=1e-2)


def test_out_of_resources_at_launch_and_wrong_results_skip_their_configs(cache_root: Path) -> None:
    configs = [{"block_m": 128, "block_n": 128, "block_k": 32, "stages": 2},
               {"block_m": 256, "block_n": 256, "block_k": 128, "stages": 3}]  # 384 KiB of shared memory
    args = inputs()
    result = autotuner.tune(matmul, configs, inputs=args, ref_prog=lambda a, b: a @ b, target=gpu_target(),
                            out_idx=[2], cache=kcache.KernelCache(cache_root), rep=5, warmup=2, verbose=False)
    assert [c.status for c in result.configs] == [OK, OUT_OF_RESOURCES]
    limit = torch.cuda.get_device_properties(torch.cuda.current_device()).shared_memory_per_block_optin
    assert result.configs[1].message.startswith(
        f"out of resource: shared memory, Required: 393216, Hardware limit: {limit} "), result.configs[1].message
    with pytest.raises(autotuner.TuneFailed) as caught:
        autotuner.tune(matmul, configs[:1], inputs=args, ref_prog=lambda a, b: a @ b + 1, target=gpu_target(),
                       out_idx=[2], cache=kcache.KernelCache(cache_root), tune_key="wrong", verbose=False)
    assert WRONG_RESULT in caught.value.table
