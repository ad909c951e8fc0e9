"""The process-wide default cache, and `get_or_compile` on it."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kcache.cache.kernel_cache import KernelCache

if TYPE_CHECKING:
    from tilelang.jit import JITKernel
    from tvm.tirx import PrimFunc

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
