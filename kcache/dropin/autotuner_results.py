"""TileLang's AutoTuner results as kcache autotune entries, tuned once per job.

TileLang's `AutoTuner.run` looks for a saved result (`_load_result_from_disk`), tunes if there is
none, and saves what it found (`_save_result_to_disk`). Under `kcache.install()`:
- the result's name adds the identity of the device it is measured on to TileLang's key (which
  has none), so a result of one device model is a miss on another;
- a load that finds nothing takes the tune's claim (kcache.results.tune_once) before it says
  "none": the process that gets it tunes, and every other process of the job waits in its load
  and returns the winner's result, so all of them run the same config;
- `run` is wrapped so that the claim ends with the run, however it ends.
TileLang gives no key to tunes with a `ref_prog`, `supply_prog` or `manual_check_prog` (it never
caches them): those are not tuned once, as TileLang does not cache them at all.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
import time
from typing import Any

from kcache.dropin import state
from kcache.errors import KCacheError
from kcache.keys import canonical_json
from kcache.results.autotune import COMPONENTS, NAMESPACE, RESULT_FORMAT, AutotuneResult, result_path
from kcache.results.device import current_device_identity
from kcache.results.tune_once import RemoteResults, TuneOnce
from kcache.store import layout
from kcache.store.entries import EntryStore

log = logging.getLogger("kcache")

RESULT_PREFIX = "tl-"  # TileLang AutoTuner results under <root>/autotuner/, beside kcache's own
# The claims this thread holds, by tuner: taken in a load that found nothing, ended with the run.
_held = threading.local()


def result_name(key: str, device: dict[str, Any]) -> str:
    """The entry name of TileLang's result `key` measured on `device`."""
    return RESULT_PREFIX + hashlib.sha256(f"{key}\0{canonical_json(device)}".encode()).hexdigest()


def result_path_of(root: Any, key: str, device: dict[str, Any] | None = None) -> Any:
    return result_path(root, result_name(key, device if device is not None else current_device_identity()))


def save_result(tuner: Any, key: str, result: Any) -> None:
    """AutoTuner._save_result_to_disk: the result as a kcache autotune entry (staged, verified, one
    rename), uploaded to the remote tier by the claim's holder."""
    cache = state.cache()
    if cache.readonly:
        return
    compile_args = tuner.compile_args
    libpath = getattr(getattr(result.kernel, "adapter", None), "libpath", None)
    device = current_device_identity()
    saved = AutotuneResult(
        config=result.config, latency=result.latency, ref_latency=result.ref_latency, configs=[],
        kernel_key=os.path.basename(os.path.dirname(libpath)) if libpath else None,
        out_idx=_out_idx(result.func, compile_args.out_idx), target=str(compile_args.target), func=result.func,
        metadata={"source": "tilelang.autotuner.AutoTuner", "tilelang_key": key, "tuned": time.time(),
                  "device": device},
    )
    try:
        saved.save_to_disk(result_path_of(cache.root, key, device))
    except (KCacheError, OSError) as err:  # TileLang's own save logs and goes on; so does this one
        log.warning("kcache: could not save the autotune result %s: %s", key[:16], err)
        return
    once = _claims().get(id(tuner))
    if once is not None:
        once.upload()
        if cache.settings.remote_url and saved.kernel_key:
            cache.share(saved.kernel_key)  # the best kernel travels with its result


def load_result(tuner: Any, key: str) -> Any:
    """AutoTuner._load_result_from_disk: a saved result, its kernel a kcache hit; None if there is none,
    and this process has the claim to tune it (another process's tune of it is waited for)."""
    cache = state.cache()
    device = current_device_identity()
    name = result_name(key, device)

    def saved_result() -> AutotuneResult | None:
        return next((found for root in cache.read_roots
                     if (found := AutotuneResult.load_from_disk(result_path(root, name), device=device)) is not None),
                    None)

    saved = saved_result()
    claims = _claims()
    # Claimed only inside `run` (wrapped), which ends the claim: a load called by itself would hold it.
    if saved is None and not cache.readonly and claims.get(id(tuner), False) is None:
        once = _claim(cache, key, name, tuner, saved_result)
        saved = once.claim()
        if saved is None and once.held:
            claims[id(tuner)] = once
    if saved is None:
        return None
    return _as_tilelang_result(tuner, saved)


def wrap_run(run: Any) -> Any:
    """AutoTuner.run, ending the claim its load took (when it tuned) however the run ends."""

    @functools.wraps(run)
    def run_once(tuner: Any, *args: Any, **kwargs: Any) -> Any:
        claims = _claims()
        if id(tuner) in claims:  # a run inside a run of the same tuner: the outer one owns the claim
            return run(tuner, *args, **kwargs)
        claims[id(tuner)] = None  # in a run, no claim yet: its load may take one
        try:
            return run(tuner, *args, **kwargs)
        finally:
            once = claims.pop(id(tuner), None)
            if once is not None:
                once.release()

    run_once.__kcache_original__ = run  # type: ignore[attr-defined]
    return run_once


def _claims() -> dict[int, TuneOnce[AutotuneResult] | None]:
    """This thread's tuners in a run: the claim each one holds, or None while it holds none."""
    if not hasattr(_held, "claims"):
        _held.claims = {}
    claims: dict[int, TuneOnce[AutotuneResult] | None] = _held.claims
    return claims


def _claim(cache: Any, key: str, name: str, tuner: Any, saved_result: Any) -> TuneOnce[AutotuneResult]:
    store = EntryStore(cache.root / NAMESPACE, "", COMPONENTS, check_name=layout.check_entry_name)
    tier = cache.remote_tier_for(f"a{RESULT_FORMAT}", store.required) if cache.settings.remote_url else None
    label = f"{getattr(tuner.fn, '__module__', '?')}.{getattr(tuner.fn, '__qualname__', '?')} (TileLang key {key[:12]})"
    return TuneOnce(cache.root, name, label, load=saved_result, exists=result_path(cache.root, name).is_dir,
                    wait_s=cache.settings.tune_wait_s, lease_s=cache.settings.remote_lease_s,
                    remote=RemoteResults(tier, store, name) if tier is not None else None)


def _as_tilelang_result(tuner: Any, saved: AutotuneResult) -> Any:
    import tilelang
    from tilelang.autotuner.param import AutotuneResult as TileLangResult

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
