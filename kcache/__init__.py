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
from .doctor import doctor
from .tilelang_dropin import install, install_from_environment, is_installed, uninstall
from .errors import (
    CacheLockTimeout, CompileError, CompilePoolError, CompilerCrashed, CompileTimeout, CorruptEntry, KCacheError,
    LocalLoadError, NoExecError, PublishError, TargetError, UnwritableCache,
)

if TYPE_CHECKING:
    from tilelang.jit import JITKernel
    from tvm.tirx import PrimFunc

    from .pool import CompilePool, Job, JobResult

__version__ = "0.1.0"
__all__ = [
    "CacheLockTimeout",
    "CompileError",
    "CompilePool",
    "CompilePoolError",
    "CompileTimeout",
    "CompilerCrashed",
    "Job",
    "JobResult",
    "CorruptEntry",
    "KCacheError",
    "KernelCache",
    "LocalLoadError",
    "NoExecError",
    "PublishError",
    "Settings",
    "TargetError",
    "UnwritableCache",
    "default_cache",
    "default_root",
    "doctor",
    "get_or_compile",
    "install",
    "is_installed",
    "uninstall",
]

_LAZY = {"CompilePool", "Job", "JobResult"}


def __getattr__(name: str) -> Any:
    # The pool's imports (subprocess, cloudpickle) stay off the path of a cache hit.
    if name in _LAZY:
        from . import pool

        return getattr(pool, name)
    raise AttributeError(f"module 'kcache' has no attribute {name!r}")


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


install_from_environment()  # KCACHE_TILELANG=1
