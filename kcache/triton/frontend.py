"""The front half of a Triton compile, in the caller: the user's kernel turned into Triton's IR.

`ASTSource.make_ir` runs the user's Python (the kernel's body, its globals and constexprs): it belongs
in the caller, where those objects live, and it is not where a compiler crashes (that is MLIR's and
LLVM's passes and ptxas, kcache.triton.stages). What it returns is printed as Triton prints it into
the group's `.source` file; that text, with what the back half needs of the caller's `compile` frame,
is the job (`StagesJob`).

What travels of the caller's settings: its whole environment (Triton's knobs read it at each use),
the knobs it set in memory (`triton.knobs.<group>.<name> = value`, which Triton keeps on the group
object), and its stages hook (`knobs.runtime.add_stages_inspection_hook`, which Triton calls as it
builds a compile's pipeline: the one piece of the program that is part of the back half by Triton's
design, as a profiler's instrumentation pass is). The hook travels as cloudpickle carries it: by
reference for a function of an importable module, by value for a closure or one of `__main__`'s. What
cannot travel (`needs_caller` names it) keeps the compile where the hook is (kcache.triton.isolation).
"""

from __future__ import annotations

import hashlib
import os
from types import FrameType
from typing import Any

from kcache.triton import shared_fronts
from kcache.triton.stages import StagesJob

# Knob groups of Triton 3.5 and 3.6 (triton.knobs) whose values a compile may read.
KNOB_GROUPS = ("build", "cache", "compilation", "autotuning", "runtime", "language", "nvidia", "amd", "proton")


def needs_caller() -> str | None:
    """Why this process's compiles cannot run their back half in a clean worker, or None."""
    import triton.knobs as knobs

    hook = getattr(knobs.runtime, "add_stages_inspection_hook", None)
    if hook is not None and not _travels(hook):
        return "its stages hook (knobs.runtime.add_stages_inspection_hook) cannot be pickled"
    if getattr(knobs.compilation, "use_ir_loc", None):
        return "TRITON_USE_IR_LOC reads the IR back through the cache manager"
    if getattr(knobs.compilation, "dump_ir_extract_di_local_variables", False):
        return ("LLVM_EXTRACT_DI_LOCAL_VARIABLES names variables from the IR's locations, which its text "
                "does not carry whole")
    for group, values in _knobs_set_in_memory().items():
        for name, value in values.items():
            if not _travels(value):
                return f"triton.knobs.{group}.{name} holds {type(value).__name__}, which cannot travel"
    return None


def stages_job(frame: FrameType) -> StagesJob:
    """The back half's job for the compile of `frame` (Triton's `compile`, stopped in `get_group`):
    its front half run here. Raises what `make_ir` raises (a `CompilationError`): the caller then
    compiles in-process, and Triton raises it again, as it would have."""
    from triton import __version__
    from triton._C.libtriton import ir

    local = frame.f_locals
    src, target, options, backend = local["src"], local["target"], local["options"], local["backend"]
    env_vars = local["env_vars"]

    def make(options_read: Any) -> str:
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        return str(src.make_ir(target, options_read, backend.get_codegen_implementation(options_read),
                               backend.get_module_map(), context))

    text = shared_fronts.ir_text(src, target, options, env_vars, make)  # a tune's configs share equal ones
    # `compile`'s own initial metadata, in its order (json.dumps keeps it).
    metadata = {"hash": local["hash"], "target": target, **options.__dict__, **env_vars}
    metadata["triton_version"] = __version__
    import triton.knobs as knobs

    return StagesJob(source=text, source_sha256=hashlib.sha256(text.encode()).hexdigest(), ext=src.ext,
                     language=src.language, file_name=local["file_name"],
                     target=target, options=options, metadata=metadata, environ=dict(os.environ),
                     knobs=_knobs_set_in_memory(), store_only_binary=bool(knobs.compilation.store_binary_only),
                     stages_hook=getattr(knobs.runtime, "add_stages_inspection_hook", None))


def source_file(job: StagesJob) -> tuple[str, bytes]:
    """The group's `.source` file: the IR as the front half made it (Triton's `put(module, ...)`)."""
    return f"{job.file_name}.source", job.source.encode()


def _knobs_set_in_memory() -> dict[str, dict[str, Any]]:
    """The knobs the caller set on Triton's knob groups, by group: the values, not callables (a
    listener or a launch hook runs in the caller; the stages hook is `needs_caller`'s)."""
    import triton.knobs as knobs

    found: dict[str, dict[str, Any]] = {}
    for group_name in KNOB_GROUPS:
        group = getattr(knobs, group_name, None)
        values = {name: value for name, value in getattr(group, "__dict__", {}).items()
                  if not name.startswith("_") and not callable(value)}
        if values:
            found[group_name] = values
    return found


def _travels(value: Any) -> bool:
    """Whether `value` reaches a worker as the service sends jobs (cloudpickle)."""
    import cloudpickle

    try:
        cloudpickle.dumps(value)
    except Exception:  # noqa: BLE001 - whatever pickle refuses stays here
        return False
    return True
