"""`tilelang.jit.cached` as kcache serves it: which calls kcache takes, and which go to TileLang unchanged."""

from __future__ import annotations

import logging
from typing import Any

from kcache.dropin import state

log = logging.getLogger("kcache")

_routes: dict[tuple[Any, ...], str] = {}  # call arguments -> "" (kcache serves it) or why TileLang does
_logged: set[str] = set()


def cached(func: Any = None, out_idx: Any = None, *args: Any, target: Any = None, target_host: Any = None,
            execution_backend: str | None = None, verbose: bool | None = None, pass_configs: dict | None = None,
            compile_flags: Any = None) -> Any:
    """tilelang.jit.cached, served by kcache where it can be."""
    installed = state.installed
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
    return state.cache().get_or_compile(func, _default_target(target), out_idx=out_idx, pass_configs=pass_configs,
                                   compile_flags=compile_flags, execution_backend="tvm_ffi")


def _route(target: Any, target_host: Any, execution_backend: str | None, verbose: bool | None, extra: bool) -> str:
    """"" when kcache serves a compile with these arguments, else why not (memoized)."""
    from kcache.tilelang.backend import target_memo_key

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

    from kcache.tilelang.backend import fast_backend_context

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
