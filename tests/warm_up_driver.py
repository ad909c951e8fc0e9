"""Lowers the prim_func kernels of the corpus to source (no nvcc), optionally after the worker
template's warm-up, and prints {name: [sha256 of device source + host source, ...]} as JSON: the
distinct outputs of `--times` lowerings each (tests/test_template_warm_up.py compares a fresh
process with a warmed one).

    python -m tests.warm_up_driver [--warm] [--only NAME,NAME] [--times N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging

logging.disable(logging.INFO)  # TileLang logs at INFO on stdout

import tilelang  # noqa: E402, F401 - puts its TVM on sys.path
import tvm  # noqa: E402
from tilelang.backend.module import create_backend_context  # noqa: E402
from tilelang.engine.lower import lower_with_context  # noqa: E402

from kcache.tilelang import warm_up  # noqa: E402
from tests.corpus import all_kernels  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--warm", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument("--times", type=int, default=1)
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    warmed = None
    if args.warm:
        warmed = warm_up.lower_once()
        assert warmed is not None, "the warm-up lowering failed"
    context = create_backend_context(warm_up.WARM_UP_TARGET, None, "tvm_ffi")
    digests: dict[str, list[str]] = {}
    for kernel in all_kernels():
        if kernel.style != "prim_func" or (only and kernel.name not in only):
            continue
        seen = digests.setdefault(kernel.name, [])
        for _ in range(args.times):
            with tvm.transform.PassContext(opt_level=3, config=kernel.pass_configs or {}), context.target:
                artifact = lower_with_context(kernel.build(), context, enable_host_codegen=True,
                                              enable_device_compile=False)
            digest = hashlib.sha256((artifact.kernel_source + "\0" + str(artifact.host_mod)).encode()).hexdigest()
            if digest not in seen:
                seen.append(digest)
    print(json.dumps({"warmed_s": warmed, "digests": digests}))


if __name__ == "__main__":
    main()
