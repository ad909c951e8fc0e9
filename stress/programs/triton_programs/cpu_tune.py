"""A 16-config `@triton.autotune` of the bench's matmul (stress.programs.triton_programs.tune's configs), on
the CPU: Triton's driver is replaced by one that compiles for sm_90 and launches nothing, so that a tune
runs without a GPU as on one, through Triton's own `Autotuner.run`, `_bench` and `JITFunction.run`, and
so kcache's compile-ahead with it. Its benchmark calls each config once and times the configs in their
order, the last fastest, so that every run picks the same one: the tune's time is its compiles'.

    python -m stress.programs.triton_programs.cpu_tune   (KT_ABORT=1: one config's compile aborts, in its
                                                      `llir` stage; KT_FIRED: the file the abort notes its pid in;
                                                      KT_BAD_CONFIG=1: a last config whose front half fails,
                                                      BM=48 not a power of 2, a CompilationError that ends the tune)

Prints one JSON object: the tune's seconds, the pick, each config's cubin sha256, the front halves made
(`ASTSource.make_ir` calls in this process), and what the driver saw, in order: each launcher made (and
whether any compile had ended then), each launch. Run by tests/test_triton_tune_ahead.py and, without a
GPU, by the bench's autotune row.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime import driver

from .tune import CONFIGS, abort_one_config, matmul_kernel

SIZE = 256
EVENTS: list[str] = []
COMPILES_ENDED: list[str] = []  # Triton's compilation listener notes each compile that ended, hit or not


class Launcher:
    """Triton's launcher as the driver makes it for a kernel's first load (or kcache ahead of it); a
    launch does nothing. Noted as made "before any kernel" while no compile of this process ended yet."""

    def __init__(self, src: Any, metadata: Any) -> None:
        EVENTS.append("launcher" if COMPILES_ENDED else "launcher before any kernel")

    def __call__(self, *args: Any) -> None:
        EVENTS.append("launch")


class Utils:
    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple[int, int, int, int, int]:
        return 1, 1, 0, 0, 1024  # module, function, registers, spills, most threads a block

    def get_device_properties(self, device: int) -> dict[str, int]:
        return {"max_shared_mem": 232448, "multiprocessor_count": 132}  # an H100's and H200's


class Sm90WithoutGpu:
    """The driver Triton's JIT asks for the device, its stream and target, and the kernel's loads."""
    launcher_cls = Launcher
    utils = Utils()

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


def in_order(configs: int) -> Any:
    """A benchmark that calls the config once and times the `configs` configs in the order benchmarked."""
    calls = iter(range(configs, 0, -1))

    def bench(kernel_call: Any, quantiles: Any) -> list[float]:
        kernel_call()
        return [float(next(calls))] * 3
    return bench


def main() -> None:
    if os.environ.get("KT_ABORT"):
        abort_one_config()
    fronts = [0]
    make_ir = ASTSource.make_ir

    def counted_make_ir(self: ASTSource, *args: Any, **kwargs: Any) -> Any:
        fronts[0] += 1
        return make_ir(self, *args, **kwargs)

    ASTSource.make_ir = counted_make_ir
    triton.knobs.compilation.listener = lambda **compiled: COMPILES_ENDED.append("ended")
    driver.set_active(Sm90WithoutGpu())
    configs = list(CONFIGS)
    if os.environ.get("KT_BAD_CONFIG"):
        configs.append(triton.Config({"BM": 48, "BN": 64, "BK": 32}, num_warps=4, num_stages=3))
    tuned = triton.autotune(configs=configs, key=["M", "N", "K"], do_bench=in_order(len(configs)))(matmul_kernel.fn)
    a, b, c = (torch.empty((SIZE, SIZE), dtype=torch.float16) for _ in range(3))
    started = time.perf_counter()
    tuned[(1,)](a, b, c, SIZE, SIZE, SIZE, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    tune_s = time.perf_counter() - started
    kernels = tuned.fn.device_caches[0][0].values()
    cubins = {f"{sorted(kernel.src.constants.items())} w{kernel.metadata.num_warps} s{kernel.metadata.num_stages}":
              hashlib.sha256(kernel.asm["cubin"]).hexdigest() for kernel in kernels}
    print(json.dumps({"tune_s": tune_s, "best": str(tuned.best_config), "cubins": cubins, "fronts": fronts[0],
                      "events": EVENTS, "pid": os.getpid()}))


if __name__ == "__main__":
    main()
