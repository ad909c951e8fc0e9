"""The floors under the cold run of `python -m stress.bench --only triton-library`, from plain Triton's
own runs: no cache can take a cold run below them.

- tuning alone: plain Triton on a copy of its cold run's cache less the tunes' results (`untuned`):
  every kernel compiled, every tune benchmarking again. A cache of compiled kernels takes away the
  compiles, never the benchmarks.
- tuning alone and each tune's longest compile: that run's time, and what a cold run compiles where every
  tune's configs compile at once, each as fast as alone, before its benchmarks (`compiled_at_once_s`):
  the tune's longest compile, and every compile of no tune. Read from the compiles of plain Triton's
  cold run (stress.bench.jobs.compile_spans): the floor of a cache that compiles a tune's configs
  together and times none of them beside a compile (docs/design/triton.md: why). That run, the cold
  baseline itself, carries Triton's listener for it: a call and a walk up the stack per compile.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any


def untuned(cache: Path) -> Path:
    """A copy of Triton's cache `cache` less its tunes' results (`<kernel>.autotune.json`, Triton 3.3
    and later): a run on it compiles nothing and tunes again. Empty where the cold run made none."""
    copy = cache.with_name(f"{cache.name}-untuned")
    if cache.exists():
        shutil.copytree(cache, copy, ignore=shutil.ignore_patterns("*.autotune.json"))
    else:
        copy.mkdir(parents=True)
    return copy


def compiled_at_once_s(spans: dict[str, Any]) -> float:
    """Seconds a cold run compiles beyond its tuning alone when each tune's configs compile at once:
    each tune's longest compile, and every compile of no tune, from a run's compile spans."""
    return float(sum(max(times) for times in spans["tunes"].values() if times) + sum(spans["alone"]))
