"""The remote-tier scenario of `python -m stress.bench` (needs redis-server on PATH).

- latency: one TileLang kernel: a cold compile on node A (uploaded), then remote hits on fresh
  roots (fetch, verify, publish locally, load) against disk hits on A, in-process, p50 of N.
- cold-cluster herd: 16 fresh processes over 4 roots sharing one Redis, an empty cluster, one
  kernel; compiler runs counted by the nvcc wrapper, against the same herd with no remote tier.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def latency(url: str, work: Path, repeats: int) -> dict[str, float]:
    import tilelang  # noqa: F401 - before kcache opens

    import kcache

    from .kernels import CPU_TARGET, elementwise_add

    def timed(root: Path) -> float:
        cache = kcache.KernelCache(root, remote=url)
        func = elementwise_add()
        start = time.perf_counter()
        cache.get_or_compile(func, CPU_TARGET, out_idx=[2])
        return (time.perf_counter() - start) * 1e3

    compile_ms = timed(work / "node-a")
    disk = [timed(work / "node-a") for _ in range(repeats)]
    remote = [timed(work / f"node-{i}") for i in range(repeats)]
    return {"compile_ms": compile_ms, "disk_hit_ms": statistics.median(disk), "remote_hit_ms": statistics.median(remote)}


def herd(url: str | None, work: Path, procs: int, roots: int, env: dict[str, str]) -> int:
    from .nvcc_counter import NvccCounter
    from .procs import Barrier

    counter = NvccCounter(work / f"nvcc-{'remote' if url else 'local'}")
    extra = {**env, **counter.env(), **({"KCACHE_REMOTE": url} if url else {})}
    barrier = Barrier("stress.worker", procs, ["--kernels", "1"], env=extra,
                      per_worker=lambda i: ["--root", str(work / f"herd-{'remote' if url else 'local'}-{i % roots}")])
    barrier.wait_ready()
    barrier.release()
    for result in barrier.collect():
        if result.result is None or result.result["errors"]:
            raise RuntimeError(f"herd worker {result.index} failed: {result.stderr[-2000:]}")
    return counter.count()


def measure(repeats: int, procs: int, roots: int, env: dict[str, str]) -> dict[str, Any]:
    from .redis_server import redis_server  # RedisServerMissing where there is none

    work = Path(tempfile.mkdtemp(prefix="kcache-bench-remote-"))
    with redis_server(work) as (url, _server):
        out: dict[str, Any] = latency(url, work, repeats)
        import redis

        redis.Redis.from_url(url).flushall()  # the herd starts on an empty cluster
        out["herd_compiles_remote"] = herd(url, work, procs, roots, env)
    out["herd_compiles_local"] = herd(None, work, procs, roots, env)
    return out
