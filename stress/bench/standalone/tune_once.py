"""`python -m stress.bench.standalone.tune_once`: the tune-once goals (issue 16) on the GPU, in one run.

- alone: one fresh process tunes the 16-config matmul on an empty root (the baseline: what one rank
  pays for tuning by itself).
- herd: `--procs` fresh processes (default 8) tune it at once on one empty root: distinct picks,
  compiler runs (counted by an nvcc wrapper), processes that benchmarked, and the wall from the
  barrier until the last one holds its result and kernel, against the alone run.
- killed: the same herd, and the process that tunes is SIGKILLed in the middle of its benchmark phase
  (found through its note in the tune's lock file): the survivors' picks, who took over, the wall.
- cluster: the herd over 2 roots that share one redis-server (two nodes on one machine), with
  KCACHE_REMOTE_SECRET set: picks and compiler runs in total. Needs redis-server on PATH.

Every scenario starts with its own compile service (a fresh runtime directory), stopped afterwards.
Prints a table and, with --json, writes the rows; with --rows, the bench's rows (each herd's compiler
runs, and its wall against the alone run's). With no GPU visible, one line saying why, and exits 0.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from stress.nvcc_counter import NvccCounter
from stress.procs import Barrier
from stress.service_runtime import own_services

from ..suite.own_run import own_parser, run_own, skipped, write_rows
from ..suite.rows import row
from ..suite.timing import utc_now
from ..suite.tune_notes import kill_the_tuner, killed_note

SCENARIOS = ("alone", "herd", "killed", "cluster")


def run_herd(work: Path, name: str, roots: list[Path], env: dict[str, str],
             kill_in_benchmark: bool = False) -> dict[str, Any]:
    """Start one tune_worker per root in `roots`, release them together, collect; optionally kill the
    tuner once its note says it is benchmarking (and has timed at least one config)."""
    counter = NvccCounter(work / f"nvcc-{name}")
    with own_services("kt-") as runtime:
        barrier = Barrier("stress.bench.jobs.tune_worker", len(roots), [],
                          env={**env, **counter.env(), "XDG_RUNTIME_DIR": str(runtime)},
                          per_worker=lambda i: ["--root", str(roots[i])])
        barrier.wait_ready()
        released = barrier.release()
        killed = kill_the_tuner(roots[0], lambda: True, 900, since=released) if kill_in_benchmark else None
        if killed is not None:
            killed["index"] = next(i for i, p in enumerate(barrier.procs) if p.pid == killed["pid"])
        results = barrier.collect(timeout=1800)
    finished = [r.result for r in results if r.result is not None]
    failed = [(r.index, r.returncode, r.stderr[-1500:]) for r in results
              if r.result is None and (killed is None or r.index != killed["index"])]
    if failed:
        raise RuntimeError(f"{name}: workers failed: {failed}")
    picks = {json.dumps(r["config"], sort_keys=True) for r in finished}
    return {
        "scenario": name, "processes": len(roots), "finished": len(finished),
        "distinct_picks": len(picks), "picks": sorted(picks),
        "compiler_runs": counter.count(),
        "benchmarked": sum(1 for r in finished if r["benchmarked"]),
        "wall_s": max(r["done"] for r in finished) - released,
        "all_correct": all(r["correct"] for r in finished),
        "killed": killed,
    }


def bench_rows(herds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each herd's wall (against the alone run's, where it ran) and compiler runs; the alone run is their
    baseline, no row of its own."""
    alone = next((herd for herd in herds if herd["scenario"] == "alone"), None)
    found = []
    for herd in herds:
        name = herd["scenario"]
        if name == "alone":
            continue
        if alone is not None:
            found.append(row("tune-once", f"{name}: {herd['processes']} processes, wall", herd["wall_s"],
                             alone["wall_s"], "s", "one process tuning alone"))
        found.append(row("tune-once", f"{name}: compiler runs", herd["compiler_runs"], None, "runs", ""))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = own_parser("tune_once")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--only", action="append", choices=SCENARIOS)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    from stress.gpu import gpu_missing

    if skipped("tune once", gpu_missing()):
        return 0
    only = args.only or list(SCENARIOS)
    work = Path(tempfile.mkdtemp(prefix="kcache-bench-tune-once-"))
    env = {"KCACHE_COMPILE_ISOLATION": "server"}
    rows: list[dict[str, Any]] = []
    alone = None
    if "alone" in only or "herd" in only:
        alone = run_herd(work, "alone", [work / "alone"], env)
        rows.append(alone)
    if "herd" in only:
        herd = run_herd(work, "herd", [work / "herd"] * args.procs, env)
        herd["wall_over_alone"] = herd["wall_s"] / alone["wall_s"] if alone else None
        rows.append(herd)
    if "killed" in only:
        killed = run_herd(work, "killed", [work / "killed"] * args.procs, env, kill_in_benchmark=True)
        if alone:
            killed["wall_over_alone"] = killed["wall_s"] / alone["wall_s"]
        rows.append(killed)
    if "cluster" in only:
        from stress.servers.redis import redis_server

        with redis_server(work) as (url, _server):
            nodes = [work / "node-a", work / "node-b"]
            cluster_env = {**env, "KCACHE_REMOTE": url, "KCACHE_REMOTE_SECRET": "bench-cluster-secret"}
            cluster = run_herd(work, "cluster", [nodes[i % 2] for i in range(args.procs)], cluster_env)
        if alone:
            cluster["wall_over_alone"] = cluster["wall_s"] / alone["wall_s"]
        rows.append(cluster)
    import torch

    device = torch.cuda.get_device_name()
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    write_rows(args.rows, bench_rows(rows))
    print(f"tune once: {args.procs} processes, 16 matmul configs, {device}, {utc_now()}")
    print(f"{'scenario':10} {'finished':>8} {'picks':>5} {'compiles':>8} {'benchmarked':>11} {'wall s':>8} {'/alone':>7} correct")
    for r in rows:
        ratio = r.get("wall_over_alone")
        shown = "-" if ratio is None else f"{ratio:.3f}"
        print(f"{r['scenario']:10} {r['finished']:>8} {r['distinct_picks']:>5} {r['compiler_runs']:>8} "
              f"{r['benchmarked']:>11} {r['wall_s']:>8.2f} {shown:>7} {r['all_correct']}{killed_note(r)}")
    return 0


if __name__ == "__main__":
    run_own("tune_once", main)
