"""What kcache knows about TileLang on the hit path: targets, keys, the toolchain, loading.

TileLang is imported when this module is, so `import kcache` stays cheap
and only a cache that actually compiles or loads pays for it. Compiling and
saving live in `tilelang_compile`, loaded only on a miss: every module on
the path of a fresh-process disk hit costs ~0.3 ms to load.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

import tilelang  # noqa: F401 - puts TileLang's tvm on the path
import tvm
import tvm_ffi
from tilelang.backend.module import BackendContext, create_backend_context
from tilelang.engine.param import KernelParam
from tilelang.jit import JITKernel
from tilelang.jit.abi import CALLEE_ALLOCATED_OUTPUTS_ATTR, OUT_IDX_ATTR, _normalize_output_indices
from tilelang.jit.adapter.tvm_ffi import TVMFFIKernelAdapter
from tilelang.transform.pass_config import normalize_pass_configs  # noqa: F401 - part of this module's interface
from tvm import runtime
from tvm.ir import _ffi_api as _ir_ffi
from tvm.runtime import _ffi_node_api
from tvm.target import Target
from tvm.target import _ffi_api as _target_ffi
from tvm.tirx import PrimExpr, PrimFunc

from . import exec_copy, layout
from .errors import TargetError
from .fsutil import read_nofollow
from .keys import ENTRY_FORMAT, canonical_json, derive_key

from .components import COMPONENTS, DEVICE_BINARY, DEVICE_SOURCE, HOST_SOURCE, LIBRARY, META, PARAMS  # noqa: F401

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


def target_memo_key(target: object) -> str:
    """A cheap, hashable stand-in for a target argument (dicts are unhashable)."""
    if isinstance(target, dict):
        return "d:" + canonical_json(target)
    if isinstance(target, Target):
        return "t:" + str(target)
    return "s:" + repr(target)


def _names_arch(target: object) -> bool:
    if isinstance(target, dict):
        return "arch" in target
    if isinstance(target, Target):
        return "arch" in target.attrs
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
    request = "cuda" if target is None else target
    if not _names_arch(request) and not _gpu_present():
        raise TargetError(target, "no GPU is visible and the target names no arch", _ARCH_FIX)
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


# ---------------------------------------------------------------- memory tier


def fast_structural_hash(func: PrimFunc) -> int:
    """tvm.ir.structural_hash(func) without its tvm_ffi.convert(func) (a PrimFunc is an FFI object already)."""
    return _ffi_node_api.StructuralHash(func, False)


def fast_structural_equal(lhs: PrimFunc, rhs: PrimFunc) -> bool:
    """tvm.ir.structural_equal(lhs, rhs) without the two tvm_ffi.convert calls."""
    return bool(_ffi_node_api.StructuralEqual(lhs, rhs, False, False))


# ---------------------------------------------------------------- keys


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


def key_fields(
    func: PrimFunc,
    resolved: ResolvedTarget,
    out_idx: list[int] | None,
    pass_configs: dict[str, Any],
    compile_flags: list[str] | None,
    toolchain: dict[str, object],
) -> dict[str, object]:
    return {
        "kind": "tilelang-kernel",
        "script": func.script(show_meta=True),
        "target": resolved.canonical,
        "out_idx": out_idx,
        "pass_configs": pass_configs,
        "compile_flags": compile_flags,
        "execution_backend": resolved.context.execution_backend.name,
        "toolchain": toolchain,
    }


# ---------------------------------------------------------------- compile and save (tilelang_compile, on a miss)


def compile_kernel(*args: Any, **kwargs: Any) -> Any:
    from . import tilelang_compile

    return tilelang_compile.compile_kernel(*args, **kwargs)


def write_entry(*args: Any, **kwargs: Any) -> None:
    from . import tilelang_compile

    tilelang_compile.write_entry(*args, **kwargs)


# What a compile worker imports before its first job.
COMPILE_PRELOAD = ("tilelang", "kcache.tilelang_compile")


def compile_entry(
    func: PrimFunc, resolved: ResolvedTarget, out_idx: list[int] | None, pass_configs: dict[str, Any],
    compile_flags: list[str] | None, log_dir: Path, *, pool: Any, out_dir: Path, key: str, toolchain: dict,
) -> None:
    """Compile in a worker of `pool`, which writes every component of the entry into `out_dir`.

    The target travels as its canonical JSON (arch included), so the worker
    never looks for a GPU; the PrimFunc travels pickled (TVM's serialized
    IR: exact, and ~1 ms for a matmul).
    """
    from .pool_protocol import CallByName

    pool.run(
        CallByName("kcache.tilelang_compile", "compile_job"),
        func, resolved.canonical, resolved.context.execution_backend.name, out_idx, pass_configs,
        compile_flags, str(log_dir), str(out_dir), key, toolchain,
        name=kernel_name(func),
    )


# ---------------------------------------------------------------- toolchain

_LIB_NAMES = ("libtilelang.so", "libtvm_compiler.so", "libtvm_runtime.so")
_toolchain_memo: dict[str, dict[str, object]] = {}


def toolchain_signature() -> tuple[str, list[str], str]:
    """(signature, libraries, compiler): a stat signature of every file the fingerprint is computed from.

    A library that does not exist is left out; nvcc and the toolkit's cuda.h
    are stat'ed through any symlink (os.stat follows it), so retargeting a
    link changes the signature through the target's inode, size and mtime.
    """
    import importlib

    from tilelang.contrib import nvcc

    tl_env = importlib.import_module("tilelang.env")  # the module: `from tilelang import env` is an object

    libraries: list[str] = []
    rows: list[list[object]] = []
    for lib_dir in getattr(tl_env, "TL_LIBS", []):
        for name in _LIB_NAMES:
            path = os.path.join(lib_dir, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            libraries.append(path)
            rows.append([path, st.st_size, st.st_mtime_ns, st.st_ino])
    compiler = nvcc.get_nvcc_compiler()
    cuda_h = os.path.join(nvcc.find_cuda_path(), "include", "cuda.h")
    for path in (compiler, cuda_h):
        try:
            st = os.stat(path)
            rows.append([path, st.st_size, st.st_mtime_ns, st.st_ino])
        except FileNotFoundError:
            rows.append([path, None])
    return derive_key({"files": rows, "entry_format": ENTRY_FORMAT}), libraries, compiler


def toolchain_fingerprint(root: Path, persist: bool = True) -> dict[str, object]:
    """The toolchain part of every key: memoized per process and under `<root>/.toolchain/`.

    Only a memo miss loads `kcache.toolchain` (which hashes ~100 MB of
    libraries and runs nvcc --version).
    """
    signature, libraries, compiler = toolchain_signature()
    cached = _toolchain_memo.get(signature)
    if cached is not None:
        return cached
    try:
        fingerprint = json.loads(read_nofollow(os.path.join(root, layout.TOOLCHAIN, signature + ".json")))
    except (OSError, ValueError):
        from . import toolchain

        fingerprint = toolchain.compute_and_persist(root, signature, libraries, compiler, persist)
    _toolchain_memo[signature] = fingerprint
    return fingerprint


# ---------------------------------------------------------------- load


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

    With `noexec_mount` (the entry's filesystem forbids mapping code), the library is loaded from a
    copy of its verified bytes (kcache/exec_copy.py); `libpath` still names the entry's file.

    Sets exactly the fields that `JITKernel.from_database` and
    `TVMFFIKernelAdapter.from_database` (TileLang 0.1.15) set, without their
    redundant target normalizations and without `tvm_ffi.convert` on a list
    and an int (two first-time ABC walks, ~1-2 ms each).
    """
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
    adapter.executable = (runtime.load_module(library) if noexec_mount is None else exec_copy.load_copy(
        files[LIBRARY], entry_dir / LIBRARY, noexec_mount, load_fd_path=_load_descriptor_path, load_path=runtime.load_module))
    adapter._ffi_callee_allocated_output_abi = adapter._uses_ffi_callee_allocated_output_abi()
    adapter.dynamic_symbolic_map = None if adapter._ffi_callee_allocated_output_abi else adapter._process_dynamic_symbolic()
    adapter._executable_lock = threading.Lock()
    adapter._post_init()
    kernel.adapter = adapter
    kernel.torch_function = adapter.func
    return kernel


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


def log_dir(root: Path) -> Path:
    return root / layout.LOGS
