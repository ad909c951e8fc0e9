"""A Helion kernel autotuned on the GPU, as Helion's examples write one (issue 57): KT_KERNEL names it,
a matmul by default, or the softmax of Helion's examples/softmax.py, or the layer norm (forward) of its
examples/layer_norm.py; searched by Helion's RandomSearch over 8 configs through Helion's autotune cache
(`autotuner_fn`, the path Helion's default autotuner takes; a fixed `configs=[...]` list bypasses that
cache by Helion's design).

    python -m stress.programs.helion_program      (KT_GATE=1: wait for a line on stdin first;
                                          KT_ABORT=1: the first compile of all, in any process, aborts)

Prints one JSON object: the seconds until the kernel's first result (its tune included), the config
Helion picked, whether the result equals torch's, and the pid."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

import helion
import helion.language as hl
import torch
from triton import knobs


def seeded_search(bound_kernel, args):  # noqa: ANN001, ANN201
    """Helion's RandomSearch of 8 configs, its draws seeded by HELION_AUTOTUNE_RANDOM_SEED as it is
    built: Helion's RandomSearch (1.5.0 and 1.5.1) draws its configs from `random` in its constructor,
    and seeds `random` with that setting only later (`BaseSearch._prepare`). Without this every process
    would tune configs of its own, and two lanes of a bench could not be compared turn by turn."""
    from helion.autotuner import RandomSearch

    seed = os.environ.get("HELION_AUTOTUNE_RANDOM_SEED")
    if seed is not None:
        random.seed(int(seed))
    return RandomSearch(bound_kernel, args, count=8)


def small_search(bound_kernel, args, **kwargs):  # noqa: ANN001, ANN003, ANN201
    """Helion's default autotuner_fn, with `seeded_search`: wrapped by Helion's cache class."""
    from helion.autotuner import cache_classes

    def factory():  # noqa: ANN202
        return seeded_search(bound_kernel, args)

    return cache_classes[bound_kernel.settings.autotune_cache](factory(), autotuner_factory=factory)


@helion.kernel(static_shapes=True, autotuner_fn=small_search)
def matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    m, k = x.size()
    _, n = y.size()
    out = torch.empty([m, n], dtype=x.dtype, device=x.device)
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, x[tile_m, tile_k], y[tile_k, tile_n])
        out[tile_m, tile_n] = acc.to(x.dtype)
    return out


@helion.kernel(autotuner_fn=small_search)
def softmax(x: torch.Tensor) -> torch.Tensor:
    n, _m = x.size()
    out = torch.empty_like(x)
    for tile_n in hl.tile(n):
        out[tile_n, :] = torch.nn.functional.softmax(x[tile_n, :], dim=1)
    return out


@helion.kernel(static_shapes=True, autotuner_fn=small_search)
def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    m, n = x.size()
    out = torch.empty([m, n], dtype=x.dtype, device=x.device)
    for tile_m in hl.tile(m):
        row = x[tile_m, :].to(torch.float32)
        mean = torch.mean(row, dim=-1, keepdim=True)
        centered = row - mean
        variance = torch.mean(centered * centered, dim=-1, keepdim=True)
        normalized = centered * torch.rsqrt(variance + 1e-5)
        out[tile_m, :] = (normalized * weight[:].to(torch.float32) + bias[:].to(torch.float32)).to(x.dtype)
    return out


def example(name: str, device: str = "cuda") -> tuple[Any, tuple[torch.Tensor, ...], torch.Tensor, dict[str, float]]:
    """KT_KERNEL's kernel, its arguments (seeded), torch's result for them, and the tolerance."""
    torch.manual_seed(0)
    x = torch.randn((1024, 1024), device=device, dtype=torch.float16)
    if name == "softmax":
        return softmax, (x,), torch.softmax(x.float(), dim=1), {"atol": 1e-2, "rtol": 1e-2}
    if name == "layer_norm":
        weight = torch.randn(1024, device=device, dtype=torch.float16)
        bias = torch.randn(1024, device=device, dtype=torch.float16)
        expected = torch.nn.functional.layer_norm(x.float(), [1024], weight.float(), bias.float(), eps=1e-5)
        return layer_norm, (x, weight, bias), expected, {"atol": 1e-2, "rtol": 1e-2}
    if name != "matmul":
        raise SystemExit(f"stress.programs.helion_program: KT_KERNEL={name!r}: no such example (matmul, softmax, layer_norm)")
    y = torch.randn((1024, 1024), device=device, dtype=torch.float16)
    return matmul, (x, y), x.float() @ y.float(), {"atol": 0.5, "rtol": 1e-2}


def abort_the_first_compile() -> None:
    def hook(self=None, stages=None, options=None, language=None, capability=None):  # noqa: ANN001, ANN202
        if self is None and stages is None:  # Triton 3.7 and later ask it what it adds to the cache key
            return "", ""
        if stages is None:
            return
        llir = stages["llir"]

        def aborting(src, metadata):  # noqa: ANN001, ANN202
            try:  # the first compile anywhere creates the file, and aborts; every later one compiles
                fd = os.open(os.environ["KT_FIRED"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return llir(src, metadata)
            os.write(fd, f"{os.getpid()}\n".encode())
            os.close(fd)
            os.abort()

        stages["llir"] = aborting

    knobs.runtime.add_stages_inspection_hook = hook


def main() -> None:
    if os.environ.get("KT_ABORT"):
        abort_the_first_compile()
    kernel, args, expected, tolerance = example(os.environ.get("KT_KERNEL", "matmul"))
    torch.cuda.synchronize()
    if os.environ.get("KT_GATE"):
        print("ready", flush=True)
        sys.stdin.readline()
    started = time.perf_counter()
    out = kernel(*args)
    torch.cuda.synchronize()
    ready_s = time.perf_counter() - started
    bound = kernel.bind(args)
    picked = getattr(bound, "_config", None) or getattr(bound, "config", None)
    print(json.dumps({"ready_s": ready_s, "config": str(picked), "pid": os.getpid(),
                      "correct": bool(torch.allclose(out.float(), expected, **tolerance))}))


if __name__ == "__main__":
    main()
