"""Where a fresh process's first compile spends its time, lane by lane: a diagnostic beside
`python -m stress.bench --only cold`, not a goal.

    python -m stress.bench --only cold --profile [--repeats 3] [--kernel add] [--json out.json]

Each sample is a fresh process, as in the bench's cold scenario, on an empty cache: TileLang alone,
kcache compiling in-process, kcache with its compile service running (a worker forked from the
service's template), kcache with no service running (a fork of the caller), and the same with the
cache opened before `import tilelang` (the service starting beside that import). Every event carries
the machine's wall clock, which all processes share:
- the external tools: nvcc and the host compiler (g++) run through logging wrappers, a CUDA_HOME and
  a PATH of their own, in every lane, the service's workers included;
- TileLang's and kcache's steps, by wrapping their functions in the sampled process, which a fork
  of it (the no-service lane's worker) inherits; fsync's count and time per process likewise.
The report gives, per lane, each event's median start (from the call) and duration.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .events import LOG_ENV, events_of, log_event, timed_steps

LANES = ("tilelang", "kcache, in-process", "kcache, service running", "kcache, no service (fork)",
         "kcache, no service, cache opened first")

_TOOL = """#!/bin/sh
s=$(date +%s.%N)
"{real}" "$@"
rc=$?
e=$(date +%s.%N)
case " $* " in *" --version "*|*" -dumpmachine "*) what="{name} (probe)";; *) what="{name}";; esac
echo "{{\\"pid\\": $$, \\"ppid\\": $PPID, \\"what\\": \\"$what\\", \\"start\\": $s, \\"end\\": $e}}" >> "{log}"
exit $rc
"""


def _note_service_warm() -> None:
    """Log the moment this process learns that its compile service has a worker ready (`_warm` set),
    or, when it knew that already, the moment of this call."""
    from kcache.compile.service.client import ServicePool

    def read(pool: Any) -> bool:
        return pool.__dict__.get("_warm_seen", False)

    def write(pool: Any, value: bool) -> None:
        if value and not read(pool):
            now = time.time()
            log_event("kcache caller: the service is warm", now, now)
        pool.__dict__["_warm_seen"] = value

    for pool in [obj for obj in gc.get_objects() if isinstance(obj, ServicePool)]:
        pool.__dict__["_warm_seen"] = pool.__dict__.pop("_warm", False)
        if pool.__dict__["_warm_seen"]:
            now = time.time()
            log_event("kcache caller: the service is warm (before the instrumentation)", now, now)
    ServicePool._warm = property(read, write)


def _instrument() -> None:
    """Wrap the steps of a compile in this process (and so in any fork of it)."""
    from tilelang.cache.kernel_cache import KernelCache as TileLangCache
    from tilelang.jit.kernel import JITKernel

    import kcache.tilelang.compiler as compiler
    import kcache.tilelang.toolchain as toolchain
    import kcache.tilelang.transfer as transfer
    from kcache.cache.compiling import CompileStep
    from kcache.store.entries import EntryStore
    from kcache.tiers.disk import DiskTier
    from kcache.tilelang.host_prebuild import HostPrebuild

    _note_service_warm()
    timed_steps([
        (JITKernel, "_compile_artifact", "tilelang: lower and codegen (nvcc inside)"),
        (JITKernel, "_create_adapter_from_artifact", "tilelang: adapter"),
        (TileLangCache, "_save_kernel_to_disk", "tilelang: its cache's save (g++ link inside)"),
        (transfer, "pack", "kcache caller: transfer.pack"),
        (CompileStep, "_before_compile", "kcache caller: miss log and guard"),
        (EntryStore, "publish", "kcache caller: publish (waits for the worker)"),
        (DiskTier, "load", "kcache caller: load the published entry"),
        (toolchain, "identify_once", "kcache caller: identify the toolchain (or wait for its memo)"),
        (compiler, "compile_kernel", "kcache worker: compile_kernel"),
        (compiler, "write_entry", "kcache worker: write_entry (g++ link inside)"),
        (HostPrebuild, "generate", "kcache: host code generated ahead, its g++ -c started"),
        (HostPrebuild, "take", "kcache: the host object made ahead (waits for its g++ -c)"),
        (os, "fsync", "fsync"),
    ])


def child(lane: str, kernel: str, root: str) -> None:
    from ..cold import compile_once

    log_event("call", *compile_once(lane, kernel, root, time.time, _instrument))


def _tools(work: Path, log: Path) -> dict[str, str]:
    """The wrappers' environment: a CUDA_HOME whose nvcc logs, and g++ first on PATH."""
    from stress.nvcc_counter import shadow_cuda_home

    home = shadow_cuda_home(work / "cuda-home", _TOOL.format(real="{real}", name="nvcc", log=log))
    gxx = shutil.which("g++")
    if gxx:
        wrapper = work / "bin" / "g++"
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(_TOOL.format(real=Path(gxx).resolve(), name="g++", log=log))
        wrapper.chmod(0o755)
    return {"CUDA_HOME": str(home), "CUDA_PATH": str(home), "PATH": f"{work / 'bin'}:{os.environ['PATH']}"}


