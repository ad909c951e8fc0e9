"""kcache.triton.parallel_tune's launcher ahead: during a tune's compile-ahead, the first config to compile
builds Triton's launcher in its own thread, once, while the others compile (tests/test_triton_tune_ahead.py
sees it made before a real tune's first benchmark on the CPU; tests/test_gpu_triton_isolation.py times the
real build against the tune's assemblies on the GPU)."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from triton.runtime._async_compile import AsyncCompileMode

from kcache.triton.parallel_tune import LauncherAhead, build_launcher

WAIT_S = 30


def failing() -> str:
    raise RuntimeError("the config's compile failed")


def test_the_first_kernel_compiled_builds_the_launcher_once_and_a_failure_claims_nothing() -> None:
    built: list[str] = []
    with ThreadPoolExecutor(1) as pool:  # one thread: the compiles run in the order submitted
        with AsyncCompileMode(LauncherAhead(pool, built.append), ignore_errors=True) as mode:
            kernels = [mode.submit(name, compile_fn, lambda kernel: None)
                       for name, compile_fn in (("x", failing), ("a", lambda: "a"), ("b", lambda: "b"))]
    assert built == ["a"]
    assert [kernel.result(ignore_errors=True) for kernel in kernels] == [None, "a", "b"]


def test_the_launcher_is_built_while_the_other_configs_still_compile() -> None:
    other_compiled = threading.Event()
    seen: list[bool] = []

    def build(kernel: str) -> None:
        seen.append(other_compiled.wait(WAIT_S))  # the second compile runs meanwhile, in another thread

    def second() -> str:
        assert first_done.wait(WAIT_S)
        other_compiled.set()
        return "second"

    first_done = threading.Event()

    def first() -> str:
        first_done.set()
        return "first"

    with ThreadPoolExecutor(2) as pool, AsyncCompileMode(LauncherAhead(pool, build)) as mode:
        mode.submit("second", second, lambda kernel: None)
        mode.submit("first", first, lambda kernel: None)
    assert seen == [True]


def test_a_launcher_that_cannot_be_built_ahead_is_left_to_the_kernels_first_load(
        caplog: pytest.LogCaptureFixture) -> None:
    class Kernel:  # Triton's CompiledKernel as the launcher reads it
        name, src, metadata = "add_kernel", object(), object()

    with caplog.at_level(logging.DEBUG, logger="kcache"):
        build_launcher(Kernel())  # no GPU here: Triton finds no active driver
    assert "building Triton's launcher ahead failed" in caplog.text, caplog.text
