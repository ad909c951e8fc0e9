"""The drop-in, `kcache.install()`: existing TileLang code gets kcache without a line changed.

TileLang 0.1.15 sends `tilelang.compile`, `tilelang.par_compile`, `@tilelang.jit` (eager and lazy)
and its AutoTuner's compiles through one function, `tilelang.jit.cached`, after merging a
PrimFunc's own out_idx, pass configs and compile flags into the arguments. Replacing that name
routes all of them through `KernelCache.get_or_compile`: compiles happen once across processes,
in the isolated pool, and land in kcache's root, not TileLang's. `@tilelang.jit`'s own per-call
memo sits above it, so a call with arguments already seen returns its kernel without building the
PrimFunc, as before. The AutoTuner's result cache (`_save_result_to_disk` / `_load_result_from_disk`)
is replaced by autotune entries of kcache's protocol. `uninstall()` puts TileLang's own back.

Calls kcache does not serve (another execution backend, a non-CUDA target, a target_host, verbose,
extra positional arguments) go to TileLang's `cached` unchanged, with one debug line per reason.

Each name loads its module on first use (PEP 562): `kcache.dropin.on_import`, which waits for TileLang's
import, must not load the cache and the compile path that `install` needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kcache.dropin.installer import install, is_installed, uninstall
    from kcache.dropin.on_import import install_from_environment

_PUBLIC = {"install": "kcache.dropin.installer", "is_installed": "kcache.dropin.installer",
           "uninstall": "kcache.dropin.installer", "install_from_environment": "kcache.dropin.on_import"}

__all__ = ["install", "install_from_environment", "is_installed", "uninstall"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'kcache.dropin' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value
