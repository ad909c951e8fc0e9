"""kcache: a crash-safe, multi-process kernel cache for TileLang.

    kernel = kcache.get_or_compile(prim_func, {"kind": "cuda", "arch": "sm_90a"}, out_idx=[2])

Lookup order: memory, local disk, the remote tier, then one compile across processes and nodes.

This module is the facade and the top of the import graph: it names the public API and loads
each name on first use (PEP 562), so that importing one layer (`kcache.store`, say) costs that
layer only, and a cache hit never loads the compile path. docs/design.md has the layer map.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from kcache.errors import (
    ArchMismatch,
    CacheLockTimeout,
    CompileAborted,
    CompileError,
    CompilePoolError,
    CompilerCrashed,
    CompileTimeout,
    CorruptEntry,
    KCacheError,
    LocalLoadError,
    NoExecError,
    PublishError,
    SettingError,
    TargetError,
    TileLangMissing,
    TileLangUnsupported,
    UnwritableCache,
    WorkerStartFailed,
)
from kcache.import_hooks import after_import

if TYPE_CHECKING:
    from kcache.bundle.entries import BundleError
    from kcache.bundle.importer import export_bundle, import_bundle
    from kcache.cache.default import default_cache, get_or_compile
    from kcache.cache.deployment import UnexpectedCompile, guard, record
    from kcache.cache.kernel_cache import KernelCache
    from kcache.cli.doctor import doctor
    from kcache.compile.pool.process_pool import CompilePool, Job, JobResult
    from kcache.config import Settings
    from kcache.dropin import install, is_installed, uninstall
    from kcache.setting_values import default_root

__version__ = "0.1.0"

# Public name -> the module that defines it.
_PUBLIC = {
    "KernelCache": "kcache.cache.kernel_cache",
    "default_cache": "kcache.cache.default",
    "get_or_compile": "kcache.cache.default",
    "Settings": "kcache.config",
    "default_root": "kcache.setting_values",
    "CompilePool": "kcache.compile.pool.process_pool",
    "Job": "kcache.compile.pool.process_pool",
    "JobResult": "kcache.compile.pool.process_pool",
    "install": "kcache.dropin",
    "is_installed": "kcache.dropin",
    "uninstall": "kcache.dropin",
    "doctor": "kcache.cli.doctor",
    "record": "kcache.cache.deployment",
    "guard": "kcache.cache.deployment",
    "UnexpectedCompile": "kcache.cache.deployment",
    "export_bundle": "kcache.bundle.importer",
    "import_bundle": "kcache.bundle.importer",
    "BundleError": "kcache.bundle.entries",
}

__all__ = [
    "BundleError", "UnexpectedCompile", "export_bundle", "guard", "import_bundle", "record",
    "ArchMismatch", "CacheLockTimeout", "CompileAborted", "CompileError", "CompilePool", "CompilePoolError", "CompileTimeout", "CompilerCrashed",
    "CorruptEntry", "Job", "JobResult", "KCacheError", "KernelCache", "LocalLoadError", "NoExecError", "PublishError",
    "SettingError", "Settings", "TargetError", "TileLangMissing", "TileLangUnsupported", "UnwritableCache", "WorkerStartFailed", "default_cache", "default_root", "doctor", "get_or_compile",
    "install", "is_installed", "uninstall",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'kcache' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


def _watch_callbacks() -> None:
    try:
        from kcache.tilelang.callbacks import watch_registrations

        watch_registrations()
    except Exception as err:  # noqa: BLE001 - never fail the program's `import tilelang` for it
        # Unwatched, a callback is opaque: compiled in the caller and kept in memory only.
        import logging

        logging.getLogger("kcache").warning("kcache: cannot watch TileLang's callback registrations (%s: %s): "
                                            "a compile with a postproc callback runs in this process, uncached",
                                            type(err).__name__, err)


# Remember the Python function of every compile callback registered from TVM's FFI's load on, so that
# it can be keyed and called back from a compile worker (kcache.tilelang.callbacks): now if TileLang
# is loaded, else as its import loads the FFI, so that `import kcache` then `import tilelang` watches
# what the program registers next. A process that never loads TileLang pays nothing.
after_import("tvm_ffi", _watch_callbacks)

def _mask_log_records() -> None:
    from kcache.redaction import mask_log_records

    mask_log_records()


# No line of kcache's log carries a URL's password (KCACHE_REMOTE's), whatever it quotes: the filter is
# set as soon as `logging` is loaded (now, if it is), before kcache can log a line, and a process that
# never loads `logging` pays nothing for it (`import kcache` alone does not).
after_import("logging", _mask_log_records)

if os.environ.get("KCACHE_LOG", "").strip():
    # KCACHE_LOG=debug|info|warning: kcache's log on stderr, one line per lookup (kcache.lookup_log).
    from kcache.lookup_log import configure

    configure()

if os.environ.get("KCACHE_TILELANG", "").strip():
    # KCACHE_TILELANG=1: install into TileLang now, or as soon as it is imported.
    from kcache.dropin.on_import import install_from_environment

    install_from_environment()