def _sample(lane: str, kernel: str, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="phase-", dir=work))
    extra = {"TILELANG_CACHE_DIR": str(root / "tilelang"),
             "KCACHE_COMPILE_ISOLATION": "inprocess" if lane.endswith("in-process") else "server"}
    found = events_of("cold", [lane, kernel, str(root)], {**env, **extra}, timeout=600)
    shutil.rmtree(root, ignore_errors=True)
    return found


def _phases(events: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """what -> (start after the call, summed seconds); fsyncs summed per process."""
    (call,) = [e for e in events if e["what"] == "call"]
    caller = call["pid"]
    out: dict[str, list[float]] = {}
    for e in events:
        if e["what"] == "call" or (e["end"] < call["start"] and "service is warm" not in e["what"]):
            continue  # (the service warm before the call stays: its start is then negative)
        what = e["what"] if e["what"] != "fsync" else ("fsync, caller" if e["pid"] == caller else "fsync, worker")
        if what.startswith("kcache worker") and e["pid"] == caller:
            what = what.replace("kcache worker", "kcache in the caller")
        first, total, count = out.get(what, (e["start"] - call["start"], 0.0, 0))
        out[what] = (first, total + e["end"] - e["start"], count + 1)
    result = {what: (first, total) for what, (first, total, _n) in out.items()}
    result["call (total)"] = (0.0, call["end"] - call["start"])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stress.bench.profiles.cold")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kernel", choices=("add", "matmul"), default="add")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", nargs=3, metavar=("LANE", "KERNEL", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return
    from stress.procs import environ
    from stress.service_runtime import own_services, service_name, stop_service, warm_service

    from ..suite.children import bytecode_as_installed
    from ..suite.timing import take_turns

    work = Path(tempfile.mkdtemp(prefix="kcache-phases-"))
    env = {**bytecode_as_installed(), LOG_ENV: str(work / "events.jsonl"), "KCACHE_SERVER_IDLE": "600"}
    env.update(_tools(work, Path(env[LOG_ENV])))

    def sample(lane: str, _turn: int) -> dict[str, tuple[float, float]]:
        if "no service" in lane:
            stop_service(name)
        elif lane.endswith("running"):
            warm_service()  # started, one worker warm
        return _phases(_sample(lane, args.kernel, work, env))

    # The run's environment, wrappers included, for its service too: this process stops and starts it.
    try:
        with own_services("kph-") as runtime, environ({**env, "XDG_RUNTIME_DIR": str(runtime)}):
            name = service_name()
            samples = take_turns(LANES, args.repeats, sample)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report: dict[str, dict[str, dict[str, float]]] = {}
    for lane, runs in samples.items():
        print(f"\n{lane} ({args.kernel}, medians of {len(runs)}): start after the call, seconds")
        names = sorted({w for run in runs for w in run}, key=lambda w: statistics.median(
            run[w][0] for run in runs if w in run))
        report[lane] = {}
        for what in names:
            present = [run[what] for run in runs if what in run]
            start = statistics.median(p[0] for p in present)
            seconds = statistics.median(p[1] for p in present)
            report[lane][what] = {"start_s": round(start, 4), "seconds": round(seconds, 4), "samples": len(present)}
            print(f"  {start:8.3f}  {seconds:8.3f}  {what}" + ("" if len(present) == len(runs) else
                                                             f" (in {len(present)} of {len(runs)})"))
    if args.json:
        args.json.write_text(json.dumps({"kernel": args.kernel, "repeats": args.repeats, "lanes": report}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
