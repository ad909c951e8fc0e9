"""`kcache.install()`: existing TileLang code gets kcache without a line changed.

TileLang 0.1.15 sends `tilelang.compile`, `tilelang.par_compile`, `@tilelang.jit` (eager and lazy)
and its AutoTuner's compiles through one function, `tilelang.jit.cached`, after merging a
PrimFunc's own out_idx, pass configs and compile flags into the arguments. Replacing that name
routes all of them through `KernelCache.get_or_compile`: compiles happen once across processes,
in the isolated pool, and land in kcache's root, not TileLang's. `@tilelang.jit`'s own per-call
memo sits above it, so a call with arguments already seen returns its kernel without building the
PrimFunc, as before. The AutoTuner's result cache (`_save_result_to_disk` / `_load_result_from_disk`)
is replaced by autotune entries of kcache's protocol. `uninstall()` puts TileLang's own back.

Calls kcache does not serve (another execution backend, a non-CUDA target, a target_host, verbose,
extra positional arguments) go to TileLang's `cached` unchanged, with one debug line per reason.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import os
import sys
import threading
import time
from typing import Any

from .cache import KernelCache
from .errors import KCacheError

log = logging.getLogger("kcache")

ENV = "KCACHE_TILELANG"
RESULT_PREFIX = "tl-"  # TileLang AutoTuner results under <root>/autotuner/, beside kcache's own

_lock = threading.Lock()
_installed: dict[str, Any] | None = None  # TileLang's originals while installed, and the cache
_routes: dict[tuple, str] = {}  # call arguments -> "" (kcache serves it) or why TileLang does
_logged: set[str] = set()


def install(cache: KernelCache | None = None) -> None:
    """Route TileLang's compiles and AutoTuner results through `cache` (default: kcache's default cache).
    Imports TileLang. Calling it again changes the cache."""
    global _installed
    jit_module = importlib.import_module("tilelang.jit")  # `tilelang.jit` itself names the decorator
    from tilelang.autotuner.tuner import AutoTuner

    if cache is None:
        import kcache

        # Open it now (its root, backend, toolchain identity), as TileLang sets its own cache up at
        # import: an unusable root raises here, before anything is changed, and no compile pays for it.
        kcache.default_cache()
    with _lock:
        if _installed is None:
            _installed = {
                "cached": jit_module.cached,
                "save": AutoTuner._save_result_to_disk,
                "load": AutoTuner._load_result_from_disk,
            }
        _installed["cache"] = cache
        jit_module.cached = _cached
        AutoTuner._save_result_to_disk = _save_result
        AutoTuner._load_result_from_disk = _load_result
    log.debug("kcache: installed into TileLang (tilelang.compile, @tilelang.jit, AutoTuner results)")


def uninstall() -> None:
    """Give TileLang its own cache back. Kernels already returned keep working."""
    global _installed
    with _lock:
        if _installed is None:
            return
        from tilelang.autotuner.tuner import AutoTuner

        importlib.import_module("tilelang.jit").cached = _installed["cached"]
        AutoTuner._save_result_to_disk = _installed["save"]
        AutoTuner._load_result_from_disk = _installed["load"]
        _installed = None


def is_installed() -> bool:
    return _installed is not None


def install_from_environment() -> None:
    """KCACHE_TILELANG=1 at `import kcache`: install now if TileLang is loaded, else as soon as it is
    (a process that never imports TileLang, such as the `kcache` CLI, never pays for it)."""
    from .config import _parse_flag

    raw = os.environ.get(ENV, "").strip()
    try:
        wanted = bool(raw) and _parse_flag(raw)
    except ValueError as err:
        raise ValueError(f"{ENV}={raw!r}: {err}") from None
    if not wanted:
        return
    if _LAST_PATCHED in sys.modules:
        install()
    elif not any(isinstance(finder, _InstallWhenImported) for finder in sys.meta_path):
        sys.meta_path.insert(0, _InstallWhenImported())


# The last module `install` patches: `import tilelang` loads tilelang.jit before it.
_LAST_PATCHED = "tilelang.autotuner.tuner"


class _InstallWhenImported(importlib.abc.MetaPathFinder):
    """A post-import hook: once TileLang's AutoTuner module has run, install."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _LAST_PATCHED:
            return None
        sys.meta_path.remove(self)  # one shot; and the real finders must answer the lookup below
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def run_then_install(module: Any) -> None:
            run_module(module)
            install()

        spec.loader.exec_module = run_then_install  # type: ignore[method-assign]
        return spec


