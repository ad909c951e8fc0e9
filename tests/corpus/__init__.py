"""The differential corpus: TileLang kernels written the way real operator libraries write them.

Each module of this package defines `KERNELS`, a list of `CorpusKernel`. The differential test
(tests/test_corpus.py, driven by tests/corpus_driver.py) compiles every kernel with plain TileLang in
a fresh process and with kcache in every compile lane (in-process, a fork of the caller, the compile
service, the per-process pool), and compares the device source and the cubin's machine code byte for
byte. On the GPU machine it also launches each kernel and checks it against torch (`gpu_check`).

Importing a corpus module must be cheap and must not compile anything: `build` does the work.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The modules of the corpus, in the order they run.
MODULES = ("gemm", "attention", "misc")


@dataclass(frozen=True)
class CorpusKernel:
    """One kernel of the corpus.

    - `name`: unique across the corpus, [a-z0-9_].
    - `build()`: returns the PrimFunc to compile (a fresh one each call). For style "jit" it returns
      the `@tilelang.jit`-decorated object's kernel instead: see `style`.
    - `style`: "prim_func" (compiled with `tilelang.compile(build(), out_idx=, pass_configs=)` by plain
      TileLang and `kcache.get_or_compile(build(), target, out_idx=, pass_configs=)` by kcache), or
      "jit" (`build()` calls a `@tilelang.jit` function, lazy or eager, and returns the JITKernel it
      gives; the driver runs it with `kcache.install()` for the kcache lanes).
    - `gpu_check(kernel)`: launches the compiled kernel on the current CUDA device with inputs it
      makes, compares with a torch reference, and raises AssertionError when they differ.
    - `features`: the idioms it covers (free text tags), for the coverage table.
    """

    name: str
    build: Callable[[], Any]
    gpu_check: Callable[[Any], None]
    out_idx: list[int] | None = None
    pass_configs: dict[str, Any] | None = None
    style: str = "prim_func"
    features: tuple[str, ...] = field(default_factory=tuple)


def all_kernels() -> list[CorpusKernel]:
    kernels: list[CorpusKernel] = []
    for module in MODULES:
        kernels.extend(importlib.import_module(f"tests.corpus.{module}").KERNELS)
    names = [k.name for k in kernels]
    duplicates = {n for n in names if names.count(n) > 1}
    assert not duplicates, f"corpus names must be unique: {sorted(duplicates)}"
    return kernels
