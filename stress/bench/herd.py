"""The herd scenario of `python -m stress.bench`: N fresh processes, an empty cache, one kernel, with
per-process pools, with the compile service (started by the herd, opened first, or already running)
and with TileLang's own cache; compiler runs counted by an nvcc wrapper."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..nvcc_counter import NvccCounter
from ..procs import PROJECT, worker_env
from ..service_runtime import own_services, service_names
from .suite.children import BACKENDS, get_seconds, run_workers
from .suite.rows import row

HERD_VARIANTS = ("kcache, pool", "kcache, server", "kcache, server, opened first", "kcache, server running", "tilelang")


def start_warm_service(env: dict[str, str]) -> None:
    """The service warm (stress.service_runtime.warm_service), started in a process of the herd's
    environment: the service's name depends on it."""
    done = subprocess.run([sys.executable, "-c", "from stress.service_runtime import warm_service; warm_service()"],
                          capture_output=True, text=True, env=worker_env(env), cwd=str(PROJECT), check=False,
                          timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"the herd's compile service did not start: {done.stderr[-2000:]}")


def bench_herd(work: Path, procs: int, repeats: int, env: dict[str, str]) -> list[dict[str, Any]]:
    """Medians over `repeats` cold herds (and as many uncontended cold compiles).

    "kcache, pool": each process compiles through its own per-process pool (file locks make it one
    compile). "kcache, server": the herd's processes compile through the compile service, which none of them
    finds running: each process's cache open (after its `import tilelang`) asks for it in the
    background before the barrier (a fresh runtime directory per herd, so nothing is left from the
    last one). "kcache, server, opened first": the same, each process opening its cache before it
    imports TileLang, as a program that calls `kcache.install()` first. "kcache, server running": the
    service runs, one worker warm, before the herd starts."""
    compiles: dict[str, list[int]] = {v: [] for v in HERD_VARIANTS}
    walls: dict[str, list[float]] = {v: [] for v in HERD_VARIANTS}
    singles: dict[str, list[float]] = {b: [] for b in BACKENDS}
    for attempt in range(repeats):
        for variant in HERD_VARIANTS:
            backend = variant.split(",")[0]
            counter = NvccCounter(work / f"nvcc-herd-{variant}-{attempt}")
            with own_services("kh-") as runtime:
                # Every variant names its isolation: the default (server) would make a pool row a service one.
                extra = ({"KCACHE_COMPILE_ISOLATION": "server", "XDG_RUNTIME_DIR": str(runtime)} if "server" in variant
                         else {"KCACHE_COMPILE_ISOLATION": "pool"} if backend == "kcache" else {})
                if variant == "kcache, server running":
                    start_warm_service({**env, **counter.env(), **extra})
                wall, _ = run_workers(backend, work / f"herd-{variant}-{attempt}", procs, 1,
                                      {**env, **counter.env(), **extra},
                                      ("--open-first",) if variant.endswith("opened first") else ())
                services = service_names(runtime) if "server" in variant else []
                if len(services) > 1:  # the warm service was not the herd's: the row would mean nothing
                    raise RuntimeError(f"the herd used {len(services)} compile services: {services}")
            compiles[variant].append(counter.count())
            walls[variant].append(wall)
            if variant in ("kcache, pool", "tilelang"):  # one uncontended compile per backend and attempt
                own_pool = {"KCACHE_COMPILE_ISOLATION": "pool"} if backend == "kcache" else {}  # as the pool herd
                _, results = run_workers(backend, work / f"single-{backend}-{attempt}", 1, 1, {**env, **own_pool})
                singles[backend].append(get_seconds(results)[0])
    wall = {v: statistics.median(walls[v]) for v in HERD_VARIANTS}
    single = {b: statistics.median(singles[b]) for b in BACKENDS}
    runs = {v: max(found) for v, found in compiles.items()}
    alone = "one uncontended TileLang compile+load"
    readings = [  # (metric, kcache's, the baseline's, unit[, the baseline's name])
        (f"compiler runs ({procs} procs, max of {repeats}), own pools", runs["kcache, pool"], runs["tilelang"], "runs"),
        ("  with the service: compiler runs", runs["kcache, server"], runs["tilelang"], "runs"),
        (f"barrier to all ready, own pools, median of {repeats}", wall["kcache, pool"], wall["tilelang"], "s"),
        ("  with the service: compiler runs, cache opened first", runs["kcache, server, opened first"],
         runs["tilelang"], "runs"),
        ("  with the service: compiler runs, service running", runs["kcache, server running"], runs["tilelang"],
         "runs"),
        (f"  with the service, median of {repeats}", wall["kcache, server"], wall["tilelang"], "s"),
        (f"  with the service, cache opened first, median of {repeats}", wall["kcache, server, opened first"],
         wall["tilelang"], "s"),
        (f"  with the service running, median of {repeats}", wall["kcache, server running"], wall["tilelang"], "s"),
        ("one uncontended cold compile+load", single["kcache"], single["tilelang"], "s"),
        ("all ready, own pools / one cold compile", wall["kcache, pool"] / single["kcache"],
         wall["tilelang"] / single["tilelang"], "x"),
        ("all ready, service / TileLang's one compile", wall["kcache, server"], single["tilelang"], "s", alone),
        ("all ready, service, cache opened first / TileLang's one compile", wall["kcache, server, opened first"],
         single["tilelang"], "s", alone),
        ("all ready, service running / TileLang's one compile", wall["kcache, server running"], single["tilelang"],
         "s", alone),
    ]
    return [row("herd", *reading) for reading in readings]


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    return bench_herd(work, options.procs, options.herd_repeats, env)
