"""The identity of the device a tune measured on: what its timings depend on, and nothing else.

A tune's winner is a measurement. It holds for the device model it was measured on: another model
with the same arch (an H100 and an H200 are both `sm_90a`) may rank the configs otherwise. So the
identity has the model's name, its compute capability, its SM count (a MIG slice or a cut-down
part differs there) and its memory in whole GiB (the 80 and 94 GiB parts). It leaves out what
does not change a measurement: the device's index, its UUID, the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Where no CUDA device is visible (a custom profiler timed something else): one identity for all such.
NO_CUDA_DEVICE: dict[str, Any] = {"kind": "none"}
IDENTITY_FIELDS = ("kind", "name", "capability", "sms", "memory_gib")


def current_device_identity() -> dict[str, Any]:
    """The identity of this process's current CUDA device (torch's), or NO_CUDA_DEVICE."""
    try:
        import torch

        if not torch.cuda.is_available():
            return dict(NO_CUDA_DEVICE)
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    except (ImportError, RuntimeError, AssertionError):
        return dict(NO_CUDA_DEVICE)
    return {
        "kind": "cuda",
        "name": str(properties.name),
        "capability": f"{properties.major}.{properties.minor}",
        "sms": int(properties.multi_processor_count),
        "memory_gib": round(int(properties.total_memory) / (1 << 30)),
    }


def normalized(identity: Mapping[str, Any]) -> dict[str, Any]:
    """`identity` as it is keyed and compared: a mapping of JSON scalars, `kind` defaulting to "cuda".

    A user may describe the device a custom profiler measures on (`tune(device=...)`); whatever
    fields they give count, so that two descriptions that differ are two devices."""
    if not isinstance(identity, Mapping):
        raise TypeError(f"a device identity is a mapping such as {{'name': 'NVIDIA H100 80GB HBM3'}}, not "
                        f"{type(identity).__name__}")
    result = {"kind": "cuda", **{str(k): v for k, v in identity.items()}}
    for name, value in result.items():
        if not isinstance(value, (str, int, float, bool)) or value is None:
            raise TypeError(f"the device identity's field {name!r} must be a string or a number, not "
                            f"{type(value).__name__}")
    return result


def describe(identity: Mapping[str, Any] | None) -> str:
    """One phrase for messages: "NVIDIA H100 80GB HBM3 (9.0, 132 SMs)", "no CUDA device"."""
    if not identity:
        return "an unrecorded device"
    if identity.get("kind") == "none":
        return "no CUDA device"
    details = [str(identity[f]) for f in ("capability",) if f in identity]
    if "sms" in identity:
        details.append(f"{identity['sms']} SMs")
    name = str(identity.get("name", "a CUDA device"))
    return f"{name} ({', '.join(details)})" if details else name
