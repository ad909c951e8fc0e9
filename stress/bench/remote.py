"""The remote-tier scenario of `python -m stress.bench` (needs redis-server on PATH; the S3 rows need
moto's server and obstore, `pip install -e '.[test]'`).

- latency: one TileLang kernel compiled on node A and uploaded to Redis and to S3 (a real
  S3-protocol server process, stress.servers.s3); then remote hits of fresh processes on fresh roots
  (import the client, fetch, verify, publish locally, load), Redis and S3 in turns, against disk
  hits of fresh processes on A; p50 of N each.
- cold-cluster herds: fresh processes over several roots, an empty cluster, one kernel; compiler runs
  counted by the nvcc wrapper; sharing one Redis, sharing one bucket, and with no remote tier.
  With `check_gpu`, every process also runs its kernel against torch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from ..nvcc_counter import NvccCounter
from .suite.children import get_seconds, run_workers
from .suite.rows import row
from .suite.timing import take_turns


def fresh_get(root: Path, url: str, env: dict[str, str]) -> dict[str, Any]:
    """One fresh process on `root` with KCACHE_REMOTE=`url`: its get of the add kernel, from the call
    until the kernel is usable (the remote tier's client is imported inside it, as on a new node)."""
    _, (result,) = run_workers("kcache", root, 1, 1, {**env, "KCACHE_REMOTE": url})
    return {"ms": get_seconds([result])[0] * 1e3, "stats": result.result["stats"]}


def latency(urls: dict[str, str], work: Path, repeats: int, env: dict[str, str]) -> dict[str, float]:
    """`urls`: tier name -> KCACHE_REMOTE value. Node A compiles and uploads to all of them at once;
    then fresh processes on fresh roots, the tiers in turns (drift weighs on each alike)."""
    everything = ",".join(urls.values())
    first = fresh_get(work / "node-a", everything, env)
    out: dict[str, float] = {"compile_ms": first["ms"]}
    out["disk_hit_ms"] = statistics.median(fresh_get(work / "node-a", everything, env)["ms"] for _ in range(repeats))

    def remote_hit_ms(name: str, turn: int) -> float:
        got = fresh_get(work / f"node-{name}-{turn}", urls[name], env)
        if got["stats"]["remote_hits"] != 1:
            raise RuntimeError(f"{urls[name]}: a fresh root was no remote hit ({got['stats']})")
        return got["ms"]

    for name, values in take_turns(list(urls), repeats, remote_hit_ms).items():
        out[f"{name}_hit_ms"] = statistics.median(values)
    return out


def herd(url: str | None, label: str, work: Path, procs: int, roots: int, env: dict[str, str],
         check_gpu: bool = False) -> dict[str, int]:
    counter = NvccCounter(work / f"nvcc-{label}")
    extra = {**env, **counter.env(), **({"KCACHE_REMOTE": url} if url else {})}
    _, results = run_workers("kcache", None, procs, 1, extra, ("--check-gpu",) if check_gpu else (),
                             per_worker=lambda i: ["--root", str(work / f"herd-{label}-{i % roots}")])
    return {"compiles": counter.count(), "wrong": sum(r.result["wrong_results"] for r in results)}


def measure(repeats: int, procs: int, roots: int, env: dict[str, str], *, s3: bool = True,
            fleet_procs: int = 32, fleet_roots: int = 8, check_gpu: bool = False) -> dict[str, Any]:
    from ..servers.redis import redis_server  # RedisServerMissing where there is none
    from ..servers.s3 import s3_server

    work = Path(tempfile.mkdtemp(prefix="kcache-bench-remote-"))
    with redis_server(work) as (redis_url, _server), (s3_server() if s3 else nullcontext()) as bucket:
        urls = {"redis": redis_url}
        if bucket is not None:
            env = {**env, **bucket.env}
            urls["s3"] = bucket.url("bench-latency")
        out: dict[str, Any] = latency(urls, work, repeats, env)
        import redis

        redis.Redis.from_url(redis_url).flushall()  # the herd starts on an empty cluster
        out["herd_redis"] = herd(redis_url, "redis", work, procs, roots, env)
        if bucket is not None:
            out["herd_s3"] = herd(bucket.url("bench-fleet"), "s3", work, fleet_procs, fleet_roots, env, check_gpu)
    out["herd_local"] = herd(None, "local", work, procs, roots, env)
    return out


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    from ..gpu import gpu_missing
    from ..servers.s3 import S3ServerMissing, check_installed

    try:
        check_installed()
        s3 = True
    except S3ServerMissing as missing:
        print(f"remote: no S3 rows: {missing}", file=sys.stderr)
        s3 = False
    check_gpu = gpu_missing() is None
    procs = 16
    r = measure(10, procs, 4, env, s3=s3, check_gpu=check_gpu)
    scenario = "remote (same host)"
    found = [
        row(scenario, "redis hit on a fresh root (fetch, verify, publish, load), p50", r["redis_hit_ms"],
            r["disk_hit_ms"], "ms", baseline="local disk hit"),
        row(scenario, "redis hit vs a cold compile", r["redis_hit_ms"], r["compile_ms"], "ms", baseline="compile"),
        row(scenario, f"cold cluster: {procs} procs over 4 roots, one Redis, compiler runs", r["herd_redis"]["compiles"],
            r["herd_local"]["compiles"], "runs", baseline="no remote tier"),
    ]
    if s3:
        fleet = r["herd_s3"]
        found += [
            row(scenario, "s3 hit on a fresh root (fetch, verify, publish, load), p50", r["s3_hit_ms"],
                r["redis_hit_ms"], "ms", baseline="redis hit (goal <= 2x)"),
            row(scenario, "s3 hit vs a cold compile", r["s3_hit_ms"], r["compile_ms"], "ms",
                baseline="compile (goal < 0.10)"),
            row(scenario, "cold fleet: 32 procs over 8 roots, one bucket, compiler runs", fleet["compiles"], 1, "runs",
                baseline="one kernel"),
            row(scenario, "cold fleet: wrong results" + ("" if check_gpu else " (no GPU: not run)"), fleet["wrong"],
                0, "kernels", baseline="-"),
        ]
    return found
