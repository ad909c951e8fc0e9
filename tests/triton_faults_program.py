"""A program that compiles one Triton kernel in four configs (num_warps 1, 2, 4, 8), as an autotuner
would, with a fault injected into the config num_warps=4's `llir` stage through Triton's own stage
hook (`knobs.runtime.add_stages_inspection_hook`): KT_FAULT = abort | segv | hang | python | hold | none.
Each firing appends this process's pid to KT_FIRED, so a test can tell where the fault ran. `hold`
writes the pid of the process it runs in to the FIFO KT_READY, then waits for a line on the FIFO
KT_HOLD: a test can signal a compile while it runs. KT_HANDLER=PATH: a SIGTERM handler of the
program's own appends the pid it runs in to PATH and raises SystemExit(143), as a training script's
checkpoint-and-requeue handler does. KT_THREADS=0: no ticker thread (a single-threaded program). Then it
compiles a second kernel (softmax), and prints one JSON object: for each config the sha256 of its
cubin, or the exception's type and message; "later": the softmax's cubin; "pid": this process's;
"draw": the program's next draw from `random`, seeded before the compiles (as Helion seeds its search).
A thread ("ticker") counts while the compiles run; "ticks" says it was not disturbed.

    python tests/triton_faults_program.py      (KT_GATE=1: wait for a line on stdin first)
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import random
import signal
import sys
import threading
import time

import triton
import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from stress.programs.triton_programs.compile import add_kernel  # the operator library's elementwise add

TARGET = GPUTarget("cuda", 90, 32)
FAULTY_WARPS = 4


@triton.jit
def softmax_kernel(out, inp, n_cols, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    values = tl.load(inp + tl.program_id(0) * n_cols + cols, mask=cols < n_cols, other=-float("inf"))
    numerator = tl.exp(values - tl.max(values, axis=0))
    tl.store(out + tl.program_id(0) * n_cols + cols, numerator / tl.sum(numerator, axis=0), mask=cols < n_cols)


def inject(fault: str) -> None:
    def hook(self=None, stages=None, options=None, language=None, capability=None):  # noqa: ANN001, ANN202
        if self is None and stages is None:
            # Triton 3.7 and later also call the hook with no arguments, for what it adds to the cache key
            # (a key's suffix and a hash): nothing, as on 3.6, which never calls it so.
            return "", ""
        if stages is None or options.num_warps != FAULTY_WARPS:
            return
        llir = stages["llir"]

        def faulty(src, metadata):  # noqa: ANN001, ANN202
            with open(os.environ["KT_FIRED"], "a") as fired:
                fired.write(f"{os.getpid()}\n")
            if fault == "abort":
                os.abort()
            if fault == "segv":
                ctypes.string_at(0)
            if fault == "hang":
                time.sleep(3600)
            if fault == "python":
                raise ValueError("an injected Python error in the llir stage")
            if fault == "hold":
                with open(os.environ["KT_READY"], "w") as ready:
                    ready.write(f"{os.getpid()}\n")
                with open(os.environ["KT_HOLD"]) as hold:
                    hold.readline()
            return llir(src, metadata)

        stages["llir"] = faulty

    knobs.runtime.add_stages_inspection_hook = hook


def cubin(kernel: object) -> str:
    return hashlib.sha256(kernel.asm["cubin"]).hexdigest()


def on_sigterm(signum: int, frame: object) -> None:
    with open(os.environ["KT_HANDLER"], "a") as handled:
        handled.write(f"{os.getpid()}\n")
    raise SystemExit(143)


def main() -> None:
    inject(os.environ.get("KT_FAULT", "none"))
    if os.environ.get("KT_HANDLER"):
        signal.signal(signal.SIGTERM, on_sigterm)
    if os.environ.get("KT_GATE"):
        print("ready", flush=True)
        sys.stdin.readline()
    ticks = [0]
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.01):
            ticks[0] += 1

    ticker = threading.Thread(target=tick, name="ticker", daemon=True)
    if os.environ.get("KT_THREADS") != "0":
        ticker.start()
    results: dict[str, object] = {}
    random.seed(1000)  # the program's own state: a compile, isolated or not, must leave it as it was
    signature = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    for warps in (1, 2, 4, 8):
        try:
            kernel = triton.compile(ASTSource(add_kernel, signature, {"BLOCK": 1024}), target=TARGET,
                                    options={"num_warps": warps})
            results[str(warps)] = cubin(kernel)
        except Exception as err:  # noqa: BLE001 - reported, as an autotuner would skip the config
            results[str(warps)] = {"type": type(err).__name__, "message": str(err),
                                   "mro": [cls.__name__ for cls in type(err).__mro__]}
    later = triton.compile(ASTSource(softmax_kernel, {"out": "*fp32", "inp": "*fp32", "n_cols": "i32",
                                                      "BLOCK": "constexpr"}, {"BLOCK": 1024}), target=TARGET,
                            options={"num_warps": 8})  # not the faulty config's
    alive = ticker.is_alive() or os.environ.get("KT_THREADS") == "0"  # the other thread lived through the crash
    stop.set()
    if ticker.is_alive():
        ticker.join()
    print(json.dumps({"configs": results, "later": cubin(later), "pid": os.getpid(), "ticks": ticks[0],
                      "draw": random.random(),
                      "ticker_alive": alive}))


if __name__ == "__main__":
    main()


def compile_one(warps: int) -> str:
    """A job for Inductor's compile workers (tests/test_triton_isolation.py): the add kernel with
    `warps`, the fault of KT_FAULT injected, compiled in the worker; its cubin's sha256, or the error."""
    inject(os.environ.get("KT_FAULT", "none"))
    signature = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    try:
        kernel = triton.compile(ASTSource(add_kernel, signature, {"BLOCK": 1024}), target=TARGET,
                                options={"num_warps": warps})
    except Exception as err:  # noqa: BLE001 - what the worker's caller sees
        return f"{type(err).__name__}: {str(err)[:300]}"
    return cubin(kernel)
