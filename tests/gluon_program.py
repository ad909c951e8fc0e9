"""A Gluon kernel compiled for sm_90 (no GPU needed): Gluon writes num_warps into the IR it makes, and its
layout depends on it, so a change of num_warps alone changes Triton's `.source` too.

    python tests/gluon_program.py      (KT_OPTIONS='{"num_warps": 8}': Triton's options; KT_BLOCK: BLOCK)
"""

from __future__ import annotations

import hashlib
import json
import os

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource


@gluon.jit
def copy_kernel(x, out, BLOCK: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    offsets = gl.arange(0, BLOCK, layout=layout)
    gl.store(out + offsets, gl.load(x + offsets))


if __name__ == "__main__":
    source = GluonASTSource(copy_kernel, {"x": "*fp32", "out": "*fp32", "BLOCK": "constexpr"},
                            {"BLOCK": int(os.environ.get("KT_BLOCK", "128"))})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options=json.loads(os.environ.get("KT_OPTIONS") or "{}"))
    print(json.dumps({"copy": hashlib.sha256(compiled.asm["cubin"]).hexdigest()}), flush=True)
