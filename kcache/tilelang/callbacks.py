"""TileLang's compile callbacks, seen from kcache: which are registered, what they are, how they travel.

TileLang keeps a post-processing callback (`register_cuda_postproc_callback`, `register_c_postproc`)
only as an FFI function in TVM's global registry: the Python function behind it cannot be read back.
So kcache watches registrations (`watch_registrations`, which wraps `tvm_ffi.core._register_global_func`,
the one call every Python registration goes through) and remembers the Python function of each
watched name by the FFI handle it got. At a compile, the registry's current handle for each watched
name says which function is in force:
- one kcache saw registered: it is fingerprinted (its code, closure, defaults and the constants it
  reads) for the key. It never leaves the caller: a compile worker calls it back in the caller
  (`kcache.compile.caller_calls`), so its side effects happen where plain TileLang's would;
- one registered before kcache watched, through C++, or whose closure cannot be pickled (so cannot
  be fingerprinted): "opaque". Its effect cannot be keyed, so such a compile runs in the caller's
  process and is not stored on disk (docs/design/key.md, "The compile context").

This module imports nothing of TileLang at import time: the facade may load it to start watching.
"""

from __future__ import annotations

import hashlib
import threading
import types
from collections.abc import Callable
from typing import Any

# The callbacks that change what a CUDA compile produces: the device source before nvcc, the host
# wrapper before it is built. (The nvcc callback itself is TileLang's, wrapped by kcache's compiler.)
DEVICE_CALLBACK = "tilelang_callback_cuda_postproc"
HOST_CALLBACK = "tilelang_callback_c_host_postproc"
WATCHED = (DEVICE_CALLBACK, HOST_CALLBACK)


class Callback:
    """A registered callback in force at a compile: its name, its fingerprint for the key, and the
    function to call in the caller (`function`: never pickled, so None in a worker; `opaque` says why
    it cannot be keyed, when it cannot)."""

    __slots__ = ("name", "fingerprint", "function", "opaque")

    def __init__(self, name: str, fingerprint: str, function: Callable[..., Any] | None, opaque: str = "") -> None:
        self.name = name
        self.fingerprint = fingerprint
        self.function = function
        self.opaque = opaque

    def __reduce__(self) -> tuple:
        return (Callback, (self.name, self.fingerprint, None, self.opaque))  # the function stays here


_lock = threading.Lock()
_watching = False
# FFI handle -> (the FFI function, kept alive so that its handle is never reused; the Python
# function, or None when kcache did not see it registered).
_seen: dict[int, tuple[Any, Callable[..., Any] | None]] = {}
# FFI handle -> its Callback (fingerprinted once per registration).
_described: dict[int, Callback] = {}


def watch_registrations() -> None:
    """Start remembering the Python function of every watched registration (idempotent). Callbacks
    registered earlier are recorded as opaque."""
    global _watching
    with _lock:
        if _watching:
            return
        import tvm_ffi
        from tvm_ffi import core

        original = getattr(core, "_register_global_func", None)
        if original is None:
            # A TVM-FFI that registers otherwise (kcache/tilelang/internals.py): nothing is watched, so
            # every callback in force is opaque, and a compile with one runs in the caller, unstored.
            _watching = True
            return

        def register_global_func(name: str, function: Any, override: bool) -> Any:
            result = original(name, function, override)
            if name in WATCHED:
                registered = tvm_ffi.get_global_func(name, allow_missing=True)
                if registered is not None:
                    with _lock:
                        _seen[registered.__chandle__()] = (registered, function if callable(function) else None)
            return result

        core._register_global_func = register_global_func
        for name in WATCHED:  # registered before kcache watched: their Python functions are out of reach
            registered = tvm_ffi.get_global_func(name, allow_missing=True)
            if registered is not None:
                _seen.setdefault(registered.__chandle__(), (registered, None))
        _watching = True


_get_global_func: Callable[..., Any] | None = None


