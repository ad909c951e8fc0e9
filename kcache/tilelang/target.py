"""Targets as TileLang resolves them, made cheaply and memoized per process."""

from __future__ import annotations

import tilelang  # noqa: F401 - puts TileLang's tvm on the path
from tilelang.backend.module import BackendContext, create_backend_context
from tvm import runtime
from tvm.target import Target
from tvm.target import _ffi_api as _target_ffi

from kcache.errors import TargetError
from kcache.keys import canonical_json

SUPPORTED_EXECUTION_BACKENDS = ("tvm_ffi",)
_ARCH_FIX = 'pass an explicit arch, e.g. target={"kind": "cuda", "arch": "sm_90a"}'


class ResolvedTarget:
    # A plain class: @dataclass costs ~1 ms of import time, paid by every fresh-process hit.
    __slots__ = ("context", "canonical")

    def __init__(self, context: BackendContext, canonical: str) -> None:
        self.context = context
        # Canonical JSON of the TVM target, arch included: what the key uses.
        self.canonical = canonical


# ---------------------------------------------------------------- targets

_target_memo: dict[tuple[str, str], ResolvedTarget] = {}


def target_memo_key(target: object) -> str:
    """A cheap, hashable stand-in for a target argument (dicts are unhashable)."""
    if isinstance(target, dict):
        return "d:" + canonical_json(target)
    if isinstance(target, Target):
        return "t:" + str(target)
    return "s:" + repr(target)


def _names_arch(target: object) -> bool:
    if isinstance(target, dict):
        return "arch" in target
    if isinstance(target, Target):
        return "arch" in target.attrs
    return False


def _gpu_present() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def resolve_target(target: object, execution_backend: str, memo_key_str: str | None = None) -> ResolvedTarget:
    memo_key = (target_memo_key(target) if memo_key_str is None else memo_key_str, execution_backend)
    resolved = _target_memo.get(memo_key)
    if resolved is not None:
        return resolved
    if execution_backend not in SUPPORTED_EXECUTION_BACKENDS:
        raise ValueError(
            f"execution_backend={execution_backend!r} is not supported by kcache; use one of {SUPPORTED_EXECUTION_BACKENDS}"
        )
    request = "cuda" if target is None else target
    if not _names_arch(request) and not _gpu_present():
        raise TargetError(target, "no GPU is visible and the target names no arch", _ARCH_FIX)
    try:
        context = fast_backend_context(request, execution_backend)
        if context is None:
            context = create_backend_context(request, None, execution_backend)
    except (ValueError, AssertionError, RuntimeError) as err:
        raise TargetError(target, f"TileLang rejected it: {err}", _ARCH_FIX) from err
    resolved = ResolvedTarget(context=context, canonical=str(context.target))
    _target_memo[memo_key] = resolved
    return resolved


def fast_backend_context(request: object, execution_backend: str) -> BackendContext | None:
    """create_backend_context(request, None, execution_backend) for a target dict, with Target objects
    made through the FFI; None for other requests (call create_backend_context).

    `Target(dict)` and `Target("llvm")` run `tvm_ffi.convert`, whose
    `isinstance(value, tvm_ffi.core.Object)` walks all ~500 subclasses of that
    ABC the first time a process checks a dict (then a str): ~1-2 ms each.
    The FFI converts a dict to a Map in Cython without any ABC check, and
    TileLang's normalizers treat Target(d) exactly as they treat d for every
    kind the FFI accepts ("cutedsl" is no TVM kind, so it takes the slow path).
    """
    if type(request) is not dict:
        return None
    try:
        target = _target_ffi.Target(request)
    except Exception:  # let TileLang produce its own error (or normalize a non-TVM kind)
        return None
    # create_backend_context's own default host, built the same way.
    host = _target_ffi.Target("llvm" if runtime.enabled("llvm") else "c")
    return create_backend_context(target, host, execution_backend)
