"""`python -m stress.bench.standalone.multigpu`: one multi-GPU job for real (issue 40), in one run.

torchrun starts one rank per GPU of stress.bench.jobs.torchrun_job (NCCL, a tune of the 16-config matmul, the
kernel pool, each run on its own GPU and checked against torch, a checksum all-reduced):
- cold: kcache on an empty root. Compiler runs counted by an nvcc wrapper across all ranks (and the
  compile service they share), the picks of every rank, the ranks that benchmarked.
- warm: again on that root: no compile, no tune.
- killed: kcache on a new root, and the rank that tunes is SIGKILLed in its benchmark phase (found by
  its note in the tune's lock file): the job fails as torchrun makes it fail.
- takeover: again on the killed run's root: it finishes, one tune, within a bound (no hang).
- tilelang: the same job under plain TileLang (its AutoTuner, each rank for itself) on an empty
  TileLang cache: the baseline.
Each scenario has its own compile service (a fresh runtime directory), stopped afterwards; NVLink
multicast is off (NCCL_NVLS_ENABLE=0 and its kin). Prints a table and, with --json, writes the rows; with
--rows, the bench's rows (compiler runs and ready time of each kcache job, against the TileLang job's). With
fewer than 2 GPUs visible, one line saying why, and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stress.nvcc_counter import NvccCounter
from stress.service_runtime import own_services

from ..suite.own_run import own_parser, run_own, skipped, write_rows
from ..suite.rows import row
from ..suite.timing import utc_now
from ..suite.tune_notes import kill_the_tuner, killed_note

SCENARIOS = ("cold", "warm", "killed", "takeover", "tilelang")
JOB_TIMEOUT_S = 600
# NVLink multicast stays off (the GPU machine's rule: it can take a shared host's GPUs out of service).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "OMP_NUM_THREADS": "1"}


def run_job(work: Path, name: str, gpus: int, mode: str, env: dict[str, str],
            kill_root: Path | None = None) -> dict[str, Any]:
    """One torchrun job of `gpus` ranks; with `kill_root`, SIGKILL the rank that tunes on it."""
    counter = NvccCounter(work / f"nvcc-{name}")
    out = work / f"out-{name}"
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
               "-m", "stress.bench.jobs.torchrun_job", "--mode", mode, "--out", str(out)]
    killed = None
    with own_services("km-") as runtime:
        started = time.monotonic()
        full_env = {**os.environ, **NCCL_ENV, **env, **counter.env(), "XDG_RUNTIME_DIR": str(runtime)}
        job = subprocess.Popen(command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
        if kill_root is not None:  # the rank whose note in `<root>/.locks/tune-*.lock` says it is benchmarking
            killed = kill_the_tuner(kill_root, lambda: job.poll() is None, JOB_TIMEOUT_S, since=time.monotonic())
        try:
            log, _ = job.communicate(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            log, _ = job.communicate()
            raise RuntimeError(f"{name}: the job did not finish in {JOB_TIMEOUT_S} s (a hang)") from None
    wall = time.monotonic() - started
    (work / f"{name}.log").write_bytes(log)
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    if job.returncode != 0 and kill_root is None:
        raise RuntimeError(f"{name}: torchrun exited {job.returncode}:\n{log.decode(errors='replace')[-3000:]}")
    return {
        "scenario": name, "mode": mode, "ranks": gpus, "returncode": job.returncode,
        "finished": len(ranks), "picks": sorted({json.dumps(r["config"], sort_keys=True) for r in ranks}),
        "compiler_runs": counter.count(),
        "ranks_that_benchmarked": sum(1 for r in ranks if r["benchmarked"]),
        "all_correct": bool(ranks) and all(r["correct"] for r in ranks),
        "checksums_equal": bool(ranks) and all(r["checksums_equal_across_ranks"] for r in ranks),
        "devices": sorted({r["device"] for r in ranks}),
        "local_ranks": sorted(r["local_rank"] for r in ranks),
        "ready_s": max((r["ready_s"] for r in ranks), default=None),
        "tune_s": max((r["tune_s"] for r in ranks), default=None),
        "job_wall_s": wall, "killed": killed,
    }


def bench_rows(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each finished kcache job's compiler runs and ready time, against the TileLang job's where it ran."""
    tilelang = next((job for job in jobs if job["mode"] == "tilelang"), {})
    found = []
    for job in jobs:
        if job["mode"] != "kcache" or not job["finished"]:
            continue
        name = job["scenario"]
        found.append(row("multigpu", f"compiler runs, {name}", job["compiler_runs"], tilelang.get("compiler_runs"),
                         "runs", "TileLang alone"))
        if job["ready_s"] is not None:
            found.append(row("multigpu", f"ready, {name}", job["ready_s"], tilelang.get("ready_s"), "s",
                             "TileLang alone"))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = own_parser("multigpu")
    parser.add_argument("--only", action="append", choices=SCENARIOS)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if skipped("multi-GPU job", f"{gpus} CUDA GPU(s) visible, needs 2 or more" if gpus < 2 else None):
        return 0
    only = args.only or list(SCENARIOS)
    work = Path(tempfile.mkdtemp(prefix="kcache-bench-multigpu-"))
    rows: list[dict[str, Any]] = []
    root, killed_root = work / "root", work / "root-killed"
    failed = []
    for name in only:
        try:
            if name in ("cold", "warm"):
                rows.append(run_job(work, name, gpus, "kcache", {"KCACHE_DIR": str(root)}))
            elif name == "killed":
                rows.append(run_job(work, name, gpus, "kcache", {"KCACHE_DIR": str(killed_root)},
                                    kill_root=killed_root))
            elif name == "takeover":
                rows.append(run_job(work, name, gpus, "kcache", {"KCACHE_DIR": str(killed_root)}))
            else:
                rows.append(run_job(work, name, gpus, "tilelang",
                                    {"TILELANG_CACHE_DIR": str(work / "tilelang-cache")}))
            print(f"multi-GPU job: {json.dumps(rows[-1])}", flush=True)  # a row as soon as it is measured
        except RuntimeError as err:  # the other scenarios still run and are reported
            failed.append(f"{name}: {err}")
            print(f"multi-GPU job: {name} failed: {err}", flush=True)
    device = torch.cuda.get_device_name()
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "gpus": gpus, "rows": rows, "failed": failed},
                                              indent=1))
    write_rows(args.rows, bench_rows(rows))
    print(f"multi-GPU job: torchrun, {gpus} x {device}, 16 matmul configs + 4 kernels, "
          f"{utc_now()}")
    print(f"{'scenario':9} {'rc':>3} {'ranks':>5} {'picks':>5} {'compiles':>8} {'tuned':>5} {'ready s':>8} "
          f"{'job s':>7} correct equal")
    for r in rows:
        ready = "-" if r["ready_s"] is None else f"{r['ready_s']:.2f}"
        print(f"{r['scenario']:9} {r['returncode']:>3} {r['finished']:>5} {len(r['picks']):>5} "
              f"{r['compiler_runs']:>8} {r['ranks_that_benchmarked']:>5} {ready:>8} {r['job_wall_s']:>7.2f} "
              f"{r['all_correct']!s:7} {r['checksums_equal']}{killed_note(r)}")
    return 1 if failed else 0


if __name__ == "__main__":
    run_own("multigpu", main)
