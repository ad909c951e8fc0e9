"""Every TileLang (and TileLang's TVM) internal that kcache reaches into, in one table, and whether
this TileLang still has it.

kcache's TileLang layer uses names that are no public API of TileLang: a later TileLang may move or
rename any of them. Each is listed here with the place that uses it and what happens without it:
- "essential": kcache cannot build or load an entry without it (the routing point, the target, the
  key, the loader, the device binary's capture). Without one, kcache's TileLang layer is not used at
  all: the drop-in passes every compile through to plain TileLang, with one warning, and
  `get_or_compile` raises TileLangUnsupported (kcache/tilelang/support.py);
- otherwise the place that uses it falls back to TileLang's own path where it is missing (its link,
  its order of steps, a compile in the caller), and the kernel is still the one TileLang builds.

tests/test_tilelang_internals.py hides each name in turn and shows that the kernel still compiles,
equal to plain TileLang's. This module imports nothing of TileLang at import time.
"""

from __future__ import annotations

import importlib
from typing import Any


class Internal:
    # A plain class: a NamedTuple or @dataclass costs ~1 ms of import time, and the hit path loads this.
    __slots__ = ("module", "name", "used_by", "essential", "without")

    def __init__(self, module: str, name: str, used_by: str, essential: bool, without: str) -> None:
        self.module = module
        self.name = name  # an attribute of the module, or "object.attribute" for an attribute of one of its objects
        self.used_by = used_by  # the kcache module that uses it
        self.essential = essential
        self.without = without  # what kcache does where it is missing


_PASS = "kcache's TileLang layer is not used: every compile goes to plain TileLang"