def _cache() -> KernelCache:
    installed = _installed
    chosen = installed.get("cache") if installed is not None else None
    if chosen is not None:
        return chosen
    import kcache

    return kcache.default_cache()


def _cached(func: Any = None, out_idx: Any = None, *args: Any, target: Any = None, target_host: Any = None,
            execution_backend: str | None = None, verbose: bool | None = None, pass_configs: dict | None = None,
            compile_flags: Any = None) -> Any:
    """tilelang.jit.cached, served by kcache where it can be."""
    installed = _installed
    why = "kcache is not installed" if installed is None else _route(target, target_host, execution_backend, verbose,
                                                                     bool(args))
    if why:
        if why not in _logged:
            _logged.add(why)
            log.debug("kcache: passing a compile through to TileLang's own cache: %s", why)
        original = installed["cached"] if installed is not None else _tilelang_cached()
        return original(func, out_idx, *args, target=target, target_host=target_host,
                        execution_backend=execution_backend, verbose=verbose, pass_configs=pass_configs,
                        compile_flags=compile_flags)
    return _cache().get_or_compile(func, _default_target(target), out_idx=out_idx, pass_configs=pass_configs,
                                   compile_flags=compile_flags, execution_backend="tvm_ffi")


def _route(target: Any, target_host: Any, execution_backend: str | None, verbose: bool | None, extra: bool) -> str:
    """"" when kcache serves a compile with these arguments, else why not (memoized)."""
    from .tilelang_backend import target_memo_key

    memo = (target_memo_key(target), None if target_host is None else target_memo_key(target_host),
            execution_backend, bool(verbose), extra)
    found = _routes.get(memo)
    if found is not None:
        return found
    from tilelang import env

    if extra:
        why = "extra positional arguments"
    elif verbose or (verbose is None and env.get_default_verbose()):
        why = "verbose output asked for"
    else:
        why = _backend_route(_default_target(target), target_host,
                             execution_backend or env.get_default_execution_backend())
    _routes[memo] = why
    return why


def _backend_route(target: Any, target_host: Any, execution_backend: str) -> str:
    if execution_backend not in ("auto", "tvm_ffi"):
        return f"execution_backend={execution_backend!r} (kcache stores tvm_ffi kernels)"
    from tilelang.backend.module import create_backend_context
    from tvm.target import Target

    from .tilelang_backend import fast_backend_context

    try:
        context = fast_backend_context(target, execution_backend) or create_backend_context(target, None,
                                                                                             execution_backend)
        # TileLang's AutoTuner passes the resolved default host explicitly: that is no other host.
        other_host = target_host is not None and str(Target(target_host)) != str(context.target_host)
    except Exception as err:  # TileLang's own call will say what is wrong with the target, in its words
        return f"TileLang cannot resolve target {target!r}: {err}"
    if other_host:
        return f"target_host={target_host!r} (kcache builds for the default host, {context.target_host})"
    if context.execution_backend.name != "tvm_ffi":
        return f"execution backend resolves to {context.execution_backend.name!r}"
    if context.target.kind.name != "cuda":
        return f"target kind {context.target.kind.name!r} (kcache stores CUDA kernels)"
    return ""


def _default_target(target: Any) -> Any:
    if target is not None:
        return target
    from tilelang import env

    return env.get_default_target()


def _tilelang_cached() -> Any:
    from tilelang.cache import cached

    return cached


# ---------------------------------------------------------------- AutoTuner results


def _result_path(root: Any, key: str) -> Any:
    from autotuner import result_path

    return result_path(root, RESULT_PREFIX + key)


def _save_result(tuner: Any, key: str, result: Any) -> None:
    """AutoTuner._save_result_to_disk: the result as a kcache autotune entry (staged, verified, one rename)."""
    from autotuner import AutotuneResult

    cache = _cache()
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
        saved.save_to_disk(_result_path(cache.root, key))
    except (KCacheError, OSError) as err:  # TileLang's own save logs and goes on; so does this one
        log.warning("kcache: could not save the autotune result %s: %s", key[:16], err)


def _load_result(tuner: Any, key: str) -> Any:
    """AutoTuner._load_result_from_disk: a saved result, its kernel a kcache hit; None if there is none."""
    import tilelang
    from tilelang.autotuner.param import AutotuneResult as TileLangResult

    from autotuner import AutotuneResult

    cache = _cache()
    saved = next((found for root in cache.read_roots
                  if (found := AutotuneResult.load_from_disk(_result_path(root, key))) is not None), None)
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
