"""The goal each benchmark reading is judged by, as the issues state it, and whether a reading meets it.

A goal reads a row's ratio (kcache / baseline), its own value, or the two values' difference; a reading
no goal names is context (met: None)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Goal:
    scenario: str
    metric: str  # a regular expression searched in the reading's metric
    text: str
    met: Callable[[dict[str, Any]], bool]


def _ratio_at_most(limit: float) -> Callable[[dict[str, Any]], bool]:
    return lambda r: r["ratio"] is not None and r["ratio"] <= limit


def _value_at_most(limit: float) -> Callable[[dict[str, Any]], bool]:
    return lambda r: r["kcache"] is not None and r["kcache"] <= limit


def _one_compile(r: dict[str, Any]) -> bool:
    return r["kcache"] == 1


def _within_usable_cores(r: dict[str, Any]) -> bool:
    cores = re.search(r"usable cores: (\d+)", r["metric"])
    return cores is not None and r["kcache"] <= int(cores.group(1))


def _plus_at_most(ms: float) -> Callable[[dict[str, Any]], bool]:
    return lambda r: r["baseline"] is not None and r["kcache"] - r["baseline"] <= ms


GOALS: tuple[Goal, ...] = (
    Goal("disk", r"^p50 of", "<= 0.5x TileLang's", _ratio_at_most(0.5)),
    Goal("memory", r"p50$", "<= 100 us", _value_at_most(100)),
    Goal("herd", r"compiler runs", "1 compile", _one_compile),
    Goal("herd", r"^\s*with the service.*median", "<= 1.0x TileLang's herd", _ratio_at_most(1.0)),
    Goal("herd", r"all ready, service.*TileLang's one compile", "<= 1.3x one TileLang compile+load",
         _ratio_at_most(1.3)),
    Goal("herd", r"^all ready / one cold compile$", "<= 1.3x one cold compile", _value_at_most(1.3)),
    Goal("cold", r"first compile, server, running", "<= 1.10x TileLang's", _ratio_at_most(1.10)),
    Goal("cold", r"first compile, server, cold", "<= 1.3x TileLang's", _ratio_at_most(1.3)),
    Goal("cold", r"crashed worker replaced", "< 0.2 s", lambda r: r["kcache"] < 0.2),
    Goal("many", r"barrier to all compiled", "<= the per-process pools' wall", _ratio_at_most(1.0)),
    Goal("many", r"peak compile workers", "<= the usable cores", _within_usable_cores),
    Goal("cli", r"kcache stats", "<= 0.5 s", _value_at_most(0.5)),
    Goal("run", r"^kcache run empty.py", "<= python empty.py + 0.1 s", _plus_at_most(0.1)),
    Goal("compile", r"sequential compiles", "<= 1.10x in-process", _ratio_at_most(1.10)),
    Goal("compile", r"parallel \(pool\)", ">= 8x faster than sequential (<= 0.125)", _ratio_at_most(0.125)),
    Goal("remote", r"compiler runs", "1 compile", _one_compile),
    Goal("remote", r"^s3 hit on a fresh root", "<= 2x a Redis hit", _ratio_at_most(2.0)),
    Goal("remote", r"^s3 hit in a warm process", "<= 2x a Redis hit", _ratio_at_most(2.0)),
    Goal("remote", r"^s3 hit vs a cold compile", "< 0.10 of a compile", lambda r: r["ratio"] < 0.10),
    Goal("remote", r"wrong results$", "0 wrong", lambda r: r["kcache"] == 0),
    Goal("triton", r"^p50", "<= Triton's own hit + 1 ms", _plus_at_most(1.0)),
    Goal("triton", r"^compiles$", "1 compile", _one_compile),
    Goal("triton", r"^cold compile", "<= 1.05x Triton's in-process compile", _ratio_at_most(1.05)),
    Goal("triton", r"^autotune compile phase", "<= 0.35x Triton's (16 cores)", _ratio_at_most(0.35)),
    Goal("triton", r"^compile phases together", "<= 0.55x Triton's (16 cores)", _ratio_at_most(0.55)),
    Goal("triton", r"^most assemblies at once", "<= the usable cores", _within_usable_cores),
    Goal("warm", r"^on disk", "<= 0.4x TileLang's", _ratio_at_most(0.4)),
    Goal("tune", r"cold tune", "no slower than TileLang's AutoTuner", _ratio_at_most(1.0)),
    Goal("dropin", r"", "no slower than TileLang's", _ratio_at_most(1.0)),
    Goal("tune-once", r"wall", "<= 1.15x one process tuning alone", _ratio_at_most(1.15)),
    Goal("tune-once", r"compiler runs", "16 compiles (one per config)", lambda r: r["kcache"] == 16),
    Goal("deploy", r"compiles on B", "0 compiles on B", lambda r: r["kcache"] == 0),
    Goal("bundle", r"import rate", ">= 1 GB/s, or the disk's rate (a plain copy's)",
         lambda r: r["kcache"] >= 1.0 or r["ratio"] >= 1.0),
    Goal("multigpu", r"compiler runs, cold", "each kernel compiled once across ranks", _ratio_at_most(0.5)),
    Goal("helion", r"first tune, ready", "<= 1.0x Helion's fork default", _ratio_at_most(1.0)),
    Goal("helion", r"second process, ready", "<= 1.0x Helion alone on its warm local cache", _ratio_at_most(1.0)),
    Goal("helion", r"second process, compiles", "0 compiles", lambda r: r["kcache"] == 0),
    Goal("helion", r"herd of \d+, compiles", "one tune: at most one plain tune's compiles", _ratio_at_most(1.0)),
    Goal("helion", r"distinct picks", "every pick equal", lambda r: r["kcache"] == 1),
    Goal("triton-library", r"^cold", "<= 0.6x plain Triton's cold run", _ratio_at_most(0.6)),
    Goal("triton-library", r"^warm", "<= 1.05x plain Triton on its own warm cache", _ratio_at_most(1.05)),
    Goal("triton-library", r"^second machine .*wall", "<= 0.3x plain Triton's cold run", _ratio_at_most(0.3)),
    Goal("triton-library", r"verdict differs", "0: every test's verdict the same in every run",
         lambda r: r["kcache"] == 0),
)


def judge(scenario: str, reading: dict[str, Any]) -> tuple[str | None, bool | None]:
    """(the goal's text, met) for a reading of `scenario`, or (None, None) where no goal names it."""
    for goal in GOALS:
        if goal.scenario == scenario and re.search(goal.metric, reading["metric"]):
            try:
                return goal.text, bool(goal.met(reading))
            except (TypeError, KeyError):  # a value the goal needs is missing: not judged
                return goal.text, None
    return None, None
