"""kcache: a crash-safe, multi-process kernel cache for TileLang.

    kernel = kcache.get_or_compile(prim_func, {"kind": "cuda", "arch": "sm_90a"}, out_idx=[2])

Lookup order: memory, local disk, compile (exactly once across processes).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .cache import KernelCache
from .config import Settings, default_root
from .errors import CacheLockTimeout, CompileError, CorruptEntry, KCacheError, PublishError, TargetError

if TYPE_CHECKING:
    from tilelang.jit import JITKernel
    from tvm.tirx import PrimFunc

__version__ = "0.1.0"
__all__ = [
    "CacheLockTimeout",
    "CompileError",
    "CorruptEntry",
    "KCacheError",
    "KernelCache",
    "PublishError",
    "Settings",
    "TargetError",
    "default_cache",
    "default_root",
    "get_or_compile",
]

_default: KernelCache | None = None
_default_lock = threading.Lock()


def default_cache() -> KernelCache:
    """The process-wide cache at $KCACHE_DIR, else the platform's user cache directory."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = KernelCache()
    return _default


def get_or_compile(
    func: PrimFunc,
    target: str | dict[str, Any] | Any | None = None,
    *,
    out_idx: int | Sequence[int] | None = None,
    pass_configs: dict[str, Any] | None = None,
    compile_flags: str | Sequence[str] | None = None,
    execution_backend: str = "tvm_ffi",
) -> JITKernel:
    """`KernelCache.get_or_compile` on the default cache."""
    return default_cache().get_or_compile(
        func, target, out_idx=out_idx, pass_configs=pass_configs,
        compile_flags=compile_flags, execution_backend=execution_backend,
    )
