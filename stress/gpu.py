"""The GPU present, as a kcache target, for the GPU tests and the benches (and the target a machine with
no GPU compiles unmodified TileLang programs for)."""

from __future__ import annotations

import json
import os

from .programs.kernels import CPU_TARGET as NO_GPU_TARGET  # what a machine with no GPU compiles for (sm_90a)


def gpu_missing() -> str | None:
    """Why no CUDA GPU can be used here (with what to install), or None where one is visible."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install torch, a CUDA build)"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible (needs an NVIDIA GPU, its driver and a CUDA build of torch)"
    return None


def gpu_target() -> dict:
    """The target of the first visible GPU, e.g. {"kind": "cuda", "arch": "sm_90a"}."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    # Hopper's wgmma/TMA code needs the arch-specific sm_90a.
    return {"kind": "cuda", "arch": f"sm_{major}{minor}{'a' if major == 9 else ''}"}


def tilelang_target_env() -> dict[str, str]:
    """TILELANG_DEFAULT_TARGET for children that run unmodified TileLang programs (they take TileLang's
    default target): nothing where it is set already, else the GPU's target, else NO_GPU_TARGET."""
    if os.environ.get("TILELANG_DEFAULT_TARGET"):
        return {}
    return {"TILELANG_DEFAULT_TARGET": json.dumps(gpu_target() if gpu_missing() is None else NO_GPU_TARGET)}
