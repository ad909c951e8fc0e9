"""The back half of a Triton compile, in a clean compile worker: Triton's stages from its IR to the cubin.

A Triton compile is two halves. The front (`ASTSource.make_ir`) turns the user's `JITFunction` into
Triton's IR: it runs the user's Python (the kernel's source, its globals, its constexprs), so it runs
in the caller (kcache.triton.frontend). The back is Triton's own pipeline, in C++: MLIR's and LLVM's
passes and ptxas, where a compiler's abort or segfault happens. It runs here, in a worker of the
compile service (a fresh fork of a template that imported Triton before any thread existed), not in a
fork of a program whose threads' locks and runtimes a fork would inherit (only a single-threaded
caller forks itself for it, while the service is not warm: kcache.triton.isolation).

What arrives (`StagesJob`, pickled by the caller): the IR as Triton printed it (the group's `.source`
file), the caller's parsed options, target, initial metadata and environment, the values of Triton's
knobs that the caller set in memory, and its stages hook. The loop below is `triton.compiler.compiler.compile`'s
own (Triton 3.5 to 3.9), less the cache: each stage's output is kept as Triton's manager would have
been handed it, and the group's files come back to the caller, which publishes them.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from kcache.triton.stage_output import StageOutput, captured

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
    source_sha256: str  # of `source`, as the caller made it: checked before the worker parses it
    stages_hook: Any = None  # knobs.runtime.add_stages_inspection_hook of the caller
    last_stage: str | None = None  # where to stop (the template's warm-up: before ptxas); None: every stage


class ArrivedChanged(Exception):
    """What crossed between the caller and the worker is not what was sent: its sha256 differs."""


@dataclass(frozen=True)
class StagesResult:
    """The back half's answer: the group's files with the sha256 of each as the worker made it, and what
    its stages printed (kcache.triton.stage_output)."""

    files: dict[str, bytes]
    sha256: dict[str, str]
    output: StageOutput

    def verified_files(self) -> dict[str, bytes]:
        """The files, each checked against its sha256 here, where they arrived; else ArrivedChanged."""
        for name, data in self.files.items():
            if hashlib.sha256(data).hexdigest() != self.sha256.get(name):
                raise ArrivedChanged(f"the compile's file {name} arrived from its worker changed")
        return self.files


def run_stages(job: StagesJob) -> StagesResult:
    """The group's files, by name, as Triton's in-process compile puts them (less `.source`, which the
    caller has): each stage's output, then the metadata; and what the stages printed, for the caller."""
    if hashlib.sha256(job.source.encode()).hexdigest() != job.source_sha256:
        raise ArrivedChanged(f"the IR of {job.file_name} arrived at its worker changed")
    with captured() as output:
        files = _stages(job)
    return StagesResult(files, {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}, output)


def _stages(job: StagesJob) -> dict[str, bytes]:
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
    names = list(stages)
    for ext, compile_ir in list(stages.items())[names.index(job.ext):names.index(job.last_stage or names[-1]) + 1]:
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
    """One small compile through every stage but the assembler's, in the template before it forks (no
    GPU needed): each worker then starts past what a process's first compile initializes (Triton's
    dialects and its NVIDIA backend, LLVM's targets, the PTX version for ptxas's), as a process after
    its first compile. Not ptxas itself: the template runs no program of the user's environment
    (TRITON_PTXAS_PATH may name a wrapper that counts or logs its runs). It leaves the template with its
    one thread (tests/test_triton_stages.py), and the environment as it was."""
    import triton
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend

    @triton.jit
    def warm_up_kernel(out, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(out + offsets, offsets.to(tl.float32) * 2.0)

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({})
    source = ASTSource(warm_up_kernel, {"out": "*fp32", "BLOCK": "constexpr"}, {"BLOCK": 128})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = source.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                            context)
    text = str(module)
    run_stages(StagesJob(source=text, ext=source.ext, language=source.language, file_name="warm_up_kernel",
                         target=target, options=options, metadata={"hash": "warm-up", "target": target},
                         environ=dict(os.environ), knobs={}, store_only_binary=True,
                         source_sha256=hashlib.sha256(text.encode()).hexdigest(), last_stage="ptx"))
