"""On a GPU: a real matmul tune, out-of-resources at launch, and wrong results, through autotuner.tune."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")

import autotuner  # noqa: E402
import kcache  # noqa: E402
from autotuner.trials import OK, OUT_OF_RESOURCES, WRONG_RESULT  # noqa: E402
from stress.gpu import gpu_target  # noqa: E402
from stress.programs.tune_kernels import CONFIGS, N, matmul  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible; run these on the GPU machine"),
]


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
