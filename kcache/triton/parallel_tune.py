"""`@triton.autotune`'s configs compiled at once, each in its own fork, when a tune first misses.

Triton's autotuner compiles a config when it first benchmarks it: one compile after another, in the
user's process. Under kcache's manager, the first compile of a tune that misses the cache is where the
tune's compiles begin: `get_group` finds, up its caller's stack, Triton's `Autotuner._bench` (the
config being benchmarked, the run's arguments) and `Autotuner.run` (the tune's pruned configs), both
checked by identity of their code. It then compiles every pruned config ahead, through Triton's own
`JITFunction.warmup` under Triton's `AsyncCompileMode`, on a thread pool as wide as the usable cores,
each compile's back half in a worker of the compile service (kcache.triton.isolation, which is asked
for as many warm workers as there are configs first), and goes on: the config asked for and
every later one are hits. Once per tune (per tuner and tuning key). A config that fails ahead is left
to its benchmark, which meets the same error (a crash remembered; a Python error raised by Triton's
compile in the caller, once: kcache.triton.failed_compiles) and skips it as Triton would. No tune on
the stack (a plain launch, Inductor, a warmup): nothing is done here.

Triton's launcher for the tune's kernel (a C extension that Triton builds with the C compiler in
this process when a kernel first loads: 0.3 s on the H200) is built meanwhile, from the source of the
compile that started the tune, beside the front halves; or, for a kernel that takes tensor
descriptors, by the first config to compile, beside the others' back halves
(kcache.triton.launcher_ahead). The benchmarks then load it from the cache.

Found on the stack rather than by patching Triton's classes: nothing of Triton's is changed, and the
first tune of a process that names the manager by TRITON_CACHE_MANAGER alone is covered too (Triton
loads the manager at its first compile, after that tune pruned its configs).
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Executor, ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from types import FrameType
from typing import Any

log = logging.getLogger("kcache")

_DONE = "_kcache_compiled_ahead"  # on a tuner: the tuning keys whose configs were compiled ahead
_lane = threading.local()  # `ahead` in the compile-ahead's pool threads


def in_ahead_lane() -> bool:
    """Whether this thread compiles a tune's configs ahead (its failures are left to the benchmarks)."""
    return getattr(_lane, "ahead", False)


def _enter_ahead_lane() -> None:
    _lane.ahead = True


def compile_tune_ahead(compile_frame: FrameType) -> bool:
    """Compile, at once, every config of the tune that the compile of `compile_frame` belongs to, if
    any and not done yet; whether it did."""
    tune = _tune_asking(compile_frame)
    if tune is None:
        return False
    tuner, args, meta, configs, key = tune
    done = tuner.__dict__.setdefault(_DONE, set())
    if key in done or len(configs) < 2:
        return False
    done.add(key)
    _compile_ahead(tuner, args, meta, configs, compile_frame.f_locals.get("src"))
    return True


def _tune_asking(frame: FrameType) -> tuple[Any, tuple, dict, list, Any] | None:
    """(tuner, the run's arguments, its keywords, the pruned configs, the tuning key) of the
    `Autotuner.run` up the stack from `frame` whose benchmark asks for this compile, or None."""
    autotuner = sys.modules.get("triton.runtime.autotuner")
    tuner_class = getattr(autotuner, "Autotuner", None)
    if tuner_class is None:
        return None
    bench_code, run_code = tuner_class._bench.__code__, tuner_class.run.__code__
    bench: dict[str, Any] | None = None
    current: FrameType | None = frame
    while current is not None:
        if bench is None and current.f_code is bench_code:
            bench = current.f_locals
        elif bench is not None and current.f_code is run_code and current.f_locals.get("self") is bench.get("self"):
            configs, key = current.f_locals.get("pruned_configs"), current.f_locals.get("key")
            if isinstance(configs, list) and key is not None:
                return bench["self"], tuple(bench.get("args", ())), dict(bench.get("meta", {})), configs, key
            return None
        current = current.f_back
    return None


def _compile_ahead(tuner: Any, args: tuple, meta: dict, configs: list, source: Any) -> None:
    """Each config's kernel for the run's arguments, compiled at once through Triton's warmup;
    `source`: the `ASTSource` of the compile that started the tune (its launcher's)."""
    from triton.runtime import _async_compile

    if _async_compile.active_mode.get() is not None:
        return  # the program compiles asynchronously itself
    options = {name: value for name, value in meta.items() if name not in ("grid", "warmup")}

    def warm(config: Any) -> None:
        try:
            tuner.fn.warmup(*args, grid=(1,), **options, **config.all_kwargs())
        except Exception as err:  # noqa: BLE001 - the benchmark meets it again, and decides
            log.debug("kcache: compiling %s ahead failed (%s: %s); the tune meets it", config, type(err).__name__, err)

    workers = max(1, min(len(configs), len(os.sched_getaffinity(0))))
    log.debug("kcache: compiling the %d configs of %s at once (%d at a time)", len(configs), tuner.fn, workers)
    from kcache.triton import launcher_ahead, shared_fronts
    from kcache.triton.isolation import warm_workers

    launcher = launcher_ahead.from_source(source)  # the C compiler's run, beside the front halves
    warm_workers(len(configs))  # the service forks its workers while the front halves run here
    try:
        with shared_fronts.sharing(), ThreadPoolExecutor(workers, thread_name_prefix="kcache-triton-tune",
                                                         initializer=_enter_ahead_lane) as pool:
            executor = pool if launcher is not None else launcher_ahead.LauncherAhead(pool, launcher_ahead.build_launcher)
            with compiling_at_once(executor):
                for config in configs:
                    warm(config)
    finally:
        if launcher is not None:  # the first benchmark loads it: built whole by then, never twice at once
            launcher.join(launcher_ahead.SOURCE_BUILD_WAIT_S)


@contextmanager
def compiling_at_once(executor: Executor) -> Iterator[Any]:
    """Triton's `AsyncCompileMode` over `executor`, whose compiles that fail are left to their benchmark:
    Triton's own `ignore_errors=True` (3.6 and later: those that compiled are finalized into the JIT's
    cache, the others cleaned up as that Triton does). Triton 3.5's mode has no `ignore_errors` and,
    ending, raises at the first failure and stays active in this thread; so there it is ended here:
    every compile waited for, those that compiled finalized (3.5 leaves nothing behind of the others)."""
    from triton.runtime import _async_compile

    if "ignore_errors" in inspect.signature(_async_compile.AsyncCompileMode).parameters:
        with _async_compile.AsyncCompileMode(executor, ignore_errors=True) as mode:
            yield mode
        return
    mode = _async_compile.AsyncCompileMode(executor)
    mode.__enter__()
    try:
        yield mode
    finally:
        try:
            for future in as_completed(mode.raw_futures):
                if future.exception() is None:
                    mode.future_kernels[future._key].result()
        finally:
            _async_compile.active_mode.set(None)
