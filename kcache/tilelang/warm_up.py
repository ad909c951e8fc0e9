"""The worker template's warm-up: one small kernel lowered before the template forks any worker.

TileLang and TVM initialize much of their lowering lazily, on a process's first lowering: pass and
codegen lookups, the target's attributes, the first layout inference. A service worker is a fresh
fork of the template for every job, so without this every job's lowering was a process's first, and
paid that again: about 15-25 ms of a 40-60 ms lowering of an elementwise kernel on the CPU machine
(docs/benchmarks/history.md, "A warm worker template and waiters woken at the publish"). Lowered
once in the template, it is paid once per service, before the template says it is ready.

What the warm-up leaves behind is the same in every worker, and is what any TileLang process has
after its first lowering: nothing of a job. It never compiles device code (no nvcc), builds no host
library, keeps no kernel, and uses none of kcache's memos. That it changes no output is checked by
the differential corpus, whose service lane compiles in warmed workers and compares byte for byte
with plain TileLang in a fresh process (tests/test_corpus.py), and by tests/test_template_warm_up.py.
(A kernel whose text TileLang itself varies from compile to compile with the process's state, the
MLA decode's, may come out as its other variant, one that plain TileLang also gives.)
A warm-up that fails is only a slower first lowering: it logs and returns.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("kcache")

# An architecture every CUDA TileLang install can lower for; the template does not know its jobs'
# targets, and the lazily built state it warms is the same for any CUDA arch.
WARM_UP_TARGET = {"kind": "cuda", "arch": "sm_90a"}


def small_kernel():  # noqa: ANN201 - a tvm PrimFunc; tvm is imported only here
    """An elementwise kernel: the lowering's common passes, no GEMM or pipeline."""
    import tilelang.language as T

    n, block = 1024, 128

    @T.prim_func
    def main(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32"), C: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, block), threads=block) as bx:
            for i in T.Parallel(block):
                C[bx * block + i] = A[bx * block + i] + B[bx * block + i]

    return main.with_attr("global_symbol", "kcache_template_warm_up")


def lower_once() -> float | None:
    """Lower `small_kernel` to device source (no nvcc, no host library): the seconds it took, or None
    where it failed (logged at debug: the template works without it)."""
    started = time.perf_counter()
    try:
        import tvm
        from tilelang.backend.module import create_backend_context
        from tilelang.engine.lower import lower_with_context

        context = create_backend_context(WARM_UP_TARGET, None, "tvm_ffi")
        with tvm.transform.PassContext(opt_level=3, config={}), context.target:
            lower_with_context(small_kernel(), context, enable_host_codegen=True, enable_device_compile=False)
    except Exception as err:  # noqa: BLE001 - any failure only costs the workers their warm start
        log.debug("kcache: the worker template's warm-up lowering failed: %s", err)
        return None
    return time.perf_counter() - started