INTERNALS: tuple[Internal, ...] = (
    # The routing point of the drop-in (dropin/install.py, dropin/routing.py).
    Internal("tilelang.jit", "cached", "kcache.dropin.install", True, _PASS),
    Internal("tilelang.jit", "JITKernel", "kcache.tilelang.compiler", True, _PASS),
    Internal("tilelang.cache", "cached", "kcache.dropin.routing", True, _PASS),
    Internal("tilelang", "env.get_default_target", "kcache.dropin.routing", True, _PASS),
    Internal("tilelang", "env.get_default_execution_backend", "kcache.dropin.routing", True, _PASS),
    Internal("tilelang", "env.get_default_verbose", "kcache.dropin.routing", True, _PASS),
    # The target (tilelang/target.py) and the key (tilelang/identity.py, tilelang/fingerprint.py).
    Internal("tilelang.backend.module", "create_backend_context", "kcache.tilelang.target", True, _PASS),
    Internal("tilelang.backend.module", "BackendContext", "kcache.tilelang.target", True, _PASS),
    Internal("tilelang.transform.pass_config", "normalize_pass_configs", "kcache.tilelang.identity", True, _PASS),
    Internal("tilelang.contrib.nvcc", "get_nvcc_compiler", "kcache.tilelang.fingerprint", True, _PASS),
    Internal("tilelang.contrib.nvcc", "find_cuda_path", "kcache.tilelang.fingerprint", True, _PASS),
    # The loader (tilelang/loader.py) sets the fields TileLang's from_database sets.
    Internal("tilelang.jit.abi", "OUT_IDX_ATTR", "kcache.tilelang.loader", True, _PASS),
    Internal("tilelang.jit.abi", "CALLEE_ALLOCATED_OUTPUTS_ATTR", "kcache.tilelang.loader", True, _PASS),
    Internal("tilelang.jit.abi", "_normalize_output_indices", "kcache.tilelang.loader", True, _PASS),
    Internal("tilelang.jit.adapter.tvm_ffi", "TVMFFIKernelAdapter", "kcache.tilelang.loader", True, _PASS),
    Internal("tilelang.jit.adapter.tvm_ffi", "TVMFFIKernelAdapter._legalize_result_idx", "kcache.tilelang.loader",
             True, _PASS),
    Internal("tilelang.jit.adapter.tvm_ffi", "TVMFFIKernelAdapter._uses_ffi_callee_allocated_output_abi",
             "kcache.tilelang.loader", True, _PASS),
    Internal("tilelang.jit.adapter.tvm_ffi", "TVMFFIKernelAdapter._process_dynamic_symbolic",
             "kcache.tilelang.loader", True, _PASS),
    Internal("tilelang.jit.adapter.tvm_ffi", "TVMFFIKernelAdapter._post_init", "kcache.tilelang.loader", True, _PASS),
    Internal("tilelang.engine.param", "KernelParam", "kcache.tilelang.loader", True, _PASS),
    Internal("tilelang.engine.param", "dump_kernel_params", "kcache.tilelang.compiler", True, _PASS),
    # The capture of the device binary nvcc produced (tilelang/compiler.py).
    Internal("tilelang.cuda.backend", "tilelang_callback_cuda_compile", "kcache.tilelang.compiler", True, _PASS),
    # Places with a fallback of their own.
    Internal("tilelang.cache.cuda_binary_cache", "CUDABinaryCache", "kcache.tilelang.compiler", False,
             "nothing to bypass: that TileLang has no CUDA binary cache"),
    Internal("tilelang.engine.lower", "lower_to_host_device_ir", "kcache.tilelang.host_prebuild", False,
             "the host code is generated and compiled in TileLang's order (no prebuild)"),
    Internal("tilelang.engine.lower", "host_codegen", "kcache.tilelang.host_prebuild", False,
             "the host code is generated and compiled in TileLang's order (no prebuild)"),
    Internal("tvm.contrib.cc", "get_cc", "kcache.tilelang.host_link", False,
             "the library is linked by TVM's own create_shared"),
    Internal("tilelang.layout", "Layout", "kcache.tilelang.transfer", False,
             "kernels are compiled in a fork of the caller, or in the caller (not sent to a worker)"),
    Internal("tilelang.layout", "Fragment", "kcache.tilelang.transfer", False,
             "kernels are compiled in a fork of the caller, or in the caller (not sent to a worker)"),
    Internal("tilelang._ffi_api", "Layout", "kcache.tilelang.transfer", False,
             "kernels are compiled in a fork of the caller, or in the caller (not sent to a worker)"),
    Internal("tilelang._ffi_api", "Fragment", "kcache.tilelang.transfer", False,
             "kernels are compiled in a fork of the caller, or in the caller (not sent to a worker)"),
    Internal("tilelang.contrib.cc", "get_cplus_compiler", "kcache.tilelang.context", False,
             "nothing to clear when CXX or CC changes between compiles (that TileLang does not memoize it)"),
    Internal("tvm_ffi.core", "_register_global_func", "kcache.tilelang.callbacks", False,
             "callbacks are not watched: a compile with a callback runs in the caller and is not stored"),
    Internal("tilelang.engine.lower", "lower_with_context", "kcache.tilelang.warm_up", False,
             "the compile workers' template starts without its warm-up lowering"),
    Internal("tilelang.autotuner.tuner", "AutoTuner._save_result_to_disk", "kcache.dropin.install", False,
             "the AutoTuner keeps TileLang's own result cache"),
    Internal("tilelang.autotuner.tuner", "AutoTuner._load_result_from_disk", "kcache.dropin.install", False,
             "the AutoTuner keeps TileLang's own result cache"),
    Internal("tilelang.autotuner.tuner", "AutoTuner.run", "kcache.dropin.install", False,
             "the AutoTuner keeps TileLang's own result cache"),
)


def lookup(module: str, name: str) -> Any | None:
    """The internal `module`.`name` ("object.attribute" for an attribute of one of its objects: a
    class's method, `tilelang.env`'s), or None where this TileLang lacks it (the module too)."""
    try:
        found: Any = importlib.import_module(module)
    except ImportError:
        return None
    for part in name.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    return found


def has(module: str, *names: str) -> bool:
    """Whether this TileLang has every one of `names` in `module`."""
    return all(lookup(module, name) is not None for name in names)


def missing_essentials() -> list[str]:
    """The essential internals this TileLang lacks, as "module.name" (imports TileLang)."""
    return [f"{item.module}.{item.name}" for item in INTERNALS if item.essential and lookup(item.module, item.name) is None]
