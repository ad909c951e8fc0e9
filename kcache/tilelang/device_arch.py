"""Arch safety: a kernel runs only on a device whose compute capability its target names exactly.

The key holds the target's arch, so a kernel is never served for another arch that was asked for; but
a target can name an arch explicitly (a deployment's config, TILELANG_DEFAULT_TARGET, a bundle built
elsewhere) and the program can then run on another GPU. CUDA refuses some of those launches and
accepts others (sm_86 code runs on sm_89; sm_120 code on sm_121), which is how a neighbour arch's
artifact gives garbled output. kcache allows none: sm_90a runs on 9.0 only, sm_120 on 12.0 only.

Checked on the kernel's first call, once: the first call replaces itself with the kernel's own
function (`JITKernel.__call__` calls `torch_function`), so later calls cost nothing. At the first
call the arguments name the device the kernel runs on, and CUDA is initialized by them anyway (a
check at load would initialize CUDA in a process that may not have touched it yet, on the hit path).
Where no GPU is visible nothing can run, and nothing is checked (a build machine compiles for any arch).
"""

from __future__ import annotations

import json
import re
from typing import Any

from kcache.errors import ArchMismatch

_ARCH = re.compile(r"sm_(\d+)(\d)[a-z]?")
_target_arch: dict[str, str | None] = {}  # canonical target JSON -> its arch
_device_capability: dict[int, tuple[tuple[int, int], str]] = {}  # device index -> (capability, name)


def arch_capability(arch: str) -> tuple[int, int] | None:
    """"sm_90a" -> (9, 0), "sm_120" -> (12, 0), "sm_121" -> (12, 1); None for what is no CUDA arch."""
    matched = _ARCH.fullmatch(arch)
    return (int(matched.group(1)), int(matched.group(2))) if matched else None


def target_arch(canonical: str) -> str | None:
    arch = _target_arch.get(canonical, "")
    if arch == "":
        try:
            named = json.loads(canonical).get("arch")
        except (ValueError, AttributeError):
            named = None
        arch = _target_arch[canonical] = named if isinstance(named, str) else None
    return arch


def device_of_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The CUDA device of the first CUDA tensor among the arguments, else torch's current device;
    None when no GPU is visible."""
    import torch

    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.is_cuda:
            return value.device.index if value.device.index is not None else torch.cuda.current_device()
    if not torch.cuda.is_available():
        return None
    return torch.cuda.current_device()


def device_capability(index: int) -> tuple[tuple[int, int], str]:
    known = _device_capability.get(index)
    if known is None:
        import torch

        capability = torch.cuda.get_device_capability(index)
        known = _device_capability[index] = ((int(capability[0]), int(capability[1])),
                                             f"GPU {index} ({torch.cuda.get_device_name(index)})")
    return known


def require_device_arch(kernel_name: str, canonical_target: str, device: int | None) -> None:
    """Raise ArchMismatch unless `device` (None: no GPU, nothing to check) has exactly the compute
    capability of the target's arch."""
    if device is None:
        return
    arch = target_arch(canonical_target)
    wanted = arch_capability(arch) if arch is not None else None
    if wanted is None:
        return  # no arch named: TileLang's own rules apply
    capability, name = device_capability(device)
    if capability != wanted:
        raise ArchMismatch(kernel_name, str(arch), name, capability)


class _ArchCheckOnFirstCall:
    """Stands in for a kernel's `torch_function` until its first call passes the check."""

    __slots__ = ("kernel", "function", "kernel_name", "canonical_target")

    def __init__(self, kernel: Any, kernel_name: str, canonical_target: str) -> None:
        self.kernel = kernel
        self.function = kernel.torch_function
        self.kernel_name = kernel_name
        self.canonical_target = canonical_target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        require_device_arch(self.kernel_name, self.canonical_target, device_of_call(args, kwargs))
        self.kernel.torch_function = self.function  # checked: later calls go straight to the kernel
        return self.function(*args, **kwargs)


def check_on_first_call(kernel: Any, kernel_name: str, canonical_target: str) -> Any:
    """Arm `kernel` (a JITKernel) so that its first call checks the device's arch; returns it."""
    if target_arch(canonical_target) is not None:
        kernel.torch_function = _ArchCheckOnFirstCall(kernel, kernel_name, canonical_target)
    return kernel
