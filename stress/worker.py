"""One stress worker: imports, waits at the barrier, then gets kernels and reports.

Run by `python -m stress` and the benchmarks, never by hand.
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from typing import Any

from .procs import worker_handshake, worker_report


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stress.worker")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--kernels", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--backend", choices=["kcache", "tilelang"], default="kcache")
    p.add_argument("--check-gpu", action="store_true", help="run each kernel against its torch reference")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.backend == "tilelang":
        os.environ["TILELANG_CACHE_DIR"] = args.root
    import tilelang

    from .kernels import CPU_TARGET, pool

    specs = pool(args.kernels)
    funcs = [spec.build() for spec in specs]
    if args.backend == "kcache":
        import kcache

        opened = time.monotonic()
        cache = kcache.KernelCache(args.root)
        open_s = time.monotonic() - opened

        def get(spec: Any, func: Any) -> Any:
            return cache.get_or_compile(func, CPU_TARGET, out_idx=spec.out_idx)
    else:
        cache, open_s = None, None

        def get(spec: Any, func: Any) -> Any:
            return tilelang.compile(func, out_idx=spec.out_idx, target=CPU_TARGET, execution_backend="tvm_ffi")

    worker_handshake()
    ops: list[dict[str, Any]] = []
    errors: list[str] = []
    wrong = 0
    for _ in range(args.rounds):
        for spec, func in zip(specs, funcs):
            start = time.monotonic()
            try:
                kernel = get(spec, func)
                if args.check_gpu:
                    wrong += not _matches(spec, kernel)
            except Exception as err:  # reported to the parent, which decides
                errors.append(f"{spec.name}: {type(err).__name__}: {err}\n{traceback.format_exc()[-2000:]}")
                continue
            ops.append({"kernel": spec.name, "start": start, "end": time.monotonic()})
    worker_report({
        "index": args.index,
        "pid": os.getpid(),
        "ops": ops,
        "errors": errors,
        "wrong_results": wrong,
        "stats": cache.stats() if cache is not None else None,
        "open_s": open_s,
    })


def _matches(spec: Any, kernel: Any) -> bool:
    import torch

    inputs = spec.make_inputs("cuda")
    out = kernel(*inputs)
    expected = spec.reference(*inputs)
    torch.cuda.synchronize()
    return bool(torch.allclose(out.float(), expected.float(), rtol=spec.tolerance, atol=spec.tolerance))


if __name__ == "__main__":
    main()
