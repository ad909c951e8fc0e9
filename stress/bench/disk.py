"""The disk hit of `python -m stress.bench --only disk`: a fresh process imports everything, then one get
call is timed with the entry already on disk (kcache verifies every file's sha256), against TileLang's
own cache. `--profile` breaks the hit into its steps (stress.bench.profiles.disk)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .suite.children import BACKENDS, get_seconds, run_workers
from .suite.rows import row
from .suite.timing import percentile, take_turns


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    repeats = options.repeats
    opens: list[float] = []

    def hit_ms(backend: str, _turn: int) -> float:
        """One fresh process's hit, in ms."""
        _, (result,) = run_workers(backend, work / f"disk-{backend}", 1, 1, env)
        if backend == "kcache":
            opens.append(result.result["open_s"] * 1e3)
        return get_seconds([result])[0] * 1e3

    for backend in BACKENDS:
        run_workers(backend, work / f"disk-{backend}", 1, 1, env)  # populate
    ms = take_turns(BACKENDS, repeats, hit_ms)  # one fresh process each
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
