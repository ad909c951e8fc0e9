"""Helion's precompile, compile only, for sm_90 (no GPU needed): the caller compiles one config first
(Helion's baseline), then forks one child per config, all at once, and each child compiles its config
in place (stress.programs.triton_programs.compile's softmax, 8 configs), as Helion's default
`autotune_precompile="fork"` does. Under kcache's manager the caller's compile runs in a fork of its own,
and a child compiles in place (KCACHE_TRITON_ISOLATION=off here; kcache finds Helion's children by their
frames).

    python -m stress.programs.triton_programs.precompile

Prints one JSON object: `children_s`, from the first fork until the last child is reaped, and each
child's exit status (`statuses`, 0 when its compile succeeded)."""

from __future__ import annotations

import json
import os
import time

import triton
from triton.compiler import ASTSource

from stress.programs.triton_programs.compile import KERNELS, TARGET

CONFIGS = [(block, warps) for block in (256, 512, 1024, 2048) for warps in (2, 4)]


def compile_softmax(block: int, warps: int) -> None:
    fn, signature, _ = KERNELS["softmax"]
    triton.compile(ASTSource(fn, signature, {"BLOCK": block}), target=TARGET, options={"num_warps": warps})


def main() -> None:
    compile_softmax(128, 1)  # the baseline, in the caller
    started = time.perf_counter()
    children = []
    for block, warps in CONFIGS:
        child = os.fork()
        if child == 0:
            status = 1
            try:
                os.environ["KCACHE_TRITON_ISOLATION"] = "off"
                compile_softmax(block, warps)
                status = 0
            finally:
                os._exit(status)
        children.append(child)
    statuses = [os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) for child in children]
    print(json.dumps({"children_s": time.perf_counter() - started, "statuses": statuses}), flush=True)


if __name__ == "__main__":
    main()
