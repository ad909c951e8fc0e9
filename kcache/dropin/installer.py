"""Installing the drop-in into TileLang now (kcache.install()); as soon as TileLang is imported, kcache.dropin.on_import."""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

from kcache import helion as kcache_helion
from kcache import triton as kcache_triton
from kcache.cache.default import default_cache
from kcache.cache.kernel_cache import KernelCache
from kcache.dropin import autotuner_results, routing, state
from kcache.setting_values import check_settings
from kcache.tilelang import internals, support
from kcache.tilelang.installed import tilelang_installed
from kcache.triton import key_ahead

log = logging.getLogger("kcache")

_TUNER_METHODS = ("AutoTuner._save_result_to_disk", "AutoTuner._load_result_from_disk", "AutoTuner.run")


def install(cache: KernelCache | None = None) -> None:
    """Route TileLang's compiles and AutoTuner results through `cache` (default: kcache's default cache),
    and tune each AutoTuner key once per job (kcache.dropin.autotuner_results); Triton's kernels
    through kcache too (TRITON_CACHE_MANAGER, unless it names another manager: kcache.triton), and Helion's
    autotune picks (kcache.helion). Imports TileLang where it is installed. Calling it again changes the
    cache. Where TileLang is not installed (a Triton or Helion user's environment), Triton and Helion
    are routed and that is all: a program that then imports TileLang gets Python's own error for it.
    Where the installed TileLang is not one kcache supports (kcache/tilelang/support.py), TileLang is
    left as it is: every compile is plain TileLang's, and one warning says why and how to fix it.
    A bad KCACHE_* value raises SettingError, naming it, before anything is changed."""
    check_settings()
    if cache is None:
        # Open it now, as TileLang sets its own cache up at import: an unusable root raises here,
        # before anything is changed, and no compile pays for it. Before TileLang's import, which
        # follows: the open starts the compile service in the background (server mode), so that its
        # start overlaps that import when install() is the program's first kcache call.
        default_cache()
    # Triton's kernels (Inductor's too) on kcache's store, in this process and its children, unless
    # the user named a cache manager of their own. An environment variable: nothing of Triton is imported.
    triton_was_unset = kcache_triton.ENV not in os.environ
    if kcache_triton.enable():
        key_ahead.when_triton_imported()  # Triton's key of its installation, before its first compile
    # Helion's autotune picks too (kcache.helion), unless the user named a backend of their own.
    helion_was_unset = kcache_helion.BACKEND_ENV not in os.environ
    kcache_helion.enable()
    chosen = {"triton_was_unset": triton_was_unset, "helion_was_unset": helion_was_unset}
    if not tilelang_installed():  # nothing of TileLang's to route; Triton's and Helion's routes are set
        with state.lock:
            if state.passed_through is None:
                state.passed_through = chosen
        log.debug("kcache: installed for Triton and Helion (TileLang is not installed)")
        return
    unsupported = support.unsupported_reason()  # Triton's and Helion's routes above do not depend on it
    if unsupported is not None:
        support.warn_passing_through(unsupported)
        with state.lock:
            if state.passed_through is None:
                state.passed_through = chosen
        return
    jit_module: Any = importlib.import_module("tilelang.jit")  # `tilelang.jit` itself names the decorator
    from tilelang.autotuner.tuner import AutoTuner

    with state.lock:
        if state.installed is None:
            # A TileLang whose AutoTuner has other methods keeps its own results cache (internals.py).
            tuner = internals.has("tilelang.autotuner.tuner", *_TUNER_METHODS)
            state.installed = {
                "cached": jit_module.cached,
                **({"save": AutoTuner._save_result_to_disk, "load": AutoTuner._load_result_from_disk,
                    "run": AutoTuner.run} if tuner else {}),
                "triton_was_unset": triton_was_unset,  # uninstall() gives Triton its own cache back
                "helion_was_unset": helion_was_unset,
            }
        state.installed["cache"] = cache
        jit_module.cached = routing.cached
        if "run" in state.installed:
            AutoTuner._save_result_to_disk = autotuner_results.save_result
            AutoTuner._load_result_from_disk = autotuner_results.load_result
            AutoTuner.run = autotuner_results.wrap_run(state.installed["run"])  # the tune's claim ends with the run
    log.debug("kcache: installed into TileLang (tilelang.compile, @tilelang.jit, AutoTuner results)")


def uninstall() -> None:
    """Give TileLang its own cache back, and Triton its own where install() chose kcache's for it.
    Kernels already returned keep working."""
    with state.lock:
        if state.installed is None:
            chosen, state.passed_through = state.passed_through or {}, None  # TileLang was left alone
            _give_back_triton_and_helion(chosen)
            return
        from tilelang.autotuner.tuner import AutoTuner

        jit_module: Any = importlib.import_module("tilelang.jit")
        jit_module.cached = state.installed["cached"]
        if "run" in state.installed:
            AutoTuner._save_result_to_disk = state.installed["save"]
            AutoTuner._load_result_from_disk = state.installed["load"]
            AutoTuner.run = state.installed["run"]
        _give_back_triton_and_helion(state.installed)
        state.installed = None


def _give_back_triton_and_helion(chosen: dict[str, Any]) -> None:
    """Triton's and Helion's own caches back, where install() chose kcache's for them."""
    if chosen.get("triton_was_unset"):
        kcache_triton.disable()
    if chosen.get("helion_was_unset"):
        kcache_helion.disable()


def is_installed() -> bool:
    return state.installed is not None
