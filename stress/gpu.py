"""The GPU present, as a kcache target, for the GPU tests and `python -m stress.bench_tune`."""

from __future__ import annotations


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
