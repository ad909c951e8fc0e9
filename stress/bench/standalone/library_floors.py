"""The floors under the cold run of `python -m stress.bench --only triton-library`, from plain Triton's
own runs: no cache can take a cold run below them.

- tuning alone: plain Triton on a copy of its cold run's cache less the tunes' results (`untuned`):
  every kernel compiled, every tune benchmarking again. A cache of compiled kernels takes away the
  compiles, never the benchmarks.
- tuning alone and each tune's longest compile or C build: that run's time, and what a cold run compiles
  where every tune's configs compile at once, each as fast as alone, before its benchmarks
  (`compiled_at_once_s`): the tune's longest compile or C build (its launcher, which may be built beside
  its compiles but is built in a cold run), and every compile and C build of no tune (the driver's
  module). Read from plain Triton's cold run (stress.bench.jobs.compile_spans): the floor of a cache that
  compiles a tune's configs together and times none of them beside a compile (docs/design/triton.md:
  why). That run, the cold baseline itself, carries Triton's listener for it: a call and a walk up the
  stack per compile, and a source's hash (`ASTSource.hash()`, microseconds) per compile of a tune.
- the same, with each tune's front halves one after another: a tune's configs are turned into IR by the
  kernel's Python, which runs only in the program's process (a project rule: the caller's code runs
  only in the caller), under its one GIL; so a tune's compile phase lasts at least its distinct front
  halves in turn and then a back half (`fronts_in_turn_s`). The floor of any cache that keeps the
  program's code in the program, kcache's design among them.
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


def compiled_at_once_s(spans: dict[str, Any], *, one_gil: bool = False) -> float:
    """Seconds a cold run compiles beyond its tuning alone when each tune's configs and C builds run at
    once: each tune's longest compile or C build, and every compile and C build of no tune, from a run's
    compile spans. `one_gil`: with each tune's front halves one after another (`fronts_in_turn_s`)."""
    builds = spans.get("builds", {"tunes": {}, "alone": []})
    halves = spans.get("halves", {})
    total = 0.0
    for tune in {*spans["tunes"], *builds["tunes"]}:
        longest = max([*spans["tunes"].get(tune, []), *builds["tunes"].get(tune, [])], default=0.0)
        if one_gil and halves.get(tune):
            longest = max(longest, fronts_in_turn_s(halves[tune]))
        total += longest
    return float(total + sum(spans["alone"]) + sum(builds["alone"]))


def fronts_in_turn_s(halves: list[list[Any]]) -> float:
    """The least a tune's compile phase takes where the program's code runs only in its process: the
    front halves, the kernel's Python made IR, one after another under its one GIL, each source's once
    (configs of one source share theirs, as kcache's do), and after the last of them at least the
    shortest back half. From a tune's [source, front s, back s] per compile."""
    fronts: dict[str, float] = {}
    for source, front, _back in halves:
        fronts[source] = min(front, fronts.get(source, front))
    return sum(fronts.values()) + min(back for _source, _front, back in halves)
