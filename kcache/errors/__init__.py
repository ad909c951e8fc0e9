"""kcache's exceptions.

Every error subclasses a builtin as well as `KCacheError`, so callers that
already catch `OSError`, `TimeoutError` or `ValueError` keep working, and
each carries the path or kernel it is about plus a hint of what to do.
`base` holds the root, `compiling` a compile's errors, `storage` the cache's on disk; all are named here.
"""

from __future__ import annotations

from kcache.errors.base import KCacheError, SettingError
from kcache.errors.compiling import (
    ArchMismatch,
    CompileAborted,
    CompileError,
    CompilePoolError,
    CompilerCrashed,
    CompileTimeout,
    TargetError,
    TileLangMissing,
    TileLangUnsupported,
    WorkerStartFailed,
    bounded_compiler_message,
)
from kcache.errors.storage import (
    CacheLockTimeout,
    CorruptEntry,
    LocalLoadError,
    NoExecError,
    PublishError,
    UntrustedEntry,
    UnwritableCache,
)

__all__ = [
    "ArchMismatch",
    "CacheLockTimeout",
    "CompileAborted",
    "CompileError",
    "CompilePoolError",
    "CompileTimeout",
    "CompilerCrashed",
    "CorruptEntry",
    "KCacheError",
    "LocalLoadError",
    "NoExecError",
    "PublishError",
    "SettingError",
    "TargetError",
    "TileLangMissing",
    "TileLangUnsupported",
    "UntrustedEntry",
    "UnwritableCache",
    "WorkerStartFailed",
    "bounded_compiler_message",
]
