"""`@triton.autotune`'s configs compiled at once, each in its own fork, when a tune starts.

Triton's autotuner compiles a config when it first benchmarks it: one compile after another, in the
user's process. Where kcache's manager is in force (and with it the forks of kcache.triton.isolation),
kcache wraps `Autotuner.prune_configs`, which Triton calls exactly when a tune starts (and from
`Autotuner.warmup`): once the configs are pruned, each is compiled ahead through Triton's own
`JITFunction.warmup` under Triton's `AsyncCompileMode`, on a thread pool as wide as the usable cores,
each compile a fork. Triton then benchmarks them as hits of its in-memory cache. A config that fails
ahead is left to the benchmark, which meets the same error (a crash remembered, a Python error) and
skips it as it would have.

The first config compiles alone, before the others: it loads whatever Triton imports lazily while
compiling, so that no fork starts while another thread of this process holds an import's lock.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("kcache")

_MARK = "_kcache_parallel_compiles"


def install() -> None:
    """Wrap Triton's `Autotuner.prune_configs` (once; Triton's autotuner module must be importable)."""
    from triton.runtime.autotuner import Autotuner

    original = Autotuner.prune_configs
    if getattr(original, _MARK, False):
        return

    def prune_configs(self: Any, kwargs: dict) -> list:
        configs = original(self, kwargs)
        if len(configs) > 1 and _in_force():
            compile_ahead(self, configs, kwargs)
        return configs

    setattr(prune_configs, _MARK, True)
    prune_configs.__wrapped__ = original  # type: ignore[attr-defined]
    Autotuner.prune_configs = prune_configs


def install_quietly() -> None:
    """`install`, never a failure of the import that triggered it (tunes then compile one config
    after another, as in plain Triton)."""
    try:
        install()
    except Exception as err:  # noqa: BLE001
        log.debug("kcache: not compiling tunes ahead: %s: %s", type(err).__name__, err)


def _in_force() -> bool:
    """kcache's manager is Triton's (whichever value of TRITON_CACHE_MANAGER named it), and compiles
    that miss go to forks."""
    from triton import knobs

    from kcache.triton import isolation

    manager = knobs.cache.manager_class
    return getattr(manager, "__module__", None) == "kcache.triton.manager" and isolation.lane() == "fork"


def compile_ahead(tuner: Any, configs: list, kwargs: dict) -> None:
    """Compile each config of `tuner` for the arguments of the run that prunes them, in parallel."""
    from concurrent.futures import ThreadPoolExecutor

    from triton.runtime import _async_compile

    if tuner.nargs is None or _async_compile.active_mode.get() is not None:
        return  # not from a run (no arguments to specialize on), or the caller compiles async itself
    args = [tuner.nargs[name] for name in tuner.arg_names if name in tuner.nargs]
    # The run's own keywords, less how it launches (a warmup compiles, and launches nothing)
    options = {name: value for name, value in kwargs.items() if name not in ("grid", "warmup")}

    def warm(config: Any) -> None:
        try:
            tuner.fn.warmup(*args, grid=(1,), **options, **config.all_kwargs())
        except Exception as err:  # noqa: BLE001 - the benchmark meets it again, and decides
            log.debug("kcache: compiling %s ahead failed (%s: %s); the tune meets it", config, type(err).__name__, err)

    warm(configs[0])
    workers = max(1, min(len(configs) - 1, len(os.sched_getaffinity(0))))
    with ThreadPoolExecutor(workers, thread_name_prefix="kcache-triton-tune") as pool:
        with _async_compile.AsyncCompileMode(pool, ignore_errors=True):
            for config in configs[1:]:
                warm(config)
