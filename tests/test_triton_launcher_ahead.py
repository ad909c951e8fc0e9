"""kcache.triton.launcher_ahead: during a tune's compile-ahead, Triton's launcher built from the kernel's source
in a thread of its own (a kernel without tensor descriptors), or else by the first config to compile, once,
while the others compile (tests/test_triton_tune_ahead.py sees it made before any config of a real tune
compiled, on the CPU; tests/test_gpu_triton_isolation.py times the real build against the tune's
assemblies on the GPU)."""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from triton.runtime._async_compile import active_mode

from kcache.triton.launcher_ahead import (
    THREAD_NAME,
    LauncherAhead,
    build_launcher,
    from_source,
    takes_tensor_descriptors,
)
from kcache.triton.parallel_tune import compiling_at_once

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


class Source:
    """An `ASTSource` as a launcher reads it: the kernel's signature."""

    def __init__(self, signature: dict[str, str]) -> None:
        self.signature = signature


@pytest.fixture
def driver_building(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, object, str]]]:
    """Triton's active driver replaced by one whose launcher notes what it was built from (its thread, the
    tensor descriptors' layout it read) and then, as Triton's CUDA launcher does once its module is built,
    reads the compiled kernel's scratch size."""
    from triton.runtime import driver

    built: list[tuple[str, object, str]] = []

    class Launcher:
        def __init__(self, src: Source, metadata: object) -> None:
            built.append((threading.current_thread().name, getattr(metadata, "tensordesc_meta", "absent"), src.signature))
            self.global_scratch_size = metadata.global_scratch_size  # type: ignore[attr-defined]

    class Driver:
        launcher_cls = Launcher

    monkeypatch.setattr(driver, "_active", Driver())  # Triton's own state, put back after (no GPU: no default)
    yield built


def test_a_kernel_without_tensor_descriptors_has_its_launcher_built_from_its_source_in_a_thread(
        driver_building: list, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="kcache"):
        thread = from_source(Source({"a_ptr": "*fp16", "M": "i32", "BLOCK": "constexpr"}))
        assert thread is not None
        thread.join(WAIT_S)
    assert not thread.is_alive()
    assert driver_building == [(THREAD_NAME, None, {"a_ptr": "*fp16", "M": "i32", "BLOCK": "constexpr"})]
    # The compiled kernel's fields are not there to read: what the launcher read of them is let go.
    assert "global_scratch_size" in caplog.text and "Traceback" not in caplog.text


def test_a_kernel_that_takes_tensor_descriptors_is_left_to_its_first_compile(driver_building: list) -> None:
    assert from_source(Source({"desc": "tensordesc<fp16[64, 64]>", "M": "i32"})) is None
    assert from_source(Source({"pair": ("*fp16", "tensordesc<fp16[64]>")})) is None  # inside a tuple too
    assert from_source(None) is None
    assert driver_building == []
    assert not takes_tensor_descriptors(Source({"tensordesc_base": "*fp16"}))  # a name is no type
