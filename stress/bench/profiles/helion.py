"""Where a Helion autotune's time goes, with and without kcache: a diagnostic beside
`python -m stress.bench --only helion` (issue 57's first-tune and second-process goals), not a goal.

    python -m stress.bench --only helion --profile [--kernel matmul] [--turns 1] [--cprofile]

Four fresh `stress.programs.helion_program` processes a turn, as the bench runs them: plain (Helion alone, fresh
caches), first (kcache, fresh root), second (kcache, the first's root, Helion's own cache fresh) and
plain-again (Helion alone on the plain one's warm caches: Helion's own floor for a second process).
In each, and in Helion's precompile children (forked, so wrapped too), the calls named in TIMED are
timed, each to an append-only log; printed per lane as the sum of a turn's seconds, the parent's and
the children's apart. `--cprofile`: the parent's cProfile too, its top cumulative entries under kcache
(`--keep DIR`: each process's pstats file in DIR).
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from stress.procs import PROJECT

from ..standalone.helion import KERNELS, SEED, Lane, finish
from .events import timed

TIMED = [
    "helion.runtime.kernel:BoundKernel.autotune", "helion.runtime.kernel:BoundKernel.compile_config",
    "helion.autotuner.base_cache:AutotuneCacheBase.autotune", "helion.autotuner.base_search:BaseSearch._prepare",
    "helion.autotuner.base_search:BaseSearch.benchmark_batch",
    "helion.autotuner.precompile_future:PrecompileFuture.wait_for_all",
    "triton.runtime.cache:FileCacheManager.get_group", "triton.runtime.cache:FileCacheManager.put",
    "kcache.triton.manager:CacheManager.__init__", "kcache.triton.manager:CacheManager.get_group",
    "kcache.triton.manager:CacheManager.put", "kcache.triton.manager:CacheManager.put_group",
    "kcache.triton.manager:CacheManager._compile_isolated", "kcache.helion.backend:Backend.get",
    "kcache.helion.backend:Backend.put",
]


def child() -> None:
    """In the program's process: every TIMED call appends `pid name seconds` to KT_PROFILE_LOG."""
    log = os.environ["KT_PROFILE_LOG"]
    for dotted in TIMED:
        module_name, _, qualified = dotted.partition(":")
        owner_name, _, name = qualified.rpartition(".")
        try:
            owner = getattr(importlib.import_module(module_name), owner_name)
        except (ImportError, AttributeError):
            continue  # a lane without kcache, or another version: not timed
        wrapped = timed(getattr(owner, name), lambda start, end, name=qualified: _append(log, name, end - start),
                        time.perf_counter)
        setattr(owner, name, staticmethod(wrapped) if isinstance(owner.__dict__.get(name), staticmethod) else wrapped)
    from stress.programs import helion_program

    if not os.environ.get("KT_CPROFILE"):
        helion_program.main()
        return
    profiler = cProfile.Profile()
    profiler.runcall(helion_program.main)
    profiler.dump_stats(os.environ["KT_CPROFILE"])


def _append(log: str, name: str, seconds: float) -> None:
    """`pid name seconds` appended to `log`, as one write: the children append to it at once."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, f"{os.getpid()} {name} {seconds:.6f}\n".encode())
    os.close(fd)


def run(lane: Lane, env: dict[str, str], log: Path, cprofile: Path | None) -> dict[str, Any]:
    env = {**env, "KT_PROFILE_LOG": str(log), **({"KT_CPROFILE": str(cprofile)} if cprofile else {})}
    process = subprocess.Popen([sys.executable, "-m", "stress.bench.profiles.helion", "--child"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=str(PROJECT), env=env)
    result = finish(process)
    sums: dict[str, dict[str, float]] = {"parent": defaultdict(float), "children": defaultdict(float)}
    calls: dict[str, int] = defaultdict(int)
    for line in log.read_text().splitlines() if log.exists() else []:
        pid, name, seconds = line.split()
        sums["parent" if int(pid) == result["pid"] else "children"][name] += float(seconds)
        calls[name] += 1
    return {"ready_s": result["ready_s"], "sums": sums, "calls": dict(calls)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stress.bench.profiles.helion")
    parser.add_argument("--kernel", default="matmul", choices=KERNELS)
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--keep", type=Path, help="with --cprofile: write each process's profile (pstats) here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child()
        return
    work = Path(tempfile.mkdtemp(prefix="kcache-helion-profile-"))
    lane = Lane(work, args.kernel)
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for turn in range(args.turns):
        root = str(work / f"root-{turn}")
        seed = SEED + turn  # the bench's draws
        plain_env = lane.env("plain", None, seed)
        again_env = {**lane.env("again", None, seed), "HELION_CACHE_DIR": plain_env["HELION_CACHE_DIR"],
                     "TRITON_CACHE_DIR": plain_env["TRITON_CACHE_DIR"]}
        for name, env in (("plain", plain_env), ("first", lane.env("first", root, seed)),
                          ("second", lane.env("second", root, seed)), ("plain-again", again_env)):
            cprofile = (args.keep or work) / f"{name}-{turn}.prof" if args.cprofile else None
            found[name].append(run(lane, env, work / f"{name}-{turn}.log", cprofile))
    for name, readings in found.items():
        each = ", ".join(f"{r['ready_s']:.3f}" for r in readings)
        print(f"{name}: ready median {statistics.median(r['ready_s'] for r in readings):.3f} s ({each})")
        for side in ("parent", "children"):
            names = sorted({n for r in readings for n in r["sums"][side]})
            for call in names:
                values = [r["sums"][side].get(call, 0.0) for r in readings]
                print(f"  {side:8} {call:44} {statistics.median(values):8.3f} s  calls {readings[0]['calls'].get(call, 0)}")
        if args.cprofile and name in ("first", "second"):
            stats = pstats.Stats(str((args.keep or work) / f"{name}-0.prof"), stream=sys.stdout)
            stats.sort_stats("cumulative").print_stats("kcache", 25)
    print(json.dumps({name: [r["ready_s"] for r in readings] for name, readings in found.items()}))


if __name__ == "__main__":
    main()
