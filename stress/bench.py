"""`python -m stress.bench`: kcache and TileLang's own cache, side by side, in one run.

Scenarios (each measured for both caches on the same kernels):
- herd: N fresh processes, an empty cache, one kernel. Compiler runs are
  counted by an nvcc wrapper; wall time runs from the barrier until every
  process holds its kernel, and is compared with one uncontended cold
  compile plus load.
- disk hit: a fresh process imports everything, then one get call is timed
  with the entry already on disk (kcache verifies every file's sha256).
- memory hit: repeated calls in one process, on the same PrimFunc object and
  on a structurally equal fresh one.
- cli: `kcache stats`, `ls` and `verify` on 10,000 entries, each in a fresh
  interpreter (TileLang has no such tool: no baseline).
- cold: a fresh process's first compile on an empty cache, TileLang in-process against kcache with
  its per-process pool, with the compile service running, and with none yet (stress/bench_cold.py).
- many: 8 fresh processes that each `compile_many` the same 16 matmul configs at once, with
  per-process pools and with the compile service: wall, peak compile workers machine-wide and
  their memory (stress/bench_many.py).
- remote: with a real redis-server and a real S3-protocol server (stress.s3_server), the remote
  hit of a fresh process on a fresh root, Redis's against a local disk hit and a compile, S3's
  against Redis's and a compile; a cold cluster (16 processes over 4 roots) on one Redis, with and
  without it; a cold fleet (32 processes over 8 roots) on one bucket, compiler runs counted, and on
  a GPU every kernel checked against torch (stress/bench_remote.py).
- triton: Triton's kernels with kcache's cache manager against Triton's own: a fresh process's hit,
  and a herd's compiles (stress/bench_triton.py).
- warm: one fresh process gets 200 distinct kernels already on disk (and from a bundle it imports
  first), against TileLang loading them from its cache (stress/bench_warm.py).
- compile: kcache's isolated compile pool against compiling in-process,
  sequential and parallel (see stress/bench_compile.py); the baseline column
  is kcache's in-process compile there, not TileLang.

A scenario whose tools are missing here (redis-server or the redis package for remote, a CUDA
toolkit for the ones that compile) is skipped with one line saying why and what to install.

The bench runs its children's compile services in a runtime directory of its own and stops them at
its end, with every process it started. SIGINT or SIGTERM stops it with one line: the scenarios done,
their rows (written to `--json FILE` if given), the work directory removed; exit status 130 or 143.

Prints a table; `--json FILE` writes rows
{"scenario", "metric", "kcache", "tilelang", "ratio", "unit", "baseline"}; "tilelang" holds the
baseline's value, which is TileLang's cache unless "baseline" says otherwise.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kcache.tools.interruption import Interrupted, ignore_further_signals

from .bench_cold import MODES as COLD_MODES
from .bench_herd import bench_herd
from .bench_needs import unavailable
from .bench_rows import BACKENDS, format_value, get_seconds, percentile, row, run_workers
from .command_scope import command_scope
from .procs import PROJECT, worker_env

SCENARIOS = ("herd", "disk", "memory", "compile", "cli", "remote", "cold", "many", "triton", "warm")


def bench_triton(work: Path, repeats: int, procs: int, env: dict[str, str]) -> list[dict[str, Any]]:
    from .bench_triton import measure

    return measure(work, repeats, procs, env)


def bench_warm(work: Path, kernels: int, repeats: int, env: dict[str, str]) -> list[dict[str, Any]]:
    from .bench_warm import measure

    return measure(work, kernels, repeats, env)


def bench_many(procs: int, configs: int, env: dict[str, str]) -> list[dict[str, Any]]:
    from kcache.compile.jobs import usable_cpu_count

    from .bench_many import measure

    m = measure(procs, configs, env)
    for mode, measured in m.items():  # where the peak's workers came from: in the log, not in a row
        print(f"many: {mode}: workers at the peak by parent: {json.dumps(measured['peak_parents'])}", flush=True)
    scenario = f"many ({procs} procs x {configs})"
    server, pool = m["server"], m["pool"]
    return [
        row(scenario, "barrier to all compiled", server["wall_s"], pool["wall_s"], "s", baseline="per-process pools"),
        row(scenario, f"peak compile workers (usable cores: {usable_cpu_count()})", server["peak_workers"],
            pool["peak_workers"], "procs", baseline="per-process pools"),
        row(scenario, "peak workers' RSS summed", server["peak_rss_bytes"] / 2**30, pool["peak_rss_bytes"] / 2**30,
            "GiB", baseline="per-process pools"),
        row(scenario, "peak workers' PSS summed", server["peak_pss_bytes"] / 2**30, pool["peak_pss_bytes"] / 2**30,
            "GiB", baseline="per-process pools"),
    ]


def bench_disk_hit(work: Path, repeats: int, env: dict[str, str]) -> list[dict[str, Any]]:
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
        row("disk hit (fresh process)", f"p50 of {repeats}", percentile(ms["kcache"], 50), percentile(ms["tilelang"], 50), "ms"),
        row("disk hit (fresh process)", f"p90 of {repeats}", percentile(ms["kcache"], 90), percentile(ms["tilelang"], 90), "ms"),
    ]


def bench_memory_hit(work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "stress.bench", "--memory-worker", str(work / "memory")],
        capture_output=True, text=True, env=worker_env(env), cwd=str(PROJECT), check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("result ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"memory-hit worker failed: {done.stderr[-3000:]}")
    us = json.loads(lines[-1][len("result "):])
    return [
        row("memory hit", "same PrimFunc, p50", us["kcache_same_p50"], us["tilelang_same_p50"], "us"),
        row("memory hit", "same PrimFunc, p99", us["kcache_same_p99"], us["tilelang_same_p99"], "us"),
        row("memory hit", "equal PrimFunc, p50", us["kcache_equal_p50"], us["tilelang_equal_p50"], "us"),
        row("memory hit", "equal PrimFunc, p99", us["kcache_equal_p99"], us["tilelang_equal_p99"], "us"),
    ]


def bench_compile(sequential: int, parallel: int, workers: str, env: dict[str, str]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "stress.bench_compile", str(sequential), str(parallel), workers],
        capture_output=True, text=True, env=worker_env(env), cwd=str(PROJECT), check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("result ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"compile bench failed: {done.stderr[-3000:]}")
    r = json.loads(lines[-1][len("result "):])
    scenario = f"compile ({r['workers']} workers)"
    return [
        row(scenario, f"pool start-up, {r['workers']} workers", r["pool_startup_s"], None, "s"),
        row(scenario, f"{sequential} sequential compiles", r["sequential_pool_s"], r["sequential_inprocess_s"], "s",
            baseline="in-process"),
        row(scenario, f"{parallel} configs: parallel (pool) vs sequential", r["parallel_pool_wall_s"],
            r["parallel_inprocess_sequential_s"], "s", baseline="in-process"),
    ]


def bench_cli(work: Path, entries: int, repeats: int, env: dict[str, str]) -> list[dict[str, Any]]:
    from .bench_cli import measure

    samples = measure(work, entries, repeats, worker_env(env))
    return [row(f"cli ({entries} entries)", f"kcache {command}, p50 of {repeats}", percentile(s, 50), None, "s", "-")
            for command, s in samples.items()]


def bench_remote(procs: int, env: dict[str, str]) -> list[dict[str, Any]]:
    from .bench_remote import measure
    from .s3_server import S3ServerMissing, check_installed

    try:
        check_installed()
        s3 = True
    except S3ServerMissing as missing:
        print(f"remote: no S3 rows: {missing}", file=sys.stderr)
        s3 = False
    check_gpu = _gpu_visible()
    r = measure(10, procs, 4, env, s3=s3, check_gpu=check_gpu)
    scenario = "remote (same host)"
    rows = [
        row(scenario, "redis hit on a fresh root (fetch, verify, publish, load), p50", r["redis_hit_ms"],
            r["disk_hit_ms"], "ms", baseline="local disk hit"),
        row(scenario, "redis hit vs a cold compile", r["redis_hit_ms"], r["compile_ms"], "ms", baseline="compile"),
        row(scenario, f"cold cluster: {procs} procs over 4 roots, one Redis, compiler runs", r["herd_redis"]["compiles"],
            r["herd_local"]["compiles"], "runs", baseline="no remote tier"),
    ]
    if s3:
        fleet = r["herd_s3"]
        rows += [
            row(scenario, "s3 hit on a fresh root (fetch, verify, publish, load), p50", r["s3_hit_ms"],
                r["redis_hit_ms"], "ms", baseline="redis hit (goal <= 2x)"),
            row(scenario, "s3 hit vs a cold compile", r["s3_hit_ms"], r["compile_ms"], "ms",
                baseline="compile (goal < 0.10)"),
            row(scenario, "cold fleet: 32 procs over 8 roots, one bucket, compiler runs", fleet["compiles"], 1, "runs",
                baseline="one kernel"),
            row(scenario, "cold fleet: wrong results" + ("" if check_gpu else " (no GPU: not run)"), fleet["wrong"],
                0, "kernels", baseline="-"),
        ]
    return rows


def _gpu_visible() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def memory_worker(work: Path, calls: int = 2000) -> None:
    os.environ["TILELANG_CACHE_DIR"] = str(work / "tilelang")
    import logging

    import tilelang

    import kcache

    from .kernels import CPU_TARGET, elementwise_add

    # TileLang logs a warning on every memory hit; keep it out of the timing.
    logging.getLogger("tilelang").setLevel(logging.ERROR)
    cache = kcache.KernelCache(work / "kcache")
    getters = {
        "kcache": lambda f: cache.get_or_compile(f, CPU_TARGET, out_idx=[2]),
        "tilelang": lambda f: tilelang.compile(f, out_idx=[2], target=CPU_TARGET, execution_backend="tvm_ffi"),
    }
    out: dict[str, float] = {}
    for name, get in getters.items():
        func = elementwise_add()
        get(func)
        for mode, funcs in (("same", [func] * calls), ("equal", [elementwise_add() for _ in range(calls // 4)])):
            samples = []
            for f in funcs:
                start = time.perf_counter()
                get(f)
                samples.append((time.perf_counter() - start) * 1e6)
            out[f"{name}_{mode}_p50"] = statistics.median(samples)
            out[f"{name}_{mode}_p99"] = percentile(samples, 99)
    print("result " + json.dumps(out), flush=True)


def bench_cold_rows(repeats: int, env: dict[str, str], with_pool: bool = True,
                    only_modes: list[str] | None = None) -> list[dict[str, Any]]:
    from .bench_cold import KERNELS, measure, replacement_seconds

    modes = COLD_MODES if with_pool else tuple(mode for mode in COLD_MODES if mode != "pool")
    if only_modes:  # TileLang's, and these: more rounds of the lanes in question within one call
        modes = (COLD_MODES[0], *(mode for mode in modes[1:] if mode in only_modes))
    samples = measure(repeats, env, modes)
    replaced = replacement_seconds(repeats, env)
    rows = []
    for kernel in KERNELS:
        baseline = samples[("tilelang", kernel)]
        for mode in modes[1:]:
            ours = samples[(mode, kernel)]
            rows.append({**row("cold (fresh process)", f"{kernel}: first compile, {mode} (p50 of {repeats})",
                               statistics.median(ours), statistics.median(baseline), "s"),
                         "samples": ours, "baseline_samples": baseline})  # in the order measured
    return [*rows, row("cold (fresh process)", f"crashed worker replaced, p50 of {repeats}", replaced["server (fork)"],
                       replaced["pool (exec)"], "s", baseline="per-process pool (exec)")]


def bytecode_as_installed() -> dict[str, str]:
    """Both caches' modules load from bytecode, as after a pip install: kcache's compiled now, and the
    children may write theirs. The environment for the children."""
    compileall.compile_dir(str(PROJECT / "kcache"), quiet=1)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return {"PYTHONDONTWRITEBYTECODE": ""}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stress.bench", description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, default=4, help="herd size (use 16 on a 16-core machine)")
    p.add_argument("--repeats", type=int, default=10, help="fresh processes per disk-hit measurement")
    p.add_argument("--herd-repeats", type=int, default=3, help="cold herds per cache (medians are reported)")
    p.add_argument("--only", choices=SCENARIOS, action="append", help="run only these scenarios")
    p.add_argument("--sequential", type=int, default=8, help="distinct kernels compiled one by one (compile scenario)")
    p.add_argument("--parallel", type=int, default=16, help="configs compiled at once (compile scenario)")
    p.add_argument("--cli-entries", type=int, default=10_000, help="entries for the cli scenario")
    p.add_argument("--compile-workers", default="auto", help="pool size for the compile scenario (default: CPU count)")
    p.add_argument("--cold-repeats", type=int, default=5, help="fresh processes per mode (cold scenario)")
    p.add_argument("--cold-without-pool", action="store_true",
                   help="leave out the per-process pool's mode, which no goal reads (cold scenario)")
    p.add_argument("--cold-mode", action="append", choices=COLD_MODES[1:],
                   help="run only TileLang's mode and this one (repeatable; cold scenario)")
    p.add_argument("--many-procs", type=int, default=8, help="processes (many scenario)")
    p.add_argument("--many-configs", type=int, default=16, help="configs each process compiles (many scenario)")
    p.add_argument("--warm-kernels", type=int, default=200, help="kernels on disk (warm scenario)")
    p.add_argument("--warm-repeats", type=int, default=3, help="fresh processes per mode (warm scenario)")
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--memory-worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_worker:
        memory_worker(Path(args.memory_worker))
        return 0

    env = bytecode_as_installed()
    only = set(args.only or SCENARIOS)
    for scenario in SCENARIOS:
        reason = unavailable(scenario) if scenario in only else None
        if reason is not None:
            print(f"{scenario}: skipped: {reason}", flush=True)
            only.discard(scenario)
    measures: dict[str, Callable[[], list[dict[str, Any]]]] = {
        "memory": lambda: bench_memory_hit(work, env),
        "disk": lambda: bench_disk_hit(work, args.repeats, env),
        "herd": lambda: bench_herd(work, args.procs, args.herd_repeats, env),
        "remote": lambda: bench_remote(16, env),
        "cli": lambda: bench_cli(work, args.cli_entries, 5, env),
        "compile": lambda: bench_compile(args.sequential, args.parallel, args.compile_workers, env),
        "cold": lambda: bench_cold_rows(args.cold_repeats, env, not args.cold_without_pool, args.cold_mode),
        "many": lambda: bench_many(args.many_procs, args.many_configs, env),
        "triton": lambda: bench_triton(work / "triton", args.repeats, args.procs, env),
        "warm": lambda: bench_warm(work / "warm", args.warm_kernels, args.warm_repeats, env),
    }
    work = Path(tempfile.mkdtemp(prefix="kcache-bench-"))
    rows: list[dict[str, Any]] = []
    done: list[str] = []
    try:
        # Its own runtime directory: the compile services of the scenarios that name none are the
        # bench's, stopped at its end, never the user's (stress.command_scope).
        with command_scope() as scope:
            print(f"stress.bench: scenarios {', '.join(m for m in measures if m in only) or 'none'}; work directory "
                  f"{work}; compile services in {scope.runtime}", flush=True)
            for scenario, measure in measures.items():
                if scenario in only:
                    print(f"{scenario}: measuring", flush=True)
                    rows += measure()
                    done.append(scenario)
    except Interrupted as stop:
        ignore_further_signals()
        shutil.rmtree(work, ignore_errors=True)
        during = next((m for m in measures if m in only and m not in done), None)
        written = f", written to {args.json}" if args.json and rows else ""
        if written:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        print(f"stress.bench: interrupted by {stop.name}{f' during {during}' if during else ''}: "
              f"{len(rows)} rows measured ({', '.join(done) or 'no scenario finished'}){written}; "
              f"work directory {work} removed", file=sys.stderr)
        return stop.exit_status
    except BaseException:
        print(f"stress.bench: work directory kept: {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)

    print(f"{'scenario':<26} {'metric':<44} {'kcache':>10} {'baseline':>10} {'ratio':>7} unit  baseline")
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        print(f"{r['scenario']:<26} {r['metric']:<44} {format_value(r['kcache']):>10} {format_value(r['tilelang']):>10} {ratio:>7} "
              f"{r['unit']:<5} {r['baseline']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
