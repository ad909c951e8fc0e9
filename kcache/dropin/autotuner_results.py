"""TileLang's AutoTuner results as kcache autotune entries (its `_save_result_to_disk` / `_load_result_from_disk`)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from kcache.dropin import state
from kcache.errors import KCacheError
from kcache.results.autotune import AutotuneResult, result_path

log = logging.getLogger("kcache")

RESULT_PREFIX = "tl-"  # TileLang AutoTuner results under <root>/autotuner/, beside kcache's own


def result_path_of(root: Any, key: str) -> Any:
    return result_path(root, RESULT_PREFIX + key)


def save_result(tuner: Any, key: str, result: Any) -> None:
    """AutoTuner._save_result_to_disk: the result as a kcache autotune entry (staged, verified, one rename)."""
    cache = state.cache()
    if cache.readonly:
        return
    compile_args = tuner.compile_args
    libpath = getattr(getattr(result.kernel, "adapter", None), "libpath", None)
    saved = AutotuneResult(
        config=result.config, latency=result.latency, ref_latency=result.ref_latency, configs=[],
        kernel_key=os.path.basename(os.path.dirname(libpath)) if libpath else None,
        out_idx=_out_idx(result.func, compile_args.out_idx), target=str(compile_args.target), func=result.func,
        metadata={"source": "tilelang.autotuner.AutoTuner", "tilelang_key": key, "tuned": time.time()},
    )
    try:
        saved.save_to_disk(result_path_of(cache.root, key))
    except (KCacheError, OSError) as err:  # TileLang's own save logs and goes on; so does this one
        log.warning("kcache: could not save the autotune result %s: %s", key[:16], err)


def load_result(tuner: Any, key: str) -> Any:
    """AutoTuner._load_result_from_disk: a saved result, its kernel a kcache hit; None if there is none."""
    import tilelang
    from tilelang.autotuner.param import AutotuneResult as TileLangResult

    cache = state.cache()
    saved = next((found for root in cache.read_roots
                  if (found := AutotuneResult.load_from_disk(result_path_of(root, key))) is not None), None)
    if saved is None:
        return None
    args = tuner.compile_args
    # Through tilelang.compile, as TileLang's own load does: a kcache disk hit (the tune compiled it).
    kernel = tilelang.compile(saved.func, out_idx=None if _declares_outputs(saved.func) else args.out_idx,
                              execution_backend=args.execution_backend, target=args.target,
                              target_host=args.target_host, verbose=args.verbose, pass_configs=args.pass_configs)
    kernel.update_tuner_result(config=saved.config, latency=saved.latency, ref_latency=saved.ref_latency)
    return TileLangResult(config=saved.config, func=saved.func, kernel=kernel, libcode=kernel.get_kernel_source(),
                          latency=saved.latency, ref_latency=saved.ref_latency)


def _declares_outputs(func: Any) -> bool:
    attrs = getattr(func, "attrs", None)
    return bool(attrs) and "tilelang_out_idx" in attrs


def _out_idx(func: Any, default: Any) -> Any:
    if _declares_outputs(func):
        return [int(i) for i in func.attrs["tilelang_out_idx"]]
    if default is None or isinstance(default, int):
        return default
    return list(default)
