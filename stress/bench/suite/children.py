"""The fresh processes of the bench's scenarios: the environment they start in, and a herd of the
harness's workers (stress.worker) behind its barrier."""

from __future__ import annotations

import compileall
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from stress.procs import PROJECT, Barrier, WorkerResult

BACKENDS = ("kcache", "tilelang")


def bytecode_as_installed() -> dict[str, str]:
    """Both caches' modules load from bytecode, as after a pip install: kcache's compiled now, and the
    children may write theirs. The environment for the children."""
    compileall.compile_dir(str(PROJECT / "kcache"), quiet=1)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return {"PYTHONDONTWRITEBYTECODE": ""}


def released(barrier: Barrier, what: str,
             during: AbstractContextManager[Any] | None = None) -> tuple[float, list[WorkerResult]]:
    """Every process behind `barrier` ready, then released together (within `during`: a monitor of
    theirs) and collected: the release (time.monotonic()) and their results. One that failed, or
    reported errors, raises, named `what` and its index."""
    barrier.wait_ready()
    with during or nullcontext():
        release = barrier.release()
        results = barrier.collect()
    for r in results:
        if r.result is None or r.result["errors"]:
            raise RuntimeError(f"{what} {r.index} failed: {r.result and r.result['errors'][:2]} {r.stderr[-2000:]}")
    return release, results


def run_workers(backend: str, root: Path | None, procs: int, kernels: int, env: dict[str, str],
                extra_args: tuple[str, ...] = (),
                per_worker: Callable[[int], list[str]] | None = None) -> tuple[float, list[WorkerResult]]:
    """`procs` workers of `backend` on `root` (None: each names its own with `per_worker`), released
    together, each getting `kernels` kernels: the wall from the release to the last one's last
    operation, and their results."""
    where = ["--root", str(root)] if root is not None else []
    barrier = Barrier("stress.worker", procs, [*where, "--kernels", str(kernels), "--backend", backend, *extra_args],
                      env=env, per_worker=per_worker)
    release, results = released(barrier, f"{backend} worker")
    return max(op["end"] for r in results for op in r.result["ops"]) - release, results


def get_seconds(results: list[Any]) -> list[float]:
    """Every operation's seconds, of every worker in `results`."""
    return [op["end"] - op["start"] for r in results for op in r.result["ops"]]
