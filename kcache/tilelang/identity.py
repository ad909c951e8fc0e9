"""What identifies a kernel: its name, its normalized arguments, its key fields, its structural hash."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from tilelang.transform.pass_config import normalize_pass_configs  # noqa: F401 - part of this module's interface
from tvm.ir import IRModule
from tvm.runtime import _ffi_node_api
from tvm.tirx import PrimFunc

from kcache.tilelang.context import CompileContext
from kcache.tilelang.target import ResolvedTarget


def fast_structural_hash(func: PrimFunc) -> int:
    """tvm.ir.structural_hash(func) without its tvm_ffi.convert(func) (a PrimFunc is an FFI object already)."""
    return _ffi_node_api.StructuralHash(func, False)


def fast_structural_equal(lhs: PrimFunc, rhs: PrimFunc) -> bool:
    """tvm.ir.structural_equal(lhs, rhs) without the two tvm_ffi.convert calls."""
    return bool(_ffi_node_api.StructuralEqual(lhs, rhs, False, False))


def kernel_name(func: PrimFunc) -> str:
    attrs = func.attrs
    if attrs is not None and "global_symbol" in attrs:
        return str(attrs["global_symbol"])
    return "<unnamed>"


def normalize_out_idx(out_idx: int | Sequence[int] | None) -> list[int] | None:
    if out_idx is None:
        return None
    if isinstance(out_idx, int):
        return [out_idx]
    return [int(i) for i in out_idx]


def normalize_flags(compile_flags: str | Sequence[str] | None) -> list[str] | None:
    if compile_flags is None:
        return None
    return [compile_flags] if isinstance(compile_flags, str) else [str(f) for f in compile_flags]


def require_prim_func(func: Any) -> None:
    """TypeError naming what get_or_compile takes, for anything else (the first use of `func`). An
    IRModule passes, as TileLang's own cache takes one."""
    if not isinstance(func, (PrimFunc, IRModule)):
        shown = repr(func)
        raise TypeError(
            f"kcache compiles a TileLang PrimFunc (a `@T.prim_func` function, or what a kernel factory returns), "
            f"not {type(func).__module__}.{type(func).__qualname__}: {shown[:80] + ('...' if len(shown) > 80 else '')}. "
            "For `@tilelang.jit` functions, call kcache.install() and use TileLang as usual.")


def key_fields(
    func: PrimFunc,
    resolved: ResolvedTarget,
    out_idx: list[int] | None,
    pass_configs: dict[str, Any],
    compile_flags: list[str] | None,
    toolchain: dict[str, object],
    context: CompileContext | None = None,
) -> dict[str, object]:
    require_prim_func(func)
    fields: dict[str, object] = {
        "kind": "tilelang-kernel",
        "script": func.script(show_meta=True),
        "target": resolved.canonical,
        "out_idx": out_idx,
        "pass_configs": pass_configs,
        "compile_flags": compile_flags,
        "execution_backend": resolved.context.execution_backend.name,
        "toolchain": toolchain,
    }
    extra = context.key_part() if context is not None else None
    if extra is not None:  # absent for the plain context: keys made before it existed stay valid
        fields["context"] = extra
    return fields


def describe_key_fields(fields: dict[str, object]) -> dict[str, object]:
    """The key's fields as `meta.json` keeps them, to explain a miss (kcache.cache.miss_explain): the
    TIR script (kilobytes) as its sha256, the target's canonical JSON as the dict it encodes."""
    described = {name: value for name, value in fields.items() if name != "script"}
    script = fields.get("script")
    if isinstance(script, str):
        described["source_sha256"] = hashlib.sha256(script.encode()).hexdigest()
    target = fields.get("target")
    if isinstance(target, str):
        described["target"] = json.loads(target)
    return described
