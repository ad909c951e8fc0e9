"""The back half of a Triton compile, in a clean compile worker: Triton's stages from its IR to the cubin.

A Triton compile is two halves. The front (`ASTSource.make_ir`) turns the user's `JITFunction` into
Triton's IR: it runs the user's Python (the kernel's source, its globals, its constexprs), so it runs
in the caller (kcache.triton.frontend). The back is Triton's own pipeline, in C++: MLIR's and LLVM's
passes and ptxas, where a compiler's abort or segfault happens. It runs here, in a worker of the
compile service (a fresh fork of a template that imported Triton before any thread existed), never in
a fork of the caller, whose threads' locks, runtimes and signal handlers a fork would inherit.

What arrives (`StagesJob`, pickled by the caller): the IR as Triton printed it (the group's `.source`
file), the caller's parsed options, target, initial metadata and environment, the values of Triton's
knobs that the caller set in memory, and its stages hook. The loop below is `triton.compiler.compiler.compile`'s
own (Triton 3.5 and 3.6), less the cache: each stage's output is kept as Triton's manager would have
been handed it, and the group's files come back to the caller, which publishes them.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

# Stages whose output Triton keeps when TRITON_STORE_BINARY_ONLY is set (its `compile`).
BINARY_STAGES = ("cubin", "hsaco", "json")


@dataclass(frozen=True)
class StagesJob:
    """What the back half needs, made by the caller from its `compile` frame (kcache.triton.frontend)."""

    source: str  # the IR `make_ir` returned, as Triton prints it into the group's `.source` file
    ext: str  # the stage the source is in: `ttir` (Triton), `ttgir` (Gluon)
    language: Any  # triton.backends.compiler.Language
    file_name: str  # the group's file stem (`src.name[:150]`)
    target: Any  # GPUTarget
    options: Any  # the backend's parsed options (CUDAOptions)
    metadata: dict[str, Any]  # `compile`'s initial metadata: hash, target, options, env vars, version
    environ: dict[str, str]  # the caller's environment: Triton's knobs read it at each use
    knobs: dict[str, dict[str, Any]]  # the knobs the caller set in memory, by group
    store_only_binary: bool
    stages_hook: Any = None  # knobs.runtime.add_stages_inspection_hook of the caller


def run_stages(job: StagesJob) -> dict[str, bytes]:
    """The group's files, by name, as Triton's in-process compile puts them (less `.source`, which the
    caller has): each stage's output, then the metadata."""
    _take_callers_settings(job)
    from triton._C.libtriton import ir
    from triton.compiler.compiler import make_backend, parse

    backend = make_backend(job.target)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    with tempfile.TemporaryDirectory(prefix="kcache-triton-ir-") as private:  # the worker's own, 0700
        path = os.path.join(private, f"{job.file_name}.{job.ext}")
        with open(path, "w", encoding="utf-8") as file:
            file.write(job.source)
        module = parse(path, job.ext, context)  # read now, from the directory made for it
    stages: dict[str, Any] = {}
    backend.add_stages(stages, job.options, job.language)
    metadata = job.metadata
    files: dict[str, bytes] = {}
    for ext, compile_ir in list(stages.items())[list(stages).index(job.ext):]:
        next_module = compile_ir(module, metadata)
        if (ir_override := metadata.get("ir_override")) and ir_override.endswith(f".{ext}"):
            next_module = parse(ir_override, ext, context)  # Triton's own per-config override
        if not job.store_only_binary or ext in BINARY_STAGES:
            files[f"{job.file_name}.{ext}"] = _as_bytes(next_module)
        module = next_module
    files[f"{job.file_name}.json"] = json.dumps(metadata, default=vars).encode()
    return files


def _as_bytes(data: Any) -> bytes:
    """What Triton's `put` stores of a stage's output: bytes as they are, anything else as its text."""
    return data if isinstance(data, bytes) else str(data).encode()


def _take_callers_settings(job: StagesJob) -> None:
    """The caller's environment and in-memory knobs, here: a worker is a fresh fork for this job only,
    so nothing outlives it."""
    os.environ.clear()
    os.environ.update(job.environ)
    import triton.knobs as knobs

    for group_name, values in job.knobs.items():
        group = getattr(knobs, group_name, None)
        if group is not None:
            group.__dict__.update(values)
    knobs.runtime.add_stages_inspection_hook = job.stages_hook


def warm_up_template() -> None:
    """Load Triton's dialects and its NVIDIA backend in the template, before it forks: each worker then
    starts with them loaded, as a process after its first compile."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    context = ir.context()
    ir.load_dialects(context)
    make_backend(GPUTarget("cuda", 90, 32)).load_dialects(context)
