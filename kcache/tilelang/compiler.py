"""The compile path of the TileLang backend: compiling, the nvcc hooks, saving an entry.

Imported only on a miss, so that a hit (in memory or on disk) never loads it.

While kcache compiles, TileLang's own kernel cache and CUDA binary cache
neither serve nor store: kcache constructs `JITKernel` directly (TileLang's
kernel cache sits in `tilelang.compile`, not in `JITKernel`), and the CUDA
binary cache is short-circuited for the compiling thread only (other
threads of the process keep TileLang's behaviour). The same hook captures
the device binary nvcc produced, so the entry can keep it as its own file.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import tilelang
import tvm_ffi
from tilelang.cuda import backend as tl_cuda_backend
from tilelang.engine.param import dump_kernel_params
from tilelang.jit import JITKernel
from tvm.target import Target
from tvm.tirx import PrimFunc

from kcache.errors import CompileError
from kcache.keys import JIT_CALL_FIELD
from kcache.store.components import DEVICE_BINARY, DEVICE_SOURCE, HOST_SOURCE, LIBRARY, META, PARAMS
from kcache.store.fsutil import empty_staging, ensure_dir, write_durable
from kcache.tilelang import host_link, host_prebuild, internals
from kcache.tilelang.context import CompileContext, applied
from kcache.tilelang.device_arch import check_on_first_call
from kcache.tilelang.identity import kernel_name
from kcache.tilelang.target import ResolvedTarget, resolve_target
from kcache.tilelang.transfer import TransferableFunc

log = logging.getLogger("kcache")


class CompiledKernel:
    __slots__ = ("kernel", "name", "device_binary", "binary_format", "seconds", "host_prebuild")

    def __init__(self, kernel: JITKernel, name: str, device_binary: bytes, binary_format: str, seconds: float,
                 host_prebuild: host_prebuild.HostPrebuild | None = None) -> None:
        self.kernel = kernel
        self.name = name
        self.device_binary = device_binary
        self.binary_format = binary_format
        self.seconds = seconds
        self.host_prebuild = host_prebuild  # the host object compiled beside nvcc, for the entry's link


# ---------------------------------------------------------------- hooks

_compiling = threading.local()
_hooks_lock = threading.Lock()
_hooks_installed = False


def _kcache_compiling() -> bool:
    return getattr(_compiling, "binaries", None) is not None


def _install_hooks() -> None:
    """Route TileLang's nvcc callback through kcache (once per process)."""
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        original_compile = tl_cuda_backend.tilelang_callback_cuda_compile
        # A TileLang without this CUDA binary cache (kcache/tilelang/internals.py) has none to bypass.
        binary_cache = internals.lookup("tilelang.cache.cuda_binary_cache", "CUDABinaryCache")

        def compile_callback(code: str, target: Target, pass_config: Any = None) -> bytearray:
            binary = original_compile(code, target, pass_config)
            binaries = getattr(_compiling, "binaries", None)
            if binaries is not None:
                binaries.append(bytes(binary))
            return binary

        if binary_cache is not None:
            _bypass_binary_cache(binary_cache)
        tvm_ffi.register_global_func("tilelang_callback_cuda_compile", f=compile_callback, override=True)
        host_prebuild.install_hooks(lambda: getattr(_compiling, "prebuild", None))
        _hooks_installed = True


def _bypass_binary_cache(binary_cache: Any) -> None:
    """TileLang's CUDA binary cache neither serves nor stores for a thread that kcache compiles in."""
    original_load = binary_cache.load.__func__
    original_save = binary_cache.save.__func__

    def load(cls: type, key: str, compile_format: str) -> bytes | None:
        return None if _kcache_compiling() else original_load(cls, key, compile_format)

    def save(cls: type, key: str, compile_format: str, data: bytes) -> None:
        if not _kcache_compiling():
            original_save(cls, key, compile_format, data)

    binary_cache.load = classmethod(load)
    binary_cache.save = classmethod(save)


def compile_kernel(
    func: PrimFunc,
    resolved: ResolvedTarget,
    out_idx: list[int] | None,
    pass_configs: dict[str, Any],
    compile_flags: list[str] | None,
    log_dir: Path,
    context: CompileContext | None = None,
    *,
    in_worker: bool = False,
) -> CompiledKernel:
    """Compile with TileLang, bypassing its caches, under the caller's compile context (in a worker,
    its callbacks registered for the compile). Raises CompileError."""
    _install_hooks()
    name = kernel_name(func)
    backend_context = resolved.context
    binaries: list[bytes] = []
    _compiling.binaries = binaries
    _compiling.prebuild = prebuild = host_prebuild.HostPrebuild()
    start = time.perf_counter()
    try:
        with applied(context, register_callbacks=in_worker):
            kernel = JITKernel(
                func,
                out_idx=out_idx,
                execution_backend=backend_context.execution_backend.name,
                target=backend_context.target,
                target_host=backend_context.target_host,
                pass_configs=pass_configs,
                compile_flags=compile_flags,
                backend_context=backend_context,
            )
    except Exception as err:  # TileLang, TVM and nvcc raise many types; all mean "this kernel did not compile"
        prebuild.close()
        raise CompileError(name, summarize_compiler_error(str(err)), _write_log(log_dir, name, err), str(err)) from err
    except BaseException:
        prebuild.close()
        raise
    finally:
        _compiling.binaries = None
        _compiling.prebuild = None
    seconds = time.perf_counter() - start
    if not binaries:
        prebuild.close()
        raise CompileError(name, "TileLang produced no device binary (the nvcc callback never ran)", None)
    binary_format = "fatbin" if len(binaries[-1]) and binaries[-1][:4] == b"\x50\xed\x55\xba" else "cubin"
    # A kernel compiled here is checked on its first call like one loaded from an entry (device_arch).
    return CompiledKernel(kernel=check_on_first_call(kernel, name, resolved.canonical), name=name,
                          device_binary=binaries[-1], binary_format=binary_format, seconds=seconds,
                          host_prebuild=prebuild)


