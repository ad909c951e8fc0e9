"""The disk hit of `python -m stress.bench --only disk`: a fresh process imports everything, then one get
call is timed with the entry already on disk (kcache verifies every file's sha256), against TileLang's
own cache. `--profile` breaks the hit into its steps (stress.bench.profiles.disk)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .suite.rows import BACKENDS, get_seconds, percentile, row, run_workers


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    repeats = options.repeats
    samples: dict[str, list[float]] = {backend: [] for backend in BACKENDS}
    opens: list[float] = []
    for backend in BACKENDS:
        run_workers(backend, work / f"disk-{backend}", 1, 1, env)  # populate
    # The backends take turns, one fresh process each: a drift of the machine over the run (page
    # cache, clocks, other tenants) then weighs on both sides alike instead of on one.
    for _ in range(repeats):
        for backend in BACKENDS:
            _, results = run_workers(backend, work / f"disk-{backend}", 1, 1, env)
            samples[backend] += get_seconds(results)
            if backend == "kcache":
                opens += [r.result["open_s"] * 1e3 for r in results]
    ms = {b: [s * 1e3 for s in v] for b, v in samples.items()}
    return [
        # Not part of the timed get: `import kcache` and KernelCache(root) (its modules, the gc check,
        # the backend, the toolchain identity). TileLang does its cache setup inside `import tilelang`.
        row("disk hit (fresh process)", "open: import kcache + KernelCache(root), p50", percentile(opens, 50), None,
            "ms"),
        row("disk hit (fresh process)", f"p50 of {repeats}", percentile(ms["kcache"], 50),
            percentile(ms["tilelang"], 50), "ms"),
        row("disk hit (fresh process)", f"p90 of {repeats}", percentile(ms["kcache"], 90),
            percentile(ms["tilelang"], 90), "ms"),
    ]
