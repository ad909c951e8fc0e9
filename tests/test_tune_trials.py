"""The compile phase of a tune on CPU: real failing configs, classified; deterministic ones remembered."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")

import kcache  # noqa: E402
from autotuner.trials import (  # noqa: E402
    COMPILE_ERROR,
    COMPILER_CRASH,
    OK,
    OUT_OF_RESOURCES,
    TIMEOUT,
    compile_configs,
    summary_table,
)
from kcache.compile.pool.process_pool import TILELANG_PRELOAD, CompilePool  # noqa: E402
from stress.programs.kernels import CPU_TARGET  # noqa: E402

pytestmark = pytest.mark.tilelang


def tile_kernel(threads: int, tile: int = 64, n: int = 1024):
    """A copy through shared memory and a gemm: TileLang rejects thread counts its gemm cannot split."""
    import tilelang.language as T

    if tile <= 0:
        raise ValueError(f"tile={tile} must be positive")

    @T.prim_func
    def main(A: T.Tensor((n, n), "float16"), B: T.Tensor((n, n), "float16"), C: T.Tensor((n, n), "float16")):
        with T.Kernel(T.ceildiv(n, tile), T.ceildiv(n, tile), threads=threads) as (bx, by):
            a = T.alloc_shared((tile, 32), "float16")
            b = T.alloc_shared((32, tile), "float16")
            c = T.alloc_fragment((tile, tile), "float32")
            T.clear(c)
            for ko in T.Pipelined(T.ceildiv(n, 32), num_stages=2):
                T.copy(A[by * tile, ko * 32], a)
                T.copy(B[ko * 32, bx * tile], b)
                T.gemm(a, b, c)
            T.copy(c, C[by * tile, bx * tile])

    return main.with_attr("global_symbol", f"tile_{threads}_{tile}")


def test_failing_configs_are_classified_and_deterministic_ones_remembered(cache_root: Path) -> None:
    configs = [
        {"threads": 128},              # compiles
        {"threads": 2048},             # over the 1024 threads a CUDA block may have
        {"threads": 96},               # TileLang's gemm cannot split 64x64 over 3 warps: a compile error
        {"threads": 128, "tile": 0},   # the factory itself refuses it
    ]
    cache = kcache.KernelCache(cache_root)
    seen = []
    trials = compile_configs(tile_kernel, configs, target=CPU_TARGET, cache=cache, tune_identity="tile-test",
                             out_idx=[2], progress=seen.append)
    assert [t.status for t in trials] == [OK, OUT_OF_RESOURCES, COMPILE_ERROR, COMPILE_ERROR]
    assert len(seen) == 4 and trials[0].kernel is not None
    assert "Required: 2048, Hardware limit: 1024" in trials[1].message
    assert "warp" in trials[2].message.lower() and "tile=0" in trials[3].message
    compiles = cache.stats()["compiles"]
    assert compiles <= 2  # the out-of-resources and factory failures never reached the compiler

    again = compile_configs(tile_kernel, configs, target=CPU_TARGET, cache=kcache.KernelCache(cache_root),
                            tune_identity="tile-test", out_idx=[2])
    assert [t.status for t in again] == [OK, OUT_OF_RESOURCES, COMPILE_ERROR, COMPILE_ERROR]
    assert [t.remembered for t in again] == [False, True, True, True]  # skipped without compiling
    table = summary_table(again)
    assert "out_of_resources (remembered)" in table and '{"threads":128}' in table


def test_crashes_and_timeouts_through_the_pool_skip_one_config_and_retry_transient_ones(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KCACHE_TEST_ABORT_KERNEL", "tile_256_64")
    monkeypatch.setenv("KCACHE_TEST_HANG_KERNEL", "tile_128_128")
    configs = [{"threads": 128}, {"threads": 256}, {"threads": 128, "tile": 128}]
    with CompilePool(2, timeout_s=10.0, preload=(*TILELANG_PRELOAD, "tests.pool_jobs_faulty")) as pool:
        cache = kcache.KernelCache(cache_root, compile_pool=pool)
        trials = compile_configs(tile_kernel, configs, target=CPU_TARGET, cache=cache, tune_identity="faults",
                                 out_idx=[2])
    assert [t.status for t in trials] == [OK, COMPILER_CRASH, TIMEOUT]
    assert "SIGABRT" in trials[1].message and trials[1].attempts == 1  # a crash is not retried
    assert trials[2].attempts == 2  # a timeout is retried once


def _fake_profiler(calls: list):
    """Stands in for the GPU: a latency per config (threads 128 fastest). Records every call."""

    def measure(kernel, args):
        calls.append(kernel)
        return {"tile_128_64": 0.5, "tile_256_64": 0.8}.get(str(kernel.prim_func.attrs["global_symbol"]), 9.0)

    return measure


def test_a_tune_keeps_the_fastest_working_config_and_a_second_tune_compiles_nothing(cache_root: Path) -> None:
    import autotuner
    from autotuner.trials import OK

    configs = [{"threads": 256}, {"threads": 2048}, {"threads": 128}]
    calls: list = []
    cache = kcache.KernelCache(cache_root)
    result = autotuner.tune(tile_kernel, configs, inputs=[], target=CPU_TARGET, out_idx=[2], cache=cache,
                            profiler=_fake_profiler(calls), verbose=False)
    assert len(calls) == 2  # the two configs that compiled were timed
    assert result.config == {"threads": 128} and result.latency == 0.5
    assert [c.status for c in result.configs] == [OK, "out_of_resources", OK]
    assert result.kernel_key in cache.store.keys()

    again_cache = kcache.KernelCache(cache_root)
    again = autotuner.tune(tile_kernel, configs, inputs=[], target=CPU_TARGET, out_idx=[2], cache=again_cache,
                           profiler=_fake_profiler(calls), verbose=False)
    assert again.config == {"threads": 128} and len(calls) == 2  # loaded: nothing compiled or timed
    assert again_cache.stats()["compiles"] == 0 and again_cache.stats()["misses"] == 0
    kernel = again.load_kernel(again_cache)
    assert again_cache.stats()["disk_hits"] == 1 and kernel.prim_func.attrs["global_symbol"] == "tile_128_64"


def test_a_tune_where_no_config_works_fails_with_the_table_of_reasons(cache_root: Path) -> None:
    import autotuner

    with pytest.raises(autotuner.TuneFailed) as caught:
        autotuner.tune(tile_kernel, [{"threads": 2048}, {"threads": 96}], inputs=[], target=CPU_TARGET,
                       out_idx=[2], cache=kcache.KernelCache(cache_root), profiler=_fake_profiler([]), verbose=False)
    assert "out_of_resources" in caught.value.table and "compile_error" in caught.value.table


def test_the_autotune_decorator_tunes_once_per_key_and_returns_the_best_kernel(cache_root: Path) -> None:
    import autotuner

    calls: list = []
    cache = kcache.KernelCache(cache_root)

    @autotuner.autotune(configs=[{"threads": 256}, {"threads": 128}], key=["n"], inputs=[], target=CPU_TARGET,
                        out_idx=[2], cache=cache, profiler=_fake_profiler(calls), verbose=False)
    def tiled(n: int, threads: int = 128):
        return tile_kernel(threads, n=n)

    kernel = tiled(1024)
    assert str(kernel.prim_func.attrs["global_symbol"]) == "tile_128_64" and len(calls) == 2
    assert tiled(1024) is kernel and len(calls) == 2  # the same key: tuned once
    compiles = cache.stats()["compiles"]
    assert compiles == 2
    other = tiled(n=2048)  # another key value: another tune (the kernel names repeat; the keys do not)
    assert other is not kernel and len(calls) == 4 and cache.stats()["compiles"] == 4


def test_a_launch_refused_for_shared_memory_is_out_of_resources_and_remembered(cache_root: Path) -> None:
    """TVM's runtime words for a kernel whose dynamic shared memory the device refuses (the GPU test
    launches a real one); on CPU a profiler raises them where the launch would."""
    import autotuner
    from autotuner.identity import tune_identity

    refused: list = []

    def launch(kernel, args):
        if str(kernel.prim_func.attrs["global_symbol"]) == "tile_256_64":
            refused.append(kernel)
            raise RuntimeError("Failed to set the allowed dynamic shared memory size to 393216")
        return 0.5

    configs = [{"threads": 256}, {"threads": 128}]
    result = autotuner.tune(tile_kernel, configs, inputs=[], target=CPU_TARGET, out_idx=[2],
                            cache=kcache.KernelCache(cache_root), profiler=launch, verbose=False, tune_key="smem")
    assert len(refused) == 1 and result.config == {"threads": 128}
    outcome = result.configs[0]
    assert outcome.status == OUT_OF_RESOURCES
    assert outcome.message.startswith("out of resource: shared memory, Required: 393216, Hardware limit: ")
    # Deterministic: the next tune of the same configs skips it without compiling or launching it.
    again = kcache.KernelCache(cache_root)
    from kcache.results.device import current_device_identity

    identity = tune_identity(tile_kernel, configs, CPU_TARGET, [2], "smem", current_device_identity())
    trials = compile_configs(tile_kernel, configs, target=CPU_TARGET, cache=again, out_idx=[2], tune_identity=identity)
    assert trials[0].remembered and trials[0].status == OUT_OF_RESOURCES


def test_an_interpreter_error_in_the_factory_is_not_remembered_as_the_configs_failure(cache_root: Path) -> None:
    """CPython 3.11.7 raised "SystemError: AST constructor recursion depth mismatch" from TileLang's
    parser when two threads built kernels at once; that once filed a good config as a compile error
    for good. Such errors fail the trial of this run only."""
    calls = []

    def factory(x: int):
        calls.append(x)
        raise SystemError("AST constructor recursion depth mismatch (before=39, after=92)")

    for _ in range(2):
        (trial,) = compile_configs(factory, [{"x": 1}], target=CPU_TARGET, cache=kcache.KernelCache(cache_root),
                                   tune_identity="interpreter-error")
        assert trial.status == COMPILE_ERROR and "SystemError" in trial.message and not trial.remembered
    assert calls == [1, 1]  # asked again: nothing was remembered
