"""Targets as TileLang resolves them, made cheaply and memoized per process."""

from __future__ import annotations

import json
import os
import re

import tilelang  # noqa: F401 - puts TileLang's tvm on the path
from tilelang.backend.module import BackendContext, create_backend_context
from tvm import runtime
from tvm.target import Target, list_tags
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
# Handle -> (the Target, its text): str(Target) costs ~1 us, and the memory tier asks on every hit.
# The Target is kept so that its handle is never reused for another one.
_target_text: dict[int, tuple[Target, str]] = {}
# Sorted items of a flat target dict -> its memo key text (canonical_json costs ~2.5 us a call).
_dict_text: dict[tuple[tuple[object, type, object], ...], str] = {}
# Raw TILELANG_DEFAULT_TARGET -> what TileLang parses it to.
_default_targets: dict[object, object] = {}


def requested_target(target: object) -> object:
    """What TileLang resolves `target` from at this call (tilelang.cache._resolve_cache_dispatch and
    determine_target): None means TILELANG_DEFAULT_TARGET (default "auto"); "auto" means the enclosing
    `with Target(...)` scope when there is one, else the device. An explicit target ignores any scope
    (TileLang compiles inside `with target:`)."""
    if target is None:
        target = _default_target()
    if isinstance(target, str) and target == "auto":
        current = Target.current(allow_none=True)
        if current is not None:
            return current
    return target


def _default_target() -> object:
    from tilelang import env

    variable = type(env).__dict__.get("TILELANG_DEFAULT_TARGET")
    forced = getattr(variable, "_forced_value", None)
    raw = forced if forced is not None else os.environ.get("TILELANG_DEFAULT_TARGET")
    if isinstance(raw, dict):
        return env.get_default_target()
    found = _default_targets.get(raw)
    if found is None:
        found = _default_targets[raw] = env.get_default_target()
    return found


def target_memo_key(target: object) -> str:
    """A cheap, hashable stand-in for a target argument as resolved at this call (dicts are
    unhashable; None and "auto" depend on the environment and the enclosing Target scope)."""
    if target is None or (isinstance(target, str) and target == "auto"):
        target = requested_target(target)
    if isinstance(target, dict):
        try:  # a flat dict of plain values (the usual {"kind": ..., "arch": ...}): memoized by its items
            # With each value's type: True == 1 and 1 == 1.0, but they are different targets.
            items = tuple([(name, value.__class__, value) for name, value in sorted(target.items())])
            text = _dict_text.get(items)
        except TypeError:  # nested or unhashable values
            return "d:" + canonical_json(target)
        if text is None:
            text = _dict_text[items] = "d:" + canonical_json(target)
        return text
    if isinstance(target, Target):
        handle = target.__chandle__()
        known = _target_text.get(handle)
        if known is None:
            known = _target_text[handle] = (target, "t:" + str(target))
        return known[1]
    return "s:" + repr(target)


_ACCEPTED_FORMS = ('a dict such as {"kind": "cuda", "arch": "sm_90a"}, "cuda" or "auto" (the visible GPU\'s '
                   'arch), a TVM tag such as "nvidia/nvidia-h100", or a tvm Target')
# "sm_" and a compute capability, major then one digit of minor, and a feature suffix (sm_90a, sm_100f).
_CUDA_ARCH = re.compile(r"sm_(?P<major>[1-9]\d?)(?P<minor>\d)[a-z]?")
# No GPU's compute capability comes near: the highest today is 12.x. An arch above ("sm_900", a 0 too
# many) is refused before nvcc, which would reject it after the whole lowering; a bound this loose
# leaves the next generations' archs to nvcc.
_MAX_CUDA_MAJOR = 19


def refuse_unusable_target(target: object, request: object) -> None:
    """Say what is wrong with a target TileLang could not compile a CUDA kernel for, read from what it
    says (before any GPU lookup, so that a named arch is never blamed on a missing GPU): the old
    command-line string form, an unknown kind or tag, a kind that is not CUDA, a dict without a kind,
    a malformed arch. Anything else passes to TileLang unchanged."""
    if isinstance(request, str):
        text = request.strip()
        if text == "auto":
            return
        kind, _, options = text.partition(" ")
        if options or kind.startswith("-"):
            arch = re.search(r"-arch=(\S+)", options)
            example = canonical_json({"kind": kind or "cuda", "arch": arch.group(1) if arch else "sm_90a"})
            raise TargetError(target, "TileLang no longer parses TVM's command-line form (kind -option=value)",
                              f"write it as a dict, {example}; accepted: {_ACCEPTED_FORMS}")
        if "/" in kind:
            tag = list_tags().get(kind)
            if tag is None:
                raise TargetError(target, f"{kind!r} is no TVM target tag", f"use one of {_ACCEPTED_FORMS}")
            kind = tag.kind.name
        config: dict = {"kind": kind}
    elif isinstance(request, dict):
        config = request
        if "kind" not in config:
            example = canonical_json({"kind": "cuda", **config})
            raise TargetError(target, 'the dict names no "kind"', f"add the kind: {example}")
    elif isinstance(request, Target):
        config = {"kind": request.kind.name, **({"arch": str(request.attrs["arch"])} if "arch" in request.attrs else {})}
    else:
        raise TargetError(target, f"a target is a str, a dict or a tvm Target, not {type(request).__name__}",
                          f"use {_ACCEPTED_FORMS}")
    kind = str(config["kind"])
    # "cuda" is a TVM kind: the list (0.1 ms to build on a fresh process's first call) is asked only
    # to tell an unknown kind from a known one that is not CUDA.
    if kind != "cuda" and kind not in Target.list_kinds() and kind != "cutedsl":
        raise TargetError(target, f"unknown target kind {kind!r}", f"use {_ACCEPTED_FORMS}")
    if kind != "cuda":
        raise TargetError(target, f"kcache caches CUDA kernels, and {kind!r} is not CUDA",
                          "compile it with tilelang.compile, or give a CUDA target: " + _ACCEPTED_FORMS)
    arch = config.get("arch")
    if arch is None:
        return
    parsed = _CUDA_ARCH.fullmatch(arch) if isinstance(arch, str) else None
    how = 'write it as "sm_" and the compute capability, e.g. "sm_90a" (H100, H200), "sm_80" (A100), "sm_89" (L40S)'
    if parsed is None:
        raise TargetError(target, f"arch {arch!r} is not a CUDA arch", how)
    if int(parsed["major"]) > _MAX_CUDA_MAJOR:
        raise TargetError(target, f"arch {arch!r} names compute capability {parsed['major']}.{parsed['minor']}, "
                          "beyond any GPU's (12.x is the highest today)", how)


def _names_arch(target: object) -> bool:
    if isinstance(target, dict):
        return "arch" in target
    if isinstance(target, Target):
        return "arch" in target.attrs
    if isinstance(target, str) and "/" in target:  # a tag: its config names the arch
        tag = list_tags().get(target.strip())
        return tag is not None and "arch" in tag.attrs
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
    request = requested_target(target)
    refuse_unusable_target(target, request)
    if not _names_arch(request) and not _gpu_present():
        where = "" if request is target else f" (resolved to {request!r})"
        raise TargetError(target, f"no GPU is visible and the target names no arch{where}", _ARCH_FIX)
    if isinstance(request, Target):
        # A Target scope's target, made as the same target given as a dict is: TileLang's "auto" path
        # leaves it printing without its host, so the same target would get two keys.
        request = json.loads(str(request))
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
