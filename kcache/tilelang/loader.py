"""Loading a verified entry as a runnable `JITKernel`, without TileLang's redundant work."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import tilelang  # noqa: F401 - puts TileLang's tvm on the path
import tvm
import tvm_ffi
from tilelang.engine.param import KernelParam
from tilelang.jit import JITKernel
from tilelang.jit.abi import CALLEE_ALLOCATED_OUTPUTS_ATTR, OUT_IDX_ATTR, _normalize_output_indices
from tilelang.jit.adapter.tvm_ffi import TVMFFIKernelAdapter
from tvm import runtime
from tvm.ir import _ffi_api as _ir_ffi
from tvm.runtime import _ffi_node_api
from tvm.target import _ffi_api as _target_ffi
from tvm.tirx import PrimExpr, PrimFunc

from kcache.store import exec_copy
from kcache.store.components import DEVICE_SOURCE, HOST_SOURCE, LIBRARY, PARAMS
from kcache.store.elf import require_loadable
from kcache.tilelang.device_arch import check_on_first_call
from kcache.tilelang.target import ResolvedTarget


def load_kernel(
    func: PrimFunc,
    entry_dir: Path,
    files: dict[str, bytes],
    resolved: ResolvedTarget,
    out_idx: list[int] | None,
    pass_configs: dict[str, Any],
    compile_flags: list[str] | None,
    *,
    noexec_mount: Path | None = None,
) -> JITKernel:
    """Build a runnable kernel from an entry whose files were already verified.

    Its structure is checked before anything maps it (store/elf.py). The library is loaded from a
    copy of its verified bytes (kcache/store/exec_copy.py), on a noexec
    filesystem (`noexec_mount`) as everywhere; `libpath` still names the entry's file.

    Sets exactly the fields that `JITKernel.from_database` and
    `TVMFFIKernelAdapter.from_database` (TileLang 0.1.15) set, without their
    redundant target normalizations and without `tvm_ffi.convert` on a list
    and an int (two first-time ABC walks, ~1-2 ms each).
    """
    # A library cut short (its manifest rewritten to match) would be mapped past its end by dlopen,
    # and the first touch of such a page is SIGBUS in this process: checked first, a corrupt entry.
    require_loadable(str(entry_dir), files)
    context = resolved.context
    spec = context.execution_backend
    host_source = files[HOST_SOURCE].decode()
    device_source = files[DEVICE_SOURCE].decode()
    library = str(entry_dir / LIBRARY)

    kernel = JITKernel.__new__(JITKernel)
    kernel.prim_func = func
    kernel.verbose = False
    kernel.pass_configs = dict(pass_configs)  # = normalize_pass_configs(pass_configs): it is normalized already
    kernel.compile_flags = [compile_flags] if isinstance(compile_flags, str) else compile_flags
    kernel.backend_context = context
    kernel.backend = context.module
    kernel.target = context.target
    kernel.target_host = context.target_host
    kernel.execution_backend_spec = spec
    kernel.execution_backend = spec.name

    stamped = _stamp_out_idx(func, out_idx, spec.supports_callee_allocated_outputs)
    adapter = TVMFFIKernelAdapter.__new__(TVMFFIKernelAdapter)
    adapter.params = _load_params(files[PARAMS].decode())
    adapter.result_idx = adapter._legalize_result_idx(None if out_idx is None else list(out_idx))  # it edits in place
    adapter.host_kernel_source = host_source
    adapter._host_kernel_source_path = None
    adapter.device_kernel_source = device_source
    adapter._device_kernel_source_path = None
    adapter.wrapped_source = device_source + "\n\n" + host_source
    adapter.pass_configs = pass_configs
    adapter.ir_module = tvm.IRModule({stamped.attrs["global_symbol"]: stamped})
    adapter.target = _target_ffi.Target(context.target)  # from_database's Target(determine_target(target)): a copy
    adapter.verbose = False
    adapter.libpath = library
    adapter.kernel_global_source = device_source
    adapter.rt_mod = None
    # Always from a copy of the verified bytes (a memfd), never by the entry's path: whoever swaps or
    # rewrites the entry after the check cannot change what is mapped (kcache/store/trust.py).
    adapter.executable = exec_copy.load_copy(files[LIBRARY], entry_dir / LIBRARY, noexec_mount,
                                             load_fd_path=_load_descriptor_path, load_path=runtime.load_module)
    adapter._ffi_callee_allocated_output_abi = adapter._uses_ffi_callee_allocated_output_abi()
    adapter.dynamic_symbolic_map = None if adapter._ffi_callee_allocated_output_abi else adapter._process_dynamic_symbolic()
    adapter._executable_lock = threading.Lock()
    adapter._post_init()
    kernel.adapter = adapter
    kernel.torch_function = adapter.func
    # On a device of another compute capability than the target's arch, the first call raises ArchMismatch.
    return check_on_first_call(kernel, str(stamped.attrs["global_symbol"]), resolved.canonical)


def _load_descriptor_path(path: str) -> Any:
    """Load a library from /proc/self/fd/N: `runtime.load_module` resolves the path (a memfd's
    target is no file) and picks the loader by the name's extension (there is none)."""
    module = tvm_ffi.get_global_func("ffi.Module.load_from_file.so")(path, "so")
    tvm_ffi._ffi_api.ModuleGlobalsAdd(module)  # as tvm_ffi.load_module does: functions outlive the handle
    return module


def _with_attr(func: PrimFunc, key: str, value: object) -> PrimFunc:
    """BaseFunc.with_attr, passing `value` to the FFI as is instead of through tvm_ffi.convert."""
    return _ir_ffi.BaseFuncWithAttr(_ir_ffi.BaseFuncCopy(func)._move(), key, value)


def _stamp_out_idx(func: PrimFunc, out_idx: list[int] | None, supports_callee_allocated_outputs: bool) -> PrimFunc:
    """The PrimFunc that tilelang.jit.abi.prepare_tvm_ffi_callee_allocated_outputs returns."""
    requested = None if out_idx is None else list(out_idx)
    attrs = func.attrs
    if attrs is not None and OUT_IDX_ATTR in attrs:
        attr_indices = [int(index) for index in attrs[OUT_IDX_ATTR]]
        if requested is not None:
            num_params = len(func.params)
            if _normalize_output_indices(requested, num_params) != _normalize_output_indices(attr_indices, num_params):
                raise ValueError("out_idx does not match the PrimFunc's tilelang_out_idx attribute")
        if attr_indices and supports_callee_allocated_outputs and CALLEE_ALLOCATED_OUTPUTS_ATTR not in attrs:
            func = _with_attr(func, CALLEE_ALLOCATED_OUTPUTS_ATTR, 1)
        return func
    if not requested:
        return func
    _normalize_output_indices(requested, len(func.params))
    func = _with_attr(func, OUT_IDX_ATTR, requested)
    if supports_callee_allocated_outputs:
        func = _with_attr(func, CALLEE_ALLOCATED_OUTPUTS_ATTR, 1)
    return func


def _load_params(text: str) -> list[KernelParam]:
    """tilelang.engine.param.load_kernel_params, minus upgrade_json (a loads/dumps(indent=2)
    round trip that changes nothing for JSON this TileLang wrote) and minus
    isinstance(int, PrimExpr) (a first-time ABC walk)."""
    params = []
    for record in _ffi_node_api.LoadJSON(text):
        shape = [dim if type(dim) is not int and isinstance(dim, PrimExpr) else int(dim) for dim in record["shape"]]
        params.append(KernelParam(tvm.DataType(str(record["dtype"])), shape))
    return params
