"""The kernel's host code, compiled while nvcc compiles its device code.

TileLang lowers a kernel into a host module and a device module, generates the device code and runs
nvcc on it (1.4-3.4 s of a first compile on an H100), and only then generates the host code: a C
source. The kernel's library is linked from that source (`lib0.c`) and the device binary's
(`devc.c`; kcache/tilelang/host_link.py). `g++ -c lib0.c` takes about 0.2 s, mostly TVM's headers;
for a small kernel it is the longest step after nvcc. The host code does not depend on nvcc's
output, so while kcache compiles, the host code is generated first, right after the lowering, and
its `g++ -c` runs beside nvcc.

What changes is when the host code is generated, nothing else: once, by TileLang's own function, in
the same pass context; TileLang gets that module back where it asks for it. Where a host
post-processing callback is registered, nothing moves: the caller's callbacks keep TileLang's order.

The object is used only where the link would compile the same thing: the same compiler, flags and
file name (the name is in the object's symbols; its directory is not), and the same source bytes,
read back from the file TVM's export wrote. Anything else, or a compile that failed, compiles at the
link as before, so the library is still the one TVM links, byte for byte (tests/test_host_prebuild.py).
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import subprocess
import tempfile
import weakref
from collections.abc import Callable
from typing import Any

import tvm_ffi

from kcache.tilelang import host_link, internals
from kcache.tilelang.callbacks import HOST_CALLBACK

log = logging.getLogger("kcache")

_C_FORMATS = ("c", "cc", "cpp", "cu")  # TVM's export names the host module's file by the first it has
_LINKED_HERE = ("c", "cc", "cpp")  # of those, what host_link compiles itself (a .cu goes to TVM's link)


class _Build:
    """What a prebuild owns: its private directory and its compiler process (kept apart from the
    prebuild, so that a finalizer can clean up after it)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.workspace: str | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def close(self) -> None:
        if os.getpid() != self.pid:  # a fork inherited this object, not the process or the directory
            return
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.workspace is not None:
            shutil.rmtree(self.workspace, ignore_errors=True)
            self.workspace = None


class HostPrebuild:
    """One compile's host code: generated right after the lowering, its object compiled ahead."""

    def __init__(self) -> None:
        self._build = _Build()
        self._finalizer = weakref.finalize(self, self._build.close)
        self._generated: tuple[Any, Any, Any] | None = None  # (host IR, backend context, host module)
        self._compiler: str | None = None
        self._flags: list[str] = []
        self._source_name = ""
        self._source = b""
        self._object = ""

    def generate(self, host_ir: Any, context: Any, host_codegen: Callable[[Any, Any], Any]) -> None:
        """Generate the host code now (TileLang's `host_codegen`), keep it for TileLang's own call,
        and start compiling it. Nothing happens where the backend generates no host code or a host
        callback is in force."""
        backend = getattr(context, "execution_backend", None)
        if (self._generated is not None or not getattr(backend, "enable_host_codegen", False)
                or tvm_ffi.get_global_func(HOST_CALLBACK, allow_missing=True) is not None):
            return
        try:
            host_module = host_codegen(host_ir, context)
        except Exception:  # noqa: BLE001 - TileLang's own call, in its place, raises it again in order
            return
        self._generated = (host_ir, context, host_module)
        try:
            self.start(host_module)
        except Exception as err:  # noqa: BLE001 - a full temporary directory, TVM refusing the write: the link compiles it
            log.debug("kcache: the host code's compile was not started ahead: %s", err)
            self._build.close()

    def generated_for(self, host_ir: Any, context: Any) -> Any | None:
        """The host module generated ahead for exactly this host IR and context, once; else None."""
        generated = self._generated
        if generated is None or generated[0] is not host_ir or generated[1] is not context:
            return None
        self._generated = None
        return generated[2]

    def start(self, host_module: Any) -> None:
        """Write the host module's source as TVM's export would name it, start its `g++ -c`."""
        if getattr(host_module, "kind", None) != "c":
            return
        formats = list(host_module.get_write_formats())
        extension = next((f for f in formats if f in _C_FORMATS), None) if formats else "c"
        compiler = host_link.compiler_for()
        if extension not in _LINKED_HERE or compiler is None:
            return
        from tvm.libinfo import find_include_path  # as TVM's export_library adds them

        self._build.workspace = workspace = tempfile.mkdtemp(prefix="kcache-host-")
        self._source_name = f"lib0.{extension}"  # the host module is the export's first module
        source = os.path.join(workspace, self._source_name)
        host_module.write_to_file(source)
        with open(source, "rb") as written:
            self._source = written.read()
        self._compiler = compiler
        self._flags = ["-I" + path for path in find_include_path()]
        self._object = os.path.join(workspace, "host.o")
        with open(os.path.join(workspace, "compiler-output"), "wb") as output:
            self._build.process = subprocess.Popen(
                host_link.compile_command(compiler, self._flags, source, self._object),
                stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT)

    def take(self, compiler: str, flags: list[str], source: str) -> str | None:
        """The object for `source`, if it was compiled ahead by this command from these bytes and the
        compile succeeded (waiting for it); else None, and the link compiles it."""
        process = self._build.process
        if (process is None or self._build.workspace is None or compiler != self._compiler or flags != self._flags
                or os.path.basename(source) != self._source_name):
            return None
        with open(source, "rb") as exported:
            if exported.read(len(self._source) + 1) != self._source:
                return None
        return self._object if process.wait() == 0 else None

    def close(self) -> None:
        """Stop the compiler if it still runs, remove the directory (also when this object is
        collected, or at exit)."""
        self._generated = None
        self._finalizer()


def install_hooks(active: Callable[[], HostPrebuild | None]) -> None:
    """Route TileLang's split of host and device IR and its host codegen through the prebuild that
    `active` returns for the calling thread (None: TileLang's own behaviour). Called once."""
    # The module, not the function of the same name that `tilelang.engine` exports.
    tl_lower = importlib.import_module("tilelang.engine.lower")
    if not internals.has("tilelang.engine.lower", "lower_to_host_device_ir", "host_codegen"):
        # Another TileLang's lowering (kcache/tilelang/internals.py): its own order of steps, no prebuild.
        return

    original_split = tl_lower.lower_to_host_device_ir
    original_codegen = tl_lower.host_codegen

    def lower_to_host_device_ir(func_or_mod: Any, context: Any, *args: Any, **kwargs: Any) -> Any:
        split = original_split(func_or_mod, context, *args, **kwargs)
        prebuild = active()
        if prebuild is not None and isinstance(split, tuple) and split:  # (host IR, device IR, ...)
            prebuild.generate(split[0], context, original_codegen)
        return split

    def host_codegen(host_ir: Any, context: Any) -> Any:
        prebuild = active()
        generated = prebuild.generated_for(host_ir, context) if prebuild is not None else None
        return generated if generated is not None else original_codegen(host_ir, context)

    tl_lower.lower_to_host_device_ir = lower_to_host_device_ir
    tl_lower.host_codegen = host_codegen
