"""The cold-path benchmark of `python -m stress.bench --only cold`: a fresh process's first compile.

Each sample is a fresh interpreter that imports TileLang, builds the kernel, and times one call until
the kernel is usable, on an empty cache:
- `tilelang`: `tilelang.compile` in the process (its own cache empty): the baseline;
- `pool`: kcache with its per-process pool (the worker's start and TileLang import included);
- `server, running`: kcache with the compile service already running and warm;
- `server, cold`: kcache with no service running; the cache opens after `import tilelang`: the
  compile runs in a fork of the process (`caller_fork`), and the service starts once it is done;
- `server, cold, cache opened first`: the program opens the cache before it imports TileLang, so
  that the service's start overlaps that import; the compile runs in the service if its template
  is ready by then, else in a fork of the process.
The modes alternate sample by sample, so that drift in the machine hits them alike. Medians.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..procs import environ, run_for_result
from ..service_runtime import own_services, service_name, stop_service, warm_service
from .suite.rows import row
from .suite.timing import take_turns

MODES = ("tilelang", "pool", "server, running", "server, cold", "server, cold, cache opened first")
KERNELS = ("add", "matmul")


def compile_once(lane: str, kernel: str, root: str, clock: Callable[[], float] = time.perf_counter,
                 instrument: Callable[[], None] | None = None) -> tuple[float, float]:
    """A fresh process's first compile of `kernel` ("add" or "matmul"), its imports first as a program's:
    TileLang's own (lane "tilelang"), else kcache's on `root`, whose cache opens before `import tilelang`
    where the lane ends with "opened first". `instrument` runs just before the call; (start, end) of the
    call on `clock`."""
    cache = None
    if lane.endswith("opened first"):
        import kcache

        cache = kcache.KernelCache(root)  # starts the service in the background
    import tilelang

    from ..programs.kernels import CPU_TARGET, matmul, pool

    func = pool(1)[0].build() if kernel == "add" else matmul(1024, 1024, 1024, 128, 128, 32)
    if lane != "tilelang" and cache is None:
        import kcache

        cache = kcache.KernelCache(root)
    if instrument is not None:
        instrument()
    started = clock()
    if cache is None:
        tilelang.compile(func, out_idx=[2], target=CPU_TARGET, execution_backend="tvm_ffi")
    else:
        cache.get_or_compile(func, CPU_TARGET, out_idx=[2])
    return started, clock()


def child(mode: str, kernel: str, root: str) -> None:
    started, ended = compile_once(mode, kernel, root)
    from ..procs import worker_report  # after the timed call: the child imports no more before it

    worker_report({"seconds": ended - started})


def _sample(mode: str, kernel: str, work: Path, env: dict[str, str]) -> float:
    root = Path(tempfile.mkdtemp(prefix="cold-", dir=work))
    extra = {"TILELANG_CACHE_DIR": str(root / "tilelang"),
             "KCACHE_COMPILE_ISOLATION": "pool" if mode == "pool" else "server"}
    found = run_for_result([sys.executable, "-m", "stress.bench.cold", "--child", mode, kernel, str(root)],
                           f"cold sample {mode}/{kernel}", {**env, **extra}, timeout=600)
    shutil.rmtree(root, ignore_errors=True)
    return float(found["seconds"])


def measure(repeats: int, env: dict[str, str], modes: tuple[str, ...] = MODES) -> dict[tuple[str, str], list[float]]:
    """(mode, kernel) -> the seconds of `repeats` fresh processes, in the order measured."""
    work = Path(tempfile.mkdtemp(prefix="kcache-bench-cold-"))

    def sample(lane: tuple[str, str], _turn: int) -> float:
        mode, kernel = lane
        if mode.startswith("server, cold"):
            stop_service(name)
        elif mode == "server, running":
            warm_service()
        return _sample(mode, kernel, work, env)

    # The run's own services, in this process's environment too: it stops and starts them between samples.
    try:
        with own_services("kb-") as runtime, environ({**env, "XDG_RUNTIME_DIR": str(runtime),
                                                      "KCACHE_SERVER_IDLE": "600"}):
            name = service_name()
            return take_turns([(mode, kernel) for kernel in KERNELS for mode in modes], repeats, sample)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def replacement_seconds(repeats: int, env: dict[str, str]) -> dict[str, float]:
    """How long a crashed worker takes to be replaced, median of `repeats` crashes: in the compile
    service (forked from its template) and in a per-process pool (a fresh interpreter that imports
    TileLang). Each crash is a segfault in the worker; the time runs from the crash's reply to the
    replacement's ready (the pool's `warm`, which waits for it)."""
    from kcache.compile.pool.process_pool import TILELANG_PRELOAD, CompilePool
    from kcache.compile.protocol import CallByName
    from kcache.compile.service.client import ServicePool

    segfault = CallByName("ctypes", "string_at")  # of address 0: the worker dies of SIGSEGV
    out: dict[str, list[float]] = {"server (fork)": [], "pool (exec)": []}
    # The one-worker service has a name of its own (the worker count is in it): the run's services all stop.
    with own_services("kr-") as runtime, environ({**env, "XDG_RUNTIME_DIR": str(runtime)}):
        service = ServicePool(1, None, TILELANG_PRELOAD, 600.0, lambda: None)
        own = CompilePool(1, None, preload=TILELANG_PRELOAD)
        for runner, label, warm in ((service, "server (fork)", lambda: service.warm(1, wait=True)),
                                    (own, "pool (exec)", lambda: own.warm(1))):
            warm()
            for _ in range(repeats):
                try:
                    runner.run(segfault, 0, name="segfault")
                except Exception:  # noqa: BLE001 - the crash is the point
                    pass
                started = time.perf_counter()
                warm()
                out[label].append(time.perf_counter() - started)
        own.close()
        service.close()
    return {label: sorted(values)[len(values) // 2] for label, values in out.items()}


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """The first compile per kernel and lane against TileLang's; `--cold-mode` narrows the lanes (TileLang's
    always runs), `--cold-without-pool` leaves out the per-process pool's, which no goal reads."""
    repeats = options.cold_repeats
    modes = MODES if not options.cold_without_pool else tuple(mode for mode in MODES if mode != "pool")
    if options.cold_mode:
        modes = (MODES[0], *(mode for mode in modes[1:] if mode in options.cold_mode))
    samples = measure(repeats, env, modes)
    replaced = replacement_seconds(repeats, env)
    found = []
    for kernel in KERNELS:
        baseline = samples[("tilelang", kernel)]
        for mode in modes[1:]:
            ours = samples[(mode, kernel)]
            found.append({**row("cold (fresh process)", f"{kernel}: first compile, {mode} (p50 of {repeats})",
                                statistics.median(ours), statistics.median(baseline), "s"),
                          "samples": ours, "baseline_samples": baseline})  # in the order measured
    return [*found, row("cold (fresh process)", f"crashed worker replaced, p50 of {repeats}",
                        replaced["server (fork)"], replaced["pool (exec)"], "s", baseline="per-process pool (exec)")]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