def compile_job(
    func: PrimFunc | TransferableFunc, target_json: str, execution_backend: str, out_idx: list[int] | None,
    pass_configs: dict[str, Any], compile_flags: list[str] | None, log_dir: str, out_dir: str, key: str,
    toolchain: dict, context: CompileContext | None = None, described_fields: dict | None = None,
    in_worker: bool = True,
) -> float:
    """A compile worker's job (see `kcache.tilelang.backend.compile_entry`): compile, write the entry;
    the seconds it took. `func` arrives as the caller's checked copy (unpickled) or, in a fork of the
    caller, as the caller's own object. `in_worker`: the caller's callbacks are called back in the
    caller; False where the job runs in the caller itself, whose callbacks are in force already."""
    if isinstance(func, TransferableFunc):
        func = func.func
    empty_staging(Path(out_dir))  # a run again after the compile service died mid-job starts clean
    resolved = resolve_target(json.loads(target_json), execution_backend)
    compiled = compile_kernel(func, resolved, out_idx, pass_configs, compile_flags, Path(log_dir), context,
                              in_worker=in_worker)
    write_entry(Path(out_dir), compiled, key, resolved, toolchain, described_fields)
    return compiled.seconds


_ERROR_LINE = re.compile(r"\berror\b|\bfatal\b|\btimed out\b", re.IGNORECASE)


def summarize_compiler_error(message: str, max_lines: int = 8) -> str:
    """The compiler's first error lines, not the hundreds of warnings and the source around them.

    TileLang's nvcc failures read "<whole source> Compilation error: <nvcc output> Command: <cmd>";
    only the nvcc output matters.
    """
    _, marker, after = message.partition("Compilation error:")
    section = after.partition("\nCommand:")[0] if marker else message
    lines = [line.rstrip() for line in section.splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.search(line) and "warning" not in line.lower()]
    chosen = errors[:max_lines] if errors else (lines[:max_lines] if marker else lines[-3:])
    return "\n".join(line if len(line) <= 300 else line[:297] + "..." for line in chosen) or "(no message)"


def _write_log(log_dir: Path, name: str, err: BaseException) -> str | None:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80]
    path = log_dir / f"compile-{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}.log"
    try:
        ensure_dir(log_dir)
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        write_durable(path, text.encode(errors="replace"))
    except OSError as log_err:
        log.warning("kcache: could not write the compile log %s: %s", path, log_err)
        return None
    return str(path)


def linked_library(adapter: Any, prebuild: host_prebuild.HostPrebuild | None = None) -> bytes:
    """The kernel's host library, linked into a private temporary directory and read back; the host
    object compiled ahead (`prebuild`) is used where it is the one the link would compile."""
    try:
        with tempfile.TemporaryDirectory(prefix="kcache-link-") as private:
            path = os.path.join(private, LIBRARY)
            prebuilt = prebuild.take if prebuild is not None else None
            adapter.get_exportable_executable().export_library(path, fcompile=host_link.fcompile(prebuilt))
            with open(path, "rb") as linked:
                return linked.read()
    finally:
        if prebuild is not None:
            prebuild.close()


def write_entry(staging: Path, compiled: CompiledKernel, key: str, resolved: ResolvedTarget, toolchain: dict,
                described_fields: dict | None = None) -> None:
    """Write every component of a kernel entry into `staging` (durably). `described_fields`: the key's
    fields as the caller described them (identity.describe_key_fields), kept to explain misses."""
    kernel = compiled.kernel
    adapter = kernel.adapter
    write_durable(staging / DEVICE_SOURCE, (adapter.get_device_source() or "").encode())
    write_durable(staging / HOST_SOURCE, (adapter.get_host_source() or "").encode())
    write_durable(staging / DEVICE_BINARY, compiled.device_binary)
    write_durable(staging / PARAMS, dump_kernel_params(kernel.params).encode())
    # Written like every component (durably, read-only, with the sharing mode), from the linker's
    # output in a private directory: the linker never writes into the cache's filesystem, so a full
    # cache fails the save (ENOSPC: the kernel is returned unsaved), never the compile.
    write_durable(staging / LIBRARY, linked_library(adapter, compiled.host_prebuild))
    meta = {
        "key": key,
        "kernel": compiled.name,
        "target": json.loads(resolved.canonical),
        "execution_backend": resolved.context.execution_backend.name,
        "device_binary_format": compiled.binary_format,
        "toolchain": toolchain,
        "created": time.time(),
        "compile_seconds": round(compiled.seconds, 4),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "tilelang": tilelang.__version__,
    }
    if described_fields is not None:
        fields = dict(described_fields)
        jit_call = fields.pop(JIT_CALL_FIELD, None)  # where the request came from: not a key field
        if jit_call is not None:
            meta["jit"] = jit_call
        meta["key_fields"] = fields
    write_durable(staging / META, json.dumps(meta, indent=1, sort_keys=True).encode())


def warm_up_template() -> None:
    """The worker template's hook (kcache/compile/workers/template.warm_up): one small lowering, so
    that the workers it forks start warm (kcache/tilelang/warm_up.py)."""
    from kcache.tilelang import warm_up

    warm_up.lower_once()
