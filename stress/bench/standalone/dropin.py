"""`python -m stress.bench.standalone.dropin`: TileLang code under `kcache.install()` against TileLang's own cache,
measured in the same run, on the GEMM of stress/programs/tilelang_programs/gemm.py.

- seen call: `matmul(...)` again in the same process (TileLang's per-call memo above kcache): median
  of 20,000 calls, installed and not;
- build: what that memo saves, building the PrimFunc (the undecorated factory), median of 20;
- fresh process, first call: a new interpreter (imports done, untimed) calls `matmul(...)` once, the
  kernel already on disk: the PrimFunc build plus a disk hit; p50 and p90 of 6 processes each.

Prints one line "result {json}" with the ratios (kcache / TileLang; below 1 is better for kcache);
`--rows FILE` writes the seen call and the first call's p50 and p90 as the bench's rows.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stress.gpu import tilelang_target_env
from stress.procs import run_for_result, worker_env, worker_report
from stress.programs import TILELANG_PROGRAMS

from ..suite.own_run import own_parser, run_own, write_rows
from ..suite.rows import row
from ..suite.timing import percentile

PROGRAM = TILELANG_PROGRAMS
ARGS = (1024, 1024, 1024, 128, 128, 32)

FIRST_CALL = """
import json, sys, time
sys.path.insert(0, {programs!r})
import tilelang
if {with_kcache}:
    import kcache
    kcache.install()
from gemm import matmul
start = time.perf_counter()
matmul(*{args!r})
print("result", json.dumps(time.perf_counter() - start), flush=True)
"""


def first_call_seconds(with_kcache: bool, env: dict[str, str]) -> float:
    code = FIRST_CALL.format(programs=str(PROGRAM), with_kcache=with_kcache, args=ARGS)
    return float(run_for_result([sys.executable, "-c", code], "the timed child", env, timeout=600))


def seen_call_seconds(matmul, calls: int = 20_000) -> float:
    matmul(*ARGS)
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        matmul(*ARGS)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench_rows(out: dict[str, Any]) -> list[dict[str, Any]]:
    """The seen call (us) and a fresh process's first call (ms, p50 and p90), kcache's against TileLang's."""
    first = "a fresh process's first call, kernel on disk"
    return [row("dropin", "a seen call, median", out["kcache_seen_call_us"], out["tilelang_seen_call_us"], "us"),
            *(row("dropin", f"{first}, {q}", out[f"kcache_first_call_ms_{q}"], out[f"tilelang_first_call_ms_{q}"],
                  "ms") for q in ("p50", "p90"))]


def main(argv: list[str] | None = None) -> int:
    rows: Path | None = own_parser("dropin").parse_args(argv).rows
    work = Path(tempfile.mkdtemp(prefix="kcache-bench-dropin-"))
    env = worker_env({"KCACHE_DIR": str(work / "kcache"), "TILELANG_CACHE_DIR": str(work / "tilelang"),
                      **tilelang_target_env()})
    os.environ.update(env)
    sys.path.insert(0, str(PROGRAM))
    import tilelang  # noqa: F401
    from gemm import matmul

    import kcache

    out: dict[str, object] = {}
    out["tilelang_seen_call_us"] = seen_call_seconds(matmul) * 1e6
    builds = []
    for _ in range(20):
        start = time.perf_counter()
        matmul.func.orig_func(*ARGS)  # the factory itself: get_tir is memoized
        builds.append(time.perf_counter() - start)
    out["primfunc_build_ms"] = statistics.median(builds) * 1e3
    matmul._kernel_cache.clear()
    matmul._call_form_cache.clear()
    kcache.install()
    out["kcache_seen_call_us"] = seen_call_seconds(matmul) * 1e6
    kcache.uninstall()

    # Each cache has the kernel on disk (the calls above compiled it into both); now fresh processes.
    for name, with_kcache in (("tilelang", False), ("kcache", True)):
        first_call_seconds(with_kcache, env)  # page cache, memoized toolchain fingerprint
        samples = [first_call_seconds(with_kcache, env) for _ in range(6)]
        out[f"{name}_first_call_ms_p50"] = percentile(samples, 50) * 1e3
        out[f"{name}_first_call_ms_p90"] = percentile(samples, 90) * 1e3
    out["ratio_seen_call"] = out["kcache_seen_call_us"] / out["tilelang_seen_call_us"]
    out["ratio_first_call_p50"] = out["kcache_first_call_ms_p50"] / out["tilelang_first_call_ms_p50"]
    worker_report(out)
    write_rows(rows, bench_rows(out))
    return 0


if __name__ == "__main__":
    run_own("dropin", main)
