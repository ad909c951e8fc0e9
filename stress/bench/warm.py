"""`python -m stress.bench --only warm`: a warm start of many kernels (issue 39).

One fresh process asks for `kernels` distinct kernels (elementwise adds of distinct sizes) that are
already on disk, and is timed from its first call until every kernel is usable; the PrimFuncs are
built before the clock starts, as both sides need them alike:
- kcache: `get_or_compile` of each, on a root that holds them all;
- kcache from a bundle: `import_bundle` of a signed bundle of that root into an empty root, then
  the same calls (the import is timed too);
- TileLang: `tilelang.compile` of each, its own cache holding them all.
The three take turns, `repeats` fresh processes each. Goal: kcache at most 0.4x TileLang's time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..procs import PROJECT, run_for_result, worker_report
from .suite.rows import row
from .suite.timing import percentile, take_turns

MODES = ("kcache", "kcache-bundle", "tilelang")
SECRET = "bench-warm-secret"


def funcs(count: int) -> list[Any]:
    from ..programs.kernels import elementwise_add

    return [elementwise_add(1024 * (index + 1), 256) for index in range(count)]


def child(mode: str, root: str, count: int, bundle: str) -> None:
    """One timed fresh process (`python -m stress.bench.warm MODE ROOT COUNT BUNDLE`)."""
    import tilelang

    import kcache

    from ..programs.kernels import CPU_TARGET

    built = funcs(count)
    started = time.perf_counter()
    if mode == "tilelang":
        for func in built:
            tilelang.compile(func, out_idx=[2], target=CPU_TARGET, execution_backend="tvm_ffi")
    else:
        if mode == "kcache-bundle":
            from kcache.bundle.importer import import_bundle

            import_bundle(bundle, root=root, secret=SECRET, toolchain=None)
        cache = kcache.KernelCache(root)
        for func in built:
            cache.get_or_compile(func, CPU_TARGET, out_idx=[2])
        if cache.stats()["compiles"]:
            raise RuntimeError(f"{mode}: {cache.stats()['compiles']} compiles in a warm start")
    worker_report({"seconds": time.perf_counter() - started})


def _populate(work: Path, count: int, env: dict[str, str]) -> None:
    """Both caches hold every kernel: each filled by half the machine's cores (at least 2), kcache's by
    threads through its compile workers, TileLang's by processes."""
    share = max(2, (os.cpu_count() or 2) // 2)
    code = ("import sys, tilelang; from stress.bench.warm import funcs; from stress.programs.kernels import CPU_TARGET\n"
            "for f in funcs(int(sys.argv[1]))[int(sys.argv[2])::int(sys.argv[3])]:\n"
            "    tilelang.compile(f, out_idx=[2], target=CPU_TARGET, execution_backend='tvm_ffi')\n")
    tilelang_env = {**os.environ, **env, "TILELANG_CACHE_DIR": str(work / "tilelang")}
    fillers = [subprocess.Popen([sys.executable, "-c", code, str(count), str(part), str(share)], env=tilelang_env,
                                cwd=str(PROJECT)) for part in range(share)]
    import kcache

    from ..programs.kernels import CPU_TARGET

    cache = kcache.KernelCache(work / "kcache")
    with ThreadPoolExecutor(share) as pool:
        list(pool.map(lambda f: cache.get_or_compile(f, CPU_TARGET, out_idx=[2]), funcs(count)))
    if any(filler.wait() != 0 for filler in fillers):
        raise RuntimeError("filling TileLang's cache failed")
    from kcache.bundle.importer import export_bundle

    export_bundle(work / "warm.bundle", root=work / "kcache", secret=SECRET)


def _sample(mode: str, work: Path, count: int, env: dict[str, str]) -> float:
    root = work / ("kcache" if mode == "kcache" else "imported")
    shutil.rmtree(work / "imported", ignore_errors=True)
    command = [sys.executable, "-m", "stress.bench.warm", mode, str(root), str(count), str(work / "warm.bundle")]
    found = run_for_result(command, f"warm start {mode}", {**env, "TILELANG_CACHE_DIR": str(work / "tilelang")},
                           timeout=1800)
    return float(found["seconds"])


def measure(work: Path, count: int, repeats: int, env: dict[str, str]) -> list[dict[str, Any]]:
    work.mkdir(parents=True, exist_ok=True)
    _populate(work, count, env)
    samples = take_turns(MODES, repeats, lambda mode, _turn: _sample(mode, work, count, env))
    tilelang = samples["tilelang"]
    return [row(f"warm start ({count} kernels)", f"{label}, p{q} of {repeats}", percentile(samples[mode], q),
                percentile(tilelang, q), "s")
            for mode, label in (("kcache", "on disk"), ("kcache-bundle", "bundle import + all")) for q in (50, 90)]


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    return measure(work / "warm", options.warm_kernels, options.warm_repeats, env)


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
