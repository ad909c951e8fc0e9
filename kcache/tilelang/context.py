"""The compile context: what a TileLang compile depends on besides its arguments, taken in the caller.

A compile may run in the caller (`inprocess`), in a pool worker started earlier, or (next) in a
service started by another process with another environment. So everything the output depends on
that is not an argument is read in the caller at the time of the call, travels with the job, and is
applied around the compile wherever it runs. What changes the output also enters the key; the rest
only travels. The inventory, with the reason for each item and what is left out, is in
docs/design/key.md ("The compile context"); the target part (`Target` scopes, TILELANG_DEFAULT_TARGET)
is resolved in `kcache.tilelang.target` into the resolved target, which the key already holds.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from kcache.tilelang import callbacks, internals
from kcache.tilelang.callbacks import Callback

log = logging.getLogger("kcache")

# Read at every compile (by nvcc, the host compiler or TileLang) and able to change the output:
# in the key, and applied around the compile.
KEYED_ENV = (
    "NVCC_APPEND_FLAGS",  # nvcc appends these to every command line (-lineinfo, -G, -D...)
    "NVCC_PREPEND_FLAGS",
    "CXX",  # TileLang's -ccbin for nvcc and the compiler of the host library
    "CC",
    "CPATH",  # header search of the host compiler nvcc drives
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "TILELANG_ENABLE_DATA_RACE_CHECK",  # adds a verification pass that can refuse a kernel
)
# Read at every compile, never changing a successful output: applied, not keyed.
CARRIED_ENV = (
    "TILELANG_COMPILE_TIMEOUT_SECONDS",  # the caller's nvcc timeout, not the worker's at its start
    "TILELANG_VERBOSE",  # nvcc's verbosity (TileLang's nvcc callback reads it, not compile(verbose=))
    # Enters the key through the pass configs (normalize_pass_configs in the caller); carried so that
    # a worker whose environment sets it does not add it to a caller's compile that had none.
    "TILELANG_LAYOUT_COST_MODEL",
)
_ENV = KEYED_ENV + CARRIED_ENV
# The memory tier's token covers what the key covers: KEYED_ENV, and TILELANG_LAYOUT_COST_MODEL,
# which the key holds through the pass configs.
_TOKEN_RAW = tuple(name.encode() for name in (*KEYED_ENV, "TILELANG_LAYOUT_COST_MODEL"))
_TOKEN_ENV = (*KEYED_ENV, "TILELANG_LAYOUT_COST_MODEL")
# os.environ's backing dict: ~0.04 us a lookup against ~0.9 us through os.environ.get (which encodes
# the name every time); the memory tier reads these on every hit.
_raw_environ: Any = getattr(os.environ, "_data", None)


class CompileContext:
    """What one compile carries besides its arguments: the environment of KEYED_ENV and CARRIED_ENV
    (None: unset) and the watched callbacks in force. Picklable; made by `capture()`."""

    __slots__ = ("env", "callbacks")

    def __init__(self, env: tuple[tuple[str, str | None], ...], in_force: tuple[Callback, ...]) -> None:
        self.env = env
        self.callbacks = in_force

    def __reduce__(self) -> tuple:
        return (CompileContext, (self.env, self.callbacks))

    @property
    def opaque(self) -> str:
        """Why this context cannot be keyed or sent to a worker ("" when it can)."""
        return "; ".join(c.opaque for c in self.callbacks if c.opaque)

    def key_part(self) -> dict[str, object] | None:
        """The part of the key that the context adds; None for the plain context (every key made
        before the context existed stays valid)."""
        keyed = {name: value for name, value in self.env if name in KEYED_ENV and value is not None}
        hooks = {c.name: c.fingerprint for c in self.callbacks}
        if not keyed and not hooks:
            return None
        return {"env": keyed, "callbacks": hooks}


def token() -> tuple[object, ...]:
    """A cheap stand-in for the context's part of the key, for the memory tier: the raw values of the
    environment the key depends on and the handles of the callbacks in force. About 1 us."""
    if _raw_environ is not None:
        return (*map(_raw_environ.get, _TOKEN_RAW), *callbacks.handles())
    return (*map(os.environ.get, _TOKEN_ENV), *callbacks.handles())


def capture() -> CompileContext:
    """The caller's compile context, now."""
    return CompileContext(tuple((name, os.environ.get(name)) for name in _ENV), callbacks.in_force())


# ---------------------------------------------------------------- applying it where the compile runs

_last_host_compiler: tuple[str | None, str | None] | None = None


@contextlib.contextmanager
def applied(context: CompileContext | None, *, register_callbacks: bool) -> Iterator[None]:
    """Run a compile under `context`: its environment set (and restored after), TileLang's memo of
    the host compiler dropped when CXX/CC changed since the last compile of this process (TileLang
    keeps the first one it found for the life of the process; a fresh TileLang process would use
    the new one), and, in a worker (`register_callbacks`), the caller's callbacks registered in place
    of whatever is there (restored after). In the caller itself the callbacks are already in force."""
    if context is None:
        yield
        return
    saved = {name: os.environ.get(name) for name, _ in context.env}
    for name, value in context.env:
        _set_env(name, value)
    _refresh_host_compiler()
    restore = _register(context.callbacks) if register_callbacks else None
    try:
        yield
    finally:
        if restore is not None:
            restore()
        for name, value in saved.items():
            _set_env(name, value)


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _refresh_host_compiler() -> None:
    global _last_host_compiler
    now = (os.environ.get("CXX"), os.environ.get("CC"))
    if _last_host_compiler is not None and now != _last_host_compiler:
        # TileLang memoizes its host compiler; one that does not has nothing to clear (internals.py).
        clear = getattr(internals.lookup("tilelang.contrib.cc", "get_cplus_compiler"), "cache_clear", None)
        if clear is not None:
            clear()
    _last_host_compiler = now


def _register(in_force: tuple[Callback, ...]) -> Any:
    """In a worker: register, in place of the caller's callbacks, functions that call them back in
    the caller (`worker.call_caller`); unregister watched ones the caller has not. Return the function
    that puts back what was there. No user function is ever unpickled here."""
    import tvm_ffi

    previous = {name: tvm_ffi.get_global_func(name, allow_missing=True) for name in callbacks.WATCHED}
    wanted = {c.name for c in in_force}
    for name in callbacks.WATCHED:
        if name in wanted:
            tvm_ffi.register_global_func(name, _in_caller(name), override=True)
        elif previous[name] is not None:
            tvm_ffi.remove_global_func(name)

    def restore() -> None:
        for name, function in previous.items():
            if function is not None:
                tvm_ffi.register_global_func(name, function, override=True)
            elif tvm_ffi.get_global_func(name, allow_missing=True) is not None:
                tvm_ffi.remove_global_func(name)

    return restore


def _in_caller(name: str) -> Any:
    def call_in_caller(*args: Any) -> Any:
        from kcache.compile.workers.worker import call_caller

        return call_caller(name, args)

    return call_in_caller


def caller_functions(context: CompileContext | None) -> dict[str, Any]:
    """The caller's callbacks of `context` by name: what a worker may call back (`_in_caller`)."""
    if context is None:
        return {}
    return {c.name: c.function for c in context.callbacks if c.function is not None}
