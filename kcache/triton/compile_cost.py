"""How long a Triton back half will take, relative to others: the compile service runs a client's costliest
queued job first (kcache.compile.service.scheduler), so that a tune's last compiles are its short ones.

Triton lowers every op on a tensor to code for each of a kernel's threads: a tensor of E elements in a
kernel of W warps gives each of its 32 W threads E / (32 W) elements, unrolled into LLVM IR. What LLVM's
passes and ptxas then work through, and so the back half's time, grows with the elements per thread of
all the IR's tensor results together; that sum is the estimate. It needs nothing but the IR the caller
made (the job's source) and the job's `num_warps`, and says nothing of any particular kernel: measured
on sm_90, its rank correlation with the back halves' times over a tune's configs was 0.90 to 0.97 for a
matmul, an attention, a layer norm and an Inductor-style reduction (docs/design/triton.md).

Only an order is asked of it: a job's estimate decides which of its own client's queued jobs starts
first, never whether or how it compiles.
"""

from __future__ import annotations

import re
from math import prod
from typing import Any

# A tensor type's shape: `tensor<128x64xf16>`, `tensor<128x64x!tt.ptr<f16>>`, `tensor<1024xi1>`.
_TENSOR_SHAPE = re.compile(r"tensor<((?:\d+x)+)")
_LOCATION = re.compile(r"\s+loc\(.*\)\s*$")  # the location a printed op ends with


def per_thread_elements(ir_text: str, num_warps: int, threads_per_warp: int = 32) -> float:
    """The elements per thread of every tensor result of the ops in `ir_text` (Triton's IR, as
    `make_ir` prints it), summed."""
    elements = 0
    for line in ir_text.splitlines():
        if "=" not in line or "tensor<" not in line or line.lstrip().startswith("#"):
            continue
        text = _LOCATION.sub("", line)
        result_type = text.rsplit("->" if "->" in text else ":", 1)[-1]
        shapes = _TENSOR_SHAPE.findall(result_type)
        if shapes:
            elements += prod(int(size) for size in shapes[-1].rstrip("x").split("x"))
    return elements / (max(num_warps, 1) * max(threads_per_warp, 1))


def estimated_cost(job: Any) -> float | None:
    """The estimate for a `StagesJob` (kcache.triton.stages); None where its options carry no warp count."""
    num_warps = getattr(job.options, "num_warps", None)
    if not isinstance(num_warps, int):
        return None
    return per_thread_elements(job.source, num_warps, getattr(job.target, "warp_size", 32) or 32)