def handles() -> tuple[int, ...]:
    """The FFI handles of the watched callbacks in force (0 for none): cheap (~0.4 us), for the
    memory tier's key. A handle is never reused for another function: kcache keeps each one it saw
    alive."""
    global _get_global_func
    if _get_global_func is None:
        import tvm_ffi

        _get_global_func = tvm_ffi.get_global_func
    cuda = _get_global_func(DEVICE_CALLBACK, allow_missing=True)
    host = _get_global_func(HOST_CALLBACK, allow_missing=True)
    if cuda is None and host is None:
        return (0, 0)
    return (_handle(cuda), _handle(host))


def _handle(registered: Any) -> int:
    if registered is None:
        return 0
    handle: int = registered.__chandle__()
    if handle not in _seen:
        with _lock:
            _seen.setdefault(handle, (registered, None))
    return handle


def in_force() -> tuple[Callback, ...]:
    """The watched callbacks registered now, described (fingerprint, payload or why opaque)."""
    import tvm_ffi

    described = []
    for name in WATCHED:
        registered = tvm_ffi.get_global_func(name, allow_missing=True)
        if registered is None:
            continue
        handle = registered.__chandle__()
        callback = _described.get(handle)
        if callback is None:
            with _lock:
                _registered, function = _seen.setdefault(handle, (registered, None))
            callback = _described[handle] = _describe(name, handle, function)
        described.append(callback)
    return tuple(described)


def _describe(name: str, handle: int, function: Callable[..., Any] | None) -> Callback:
    registered = _seen[handle][0]
    if function is None:
        return Callback(name, f"opaque:{handle}", registered,
                        f"{name} was registered before kcache started watching (import kcache, or open the cache, "
                        "before registering it) or through the FFI alone, so its Python function is out of reach")
    try:
        fingerprint = fingerprint_of(function)
    except Exception as err:  # an unpicklable closure value, say: it cannot be keyed
        return Callback(name, f"opaque:{handle}", function,
                        f"{name} ({getattr(function, '__qualname__', function)!r}) cannot be fingerprinted: "
                        f"{type(err).__name__}: {err}")
    return Callback(name, fingerprint, function)


def fingerprint_of(function: Callable[..., Any]) -> str:
    """What the callback computes, as a digest: for a Python function its bytecode, constants and
    names (recursively for nested functions and the functions it calls by global name), its closure,
    defaults and the simple constants it reads from its globals; for any other callable its pickle.
    Not its file name or line numbers: moving a callback within its file is a hit.
    Raises if a value cannot be pickled."""
    import cloudpickle

    digest = hashlib.sha256()
    _feed_callable(function, digest, cloudpickle.dumps, set())
    return digest.hexdigest()


_SIMPLE = (str, bytes, int, float, bool, type(None), tuple, frozenset)


def _feed_callable(function: Any, digest: Any, dumps: Callable[[Any], bytes], visiting: set[int]) -> None:
    if id(function) in visiting:
        return
    visiting.add(id(function))
    if not isinstance(function, types.FunctionType):
        digest.update(b"pickle:" + dumps(function))
        return
    code = function.__code__
    _feed_code(code, digest)
    cells = [cell.cell_contents for cell in function.__closure__ or ()]
    digest.update(dumps((cells, function.__defaults__, function.__kwdefaults__)))
    scope = function.__globals__
    for name in sorted(_global_names(code)):
        if name not in scope:
            continue
        value = scope[name]
        digest.update(b"global:" + name.encode())
        if isinstance(value, types.FunctionType):
            _feed_callable(value, digest, dumps, visiting)
        elif isinstance(value, _SIMPLE):
            digest.update(dumps(value))


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _feed_code(code: types.CodeType, digest: Any) -> None:
    digest.update(code.co_code)
    digest.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars, code.co_argcount,
                        code.co_kwonlyargcount, code.co_flags)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _feed_code(const, digest)
        elif isinstance(const, frozenset):  # its order follows string hashing, which differs per process
            digest.update(repr(sorted(map(repr, const))).encode())
        else:
            digest.update(repr((type(const).__name__, const)).encode())
