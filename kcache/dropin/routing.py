"""`tilelang.jit.cached` as kcache serves it: which calls kcache takes, and which go to TileLang unchanged."""

from __future__ import annotations

import inspect
import logging
import sys
from typing import Any

from kcache.cache.request import JIT_CALL
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
    token = JIT_CALL.set(_jit_call(sys._getframe(1)))  # the @tilelang.jit call, if one asks: `ls` names it
    try:
        return state.cache().get_or_compile(func, _default_target(target), out_idx=out_idx, pass_configs=pass_configs,
                                            compile_flags=compile_flags, execution_backend="tvm_ffi")
    finally:
        JIT_CALL.reset(token)


_JIT_DEPTH = 6  # tilelang.jit's compile -> JITImpl.compile, with room for a wrapper or two


def _jit_call(frame: Any) -> dict[str, str] | None:
    """The @tilelang.jit call up the stack from `frame` (TileLang's JITImpl.compile, checked by identity of
    its code): the decorated function's name and the arguments it was called with, else None."""
    jit_class = getattr(sys.modules.get("tilelang.jit"), "JITImpl", None)
    code = getattr(getattr(jit_class, "compile", None), "__code__", None)
    for _ in range(_JIT_DEPTH):
        if frame is None or code is None:
            return None
        if frame.f_code is code:
            return _described_call(frame.f_locals)
        frame = frame.f_back
    return None


def _described_call(local: dict[str, Any]) -> dict[str, str] | None:
    function = getattr(local.get("self"), "func", None)
    function = getattr(function, "orig_func", function)  # an eager-mode JITFunc wraps the user's function
    name = getattr(function, "__name__", None)
    if not isinstance(name, str):
        return None
    try:
        bound = inspect.signature(function).bind_partial(*local.get("args", ()), **local.get("kwargs", {})).arguments
    except (TypeError, ValueError):
        bound = {f"arg{index}": value for index, value in enumerate(local.get("args", ()))}
    shown = ", ".join(f"{arg}={_shown(value)}" for arg, value in bound.items())
    return {"name": name, "args": shown[:500]}


def _shown(value: Any) -> str:
    """A plain value as written; anything else (a tensor) as its type: a row of `ls`, not a dump."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value) if isinstance(value, str) else str(value)
    if isinstance(value, (tuple, list)) and len(value) <= 8:
        return "(" + ", ".join(_shown(item) for item in value) + ")"
    return type(value).__name__


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
