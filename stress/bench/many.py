"""The `many` scenario of `python -m stress.bench`: processes that each `compile_many` at once.

`--many-procs` fresh processes (default 8, as ranks of one job) each open a `KernelCache` and hand its
compile pool the same `--many-configs` distinct matmul configs (default 16, the tuner's configs of
stress/programs/tune_kernels.py) with `compile_many`, released together by a barrier. Each job compiles its
config with TileLang in a worker (no cache: every job is a real compile). Two modes, one after the
other (the service first, so what the first run warms favours the pools), each on fresh processes:
- `pool`: every process its own pool (today's default): up to `usable cores` workers each;
- `server`: every process's jobs go to the one compile service of the user (started fresh for the
  run), whose workers are bounded machine-wide.

A monitor in this process samples, every 0.2 s, the compile workers machine-wide (exec'd workers,
and workers forked from a service's template, found by their process names) and their summed resident
memory; every second their summed proportional set size (pages a forked worker shares with its template
count once). Reported:
wall from the barrier to the last process done, peak workers, peak RSS and PSS of the workers (the
template included). A worker's child between its fork and its exec (nvcc starting) shows the
worker's command line for a moment; it is not a worker and is not counted (the first H100 run,
before this rule, counted 18 for 16 workers). Where the peak's workers came from (their parents) is
printed in the log.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kcache.compile.workers.worker import TEMPLATE_NAME, WORKER_NAME

from ..procs import Barrier, worker_handshake, worker_report
from ..service_runtime import own_services
from .suite.children import released
from .suite.rows import row

# The service runs first: whatever the first run warms (page cache, nvcc's files) favours the pools.
MODES = ("server", "pool")


def compile_config(index: int) -> int:
    """One job: compile config `index` with TileLang, in the worker; the device source's length."""
    import tilelang

    from ..programs.kernels import CPU_TARGET
    from ..programs.tune_kernels import CONFIGS, matmul

    tilelang.disable_cache()  # every job a real compile, never TileLang's cache
    kernel = tilelang.compile(matmul(**CONFIGS[index % len(CONFIGS)]), out_idx=[2], target=CPU_TARGET,
                              execution_backend="tvm_ffi")
    return len(kernel.get_kernel_source())


def child(root: str, configs: int) -> None:
    import kcache
    from kcache.compile.jobs import Job
    from kcache.compile.protocol import CallByName

    cache = kcache.KernelCache(root)
    pool = cache.compile_pool
    jobs = [Job(CallByName("stress.bench.many", "compile_config"), (index,), name=f"config-{index}")
            for index in range(configs)]
    worker_handshake()
    results = list(pool.compile_many(jobs))
    worker_report({"end": time.monotonic(), "errors": [str(r.error) for r in results if not r.ok]})


class Monitor:
    """Samples this user's compile workers until stopped: their count and memory, peaks kept."""

    def __init__(self) -> None:
        self.peak_workers = 0
        self.peak_parents: dict[str, int] = {}  # at the peak: workers per parent process
        self.peak_rss = 0
        self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(0.2):
            workers, templates = compile_processes()
            if len(workers) > self.peak_workers:
                self.peak_workers = len(workers)
                self.peak_parents = parents_of(workers)
            everything = workers + templates
            self.peak_rss = max(self.peak_rss, sum(_status_kib(pid, "VmRSS:") for pid in everything) * 1024)
            tick += 1
            if tick % 5 == 0:
                pss = sum(_status_kib(pid, "Pss:", "smaps_rollup") for pid in everything)
                self.peak_pss = max(self.peak_pss, pss * 1024)


def compile_processes() -> tuple[list[int], list[int]]:
    """(compile workers, worker templates) of this user, machine-wide, by their process names (a
    service's template and workers are forks of the server and keep its command line)."""
    names: dict[int, tuple[str, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                name = f.read().strip()
            ppid = _status_kib(int(entry), "PPid:")
        except OSError:
            continue
        names[int(entry)] = (name, ppid)
    workers, templates = [], []
    for pid, (name, ppid) in names.items():
        # A worker's child between its fork and its exec (nvcc starting) still has the worker's
        # name: a process whose parent has the same name is not counted.
        if name == WORKER_NAME and names.get(ppid, ("", 0))[0] != WORKER_NAME:
            workers.append(pid)
        elif name == TEMPLATE_NAME:
            templates.append(pid)
    return workers, templates


def parents_of(pids: list[int]) -> dict[str, int]:
    """How many of `pids` each parent has, the parent named by its pid and its command's start."""
    counts: dict[str, int] = {}
    for pid in pids:
        parent = _status_kib(pid, "PPid:")
        try:
            with open(f"/proc/{parent}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")[:80]
        except OSError:
            command = "?"
        label = f"{parent} {command}"
        counts[label] = counts.get(label, 0) + 1
    return counts


def _status_kib(pid: int, field: str, source: str = "status") -> int:
    """The number after `field` in /proc/PID/`source` (status's fields, smaps_rollup's Pss:); 0 where
    the process is gone."""
    try:
        with open(f"/proc/{pid}/{source}") as fields:
            for line in fields:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(procs: int, configs: int, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """mode -> {wall_s, peak_workers, peak_rss_bytes, peak_pss_bytes, compiles}."""
    out: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        work = Path(tempfile.mkdtemp(prefix="kcache-bench-many-"))
        try:
            with own_services("km-") as runtime:  # this run's own service
                extra = {**env, "KCACHE_COMPILE_ISOLATION": mode, "XDG_RUNTIME_DIR": str(runtime),
                         "KCACHE_SERVER_IDLE": "30"}
                barrier = Barrier("stress.bench.many", procs, ["--child", str(work / "root"), str(configs)], env=extra)
                monitor = Monitor()
                release, results = released(barrier, f"many/{mode}: process", during=monitor)
            out[mode] = {"wall_s": max(r.result["end"] for r in results) - release,
                         "peak_workers": monitor.peak_workers, "peak_parents": monitor.peak_parents,
                         "peak_rss_bytes": monitor.peak_rss,
                         "peak_pss_bytes": monitor.peak_pss, "compiles": procs * configs}
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    from kcache.compile.jobs import usable_cpu_count

    procs, configs = options.many_procs, options.many_configs
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", type=int)
    parser.add_argument("--child", nargs=2)
    args = parser.parse_args()
    child(args.child[0], int(args.child[1]))
    sys.exit(0)
