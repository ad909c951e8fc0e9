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
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kcache.compile.protocol import readable_within

from ..service_runtime import stop_services

MODES = ("tilelang", "pool", "server, running", "server, cold", "server, cold, cache opened first")
KERNELS = ("add", "matmul")


def child(mode: str, kernel: str, root: str) -> None:
    cache = None
    if mode.endswith("opened first"):
        import kcache

        cache = kcache.KernelCache(root)  # starts the service in the background
    import tilelang

    from ..programs.kernels import CPU_TARGET, matmul, pool

    func = pool(1)[0].build() if kernel == "add" else matmul(1024, 1024, 1024, 128, 128, 32)
    if mode != "tilelang" and cache is None:
        import kcache

        cache = kcache.KernelCache(root)
    started = time.perf_counter()
    if cache is None:
        tilelang.compile(func, out_idx=[2], target=CPU_TARGET, execution_backend="tvm_ffi")
    else:
        cache.get_or_compile(func, CPU_TARGET, out_idx=[2])
    from .suite.rows import print_result  # after the timed call: the child imports no more before it

    print_result({"seconds": time.perf_counter() - started})


def _sample(mode: str, kernel: str, work: Path, env: dict[str, str]) -> float:
    from .suite.rows import child_result

    root = Path(tempfile.mkdtemp(prefix="cold-", dir=work))
    extra = {"TILELANG_CACHE_DIR": str(root / "tilelang"),
             "KCACHE_COMPILE_ISOLATION": "pool" if mode == "pool" else "server"}
    found = child_result([sys.executable, "-m", "stress.bench.cold", "--child", mode, kernel, str(root)],
                         f"cold sample {mode}/{kernel}", env={**os.environ, **env, **extra}, timeout=600)
    shutil.rmtree(root, ignore_errors=True)
    return float(found["seconds"])


def _service(env: dict[str, str]) -> tuple[Any, str]:
    """The service the children of this run use: its module and name (same settings as theirs)."""
    os.environ.update(env)
    from kcache.compile.jobs import usable_cpu_count
    from kcache.compile.pool.process_pool import TILELANG_PRELOAD
    from kcache.compile.service import connection as service_connection
    from kcache.compile.service.address import identity

    workers = int(os.environ.get("KCACHE_COMPILE_WORKERS") or usable_cpu_count())
    return service_connection, identity(TILELANG_PRELOAD, workers)


def _stop(connection: Any, name: str) -> None:

    try:
        pid = connection.request(name, ("stop",))
    except (OSError, EOFError):
        return
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        readable_within(fd, 60)
    finally:
        os.close(fd)


def measure(repeats: int, env: dict[str, str], modes: tuple[str, ...] = MODES) -> dict[tuple[str, str], list[float]]:
    """(mode, kernel) -> the seconds of `repeats` fresh processes, in the order measured."""
    work = Path(tempfile.mkdtemp(prefix="kcache-bench-cold-"))
    runtime = Path(tempfile.mkdtemp(prefix="kb-", dir="/tmp"))  # the run's own services
    env = {**env, "XDG_RUNTIME_DIR": str(runtime), "KCACHE_SERVER_IDLE": "600"}
    client, name = _service(env)
    from kcache.compile.pool.process_pool import TILELANG_PRELOAD
    from kcache.compile.service import client as service_client  # the pool; `client` is the connection

    samples: dict[tuple[str, str], list[float]] = {(m, k): [] for m in modes for k in KERNELS}
    try:
        for _ in range(repeats):
            for kernel in KERNELS:
                for mode in modes:
                    if mode.startswith("server, cold"):
                        _stop(client, name)
                    elif mode == "server, running":
                        service = service_client.ServicePool(None, None, TILELANG_PRELOAD, 600.0, lambda: None)
                        service.run(abs, -1)  # started, and one worker warm (TileLang imported)
                        service.close()
                    samples[(mode, kernel)].append(_sample(mode, kernel, work, env))
    finally:
        stop_services(runtime)  # every service this run started, whatever its name
        shutil.rmtree(work, ignore_errors=True)
    return samples


def replacement_seconds(repeats: int, env: dict[str, str]) -> dict[str, float]:
    """How long a crashed worker takes to be replaced, median of `repeats` crashes: in the compile
    service (forked from its template) and in a per-process pool (a fresh interpreter that imports
    TileLang). Each crash is a segfault in the worker; the time runs from the crash's reply to the
    replacement's ready (the pool's `warm`, which waits for it)."""
    from kcache.compile.pool.process_pool import TILELANG_PRELOAD, CompilePool
    from kcache.compile.protocol import CallByName

    runtime = Path(tempfile.mkdtemp(prefix="kr-", dir="/tmp"))
    saved = {name: os.environ.get(name) for name in ("XDG_RUNTIME_DIR", *env)}
    os.environ.update({**env, "XDG_RUNTIME_DIR": str(runtime)})
    segfault = CallByName("ctypes", "string_at")  # of address 0: the worker dies of SIGSEGV
    out: dict[str, list[float]] = {"server (fork)": [], "pool (exec)": []}
    try:
        _service(env)
        from kcache.compile.service import client as service_client

        service = service_client.ServicePool(1, None, TILELANG_PRELOAD, 600.0, lambda: None)
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
    finally:
        # The one-worker service has a name of its own (the worker count is in it): stop them all.
        stop_services(runtime)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return {label: sorted(values)[len(values) // 2] for label, values in out.items()}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """The first compile per kernel and lane against TileLang's; `--cold-mode` narrows the lanes (TileLang's
    always runs), `--cold-without-pool` leaves out the per-process pool's, which no goal reads."""
    from .suite.rows import row

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
