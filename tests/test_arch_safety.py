"""Arch safety (issue 18), on any machine: a kernel's first call checks that the device's compute
capability is exactly the one its target's arch names, then steps aside. (tests/test_gpu.py runs a
real kernel of another arch on a real device.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")

import kcache  # noqa: E402
from kcache.tilelang import device_arch  # noqa: E402
from stress.programs.kernels import CPU_TARGET, elementwise_add  # noqa: E402


@pytest.mark.parametrize(("arch", "capability"), [("sm_90a", (9, 0)), ("sm_90", (9, 0)), ("sm_120", (12, 0)),
                                                  ("sm_121", (12, 1)), ("sm_100a", (10, 0)), ("sm_8", None),
                                                  ("gfx90a", None)])
def test_an_arch_names_one_compute_capability(arch: str, capability: tuple[int, int] | None) -> None:
    assert device_arch.arch_capability(arch) == capability


@pytest.mark.tilelang
def test_the_first_call_refuses_another_compute_capability_and_then_steps_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = dataclasses.replace(kcache.Settings.from_env(tmp_path), compile_isolation="inprocess")
    compiled = kcache.KernelCache(tmp_path, settings=settings).get_or_compile(elementwise_add(), CPU_TARGET, out_idx=[2])
    loaded = kcache.KernelCache(tmp_path, settings=settings).get_or_compile(elementwise_add(), CPU_TARGET, out_idx=[2])
    # No GPU here: the device is stood in for (device 0, and what it reports), and the kernel's own
    # function by a recorder, since nothing can launch.
    monkeypatch.setattr(device_arch, "device_of_call", lambda args, kwargs: 0)
    for kernel in (compiled, loaded):
        armed = kernel.torch_function
        assert isinstance(armed, device_arch._ArchCheckOnFirstCall)
        calls: list[tuple] = []
        armed.function = lambda *args: calls.append(args) or "ran"
        monkeypatch.setattr(device_arch, "_device_capability", {0: ((12, 1), "GPU 0 (a neighbour)")})
        with pytest.raises(kcache.ArchMismatch, match=r"built for sm_90a, and GPU 0 \(a neighbour\) is compute "
                                                      r"capability 12.1") as refused:
            kernel("a", "b")
        assert refused.value.arch == "sm_90a" and refused.value.capability == (12, 1)
        assert not calls and kernel.torch_function is armed  # refused every time, never run
        monkeypatch.setattr(device_arch, "_device_capability", {0: ((9, 0), "GPU 0 (an H100)")})
        assert kernel("a", "b") == "ran" and calls == [("a", "b")]
        assert kernel.torch_function is armed.function  # checked once: later calls go straight through
