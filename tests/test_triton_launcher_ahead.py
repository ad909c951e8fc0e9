"""kcache.triton.parallel_tune's launcher ahead: during a tune's compile-ahead, the first config to compile
builds Triton's launcher in its own thread, once, while the others compile (tests/test_triton_tune_ahead.py
sees it made before a real tune's first benchmark on the CPU; tests/test_gpu_triton_isolation.py times the
real build against the tune's assemblies on the GPU)."""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from triton.runtime._async_compile import active_mode

from kcache.triton.parallel_tune import LauncherAhead, build_launcher, compiling_at_once

WAIT_S = 30


def failing() -> str:
    raise RuntimeError("the config's compile failed")


def submit(mode: Any, key: str, compile_fn: Callable[[], str], finalize: Callable[[str], object]) -> None:
    """A compile submitted as Triton's JIT submits it (from 3.9 on, with what cleans up after a failure)."""
    cleanup = (lambda kernel: None,) if "cleanup_fn" in inspect.signature(mode.submit).parameters else ()
    mode.submit(key, compile_fn, finalize, *cleanup)


def test_the_first_kernel_compiled_builds_the_launcher_once_and_a_failure_claims_nothing() -> None:
    built: list[str] = []
    finalized: list[str] = []
    with ThreadPoolExecutor(1) as pool:  # one thread: the compiles run in the order submitted
        with compiling_at_once(LauncherAhead(pool, built.append)) as mode:
            assert active_mode.get() is mode  # the JIT's compiles in this thread go to the pool
            for name, compile_fn in (("x", failing), ("a", lambda: "a"), ("b", lambda: "b")):
                submit(mode, name, compile_fn, finalized.append)
    assert built == ["a"]
    # Ended as Triton 3.6's ignore_errors ends it, on Triton 3.5 too (whose own mode raises there and
    # stays active): what compiled is finalized (into the JIT's cache), the failure left to its benchmark.
    assert sorted(finalized) == ["a", "b"] and active_mode.get() is None


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

    with ThreadPoolExecutor(2) as pool, compiling_at_once(LauncherAhead(pool, build)) as mode:
        submit(mode, "second", second, lambda kernel: None)
        submit(mode, "first", first, lambda kernel: None)
    assert seen == [True]


def test_a_launcher_that_cannot_be_built_ahead_is_left_to_the_kernels_first_load(
        caplog: pytest.LogCaptureFixture) -> None:
    class Kernel:  # Triton's CompiledKernel as the launcher reads it
        name, src, metadata = "add_kernel", object(), object()

    with caplog.at_level(logging.DEBUG, logger="kcache"):
        build_launcher(Kernel())  # no GPU here: Triton finds no active driver
    assert "building Triton's launcher ahead failed" in caplog.text, caplog.text
