"""Where a cold herd's time goes: a diagnostic beside `python -m stress.bench --only herd`, not a goal.

    python -m stress.bench --only herd --profile [--procs 32] [--repeats 3]

Each herd is N fresh processes on a fresh root and a fresh runtime directory (so no compile service
runs), one kernel, released together. Every process reports, on the machine's monotonic clock: when
it saw the release, when its toolchain fingerprint was ready, and when its kernel was; the one that
compiled also reports its compile's seconds, and the service's status after the herd says how many
jobs and workers it ran. Two variants: each process opens its cache before `import tilelang` (the
service starts at that open), and the service already running with each process importing TileLang
first. The goal's numbers come from the bench; these say which phase a slow herd lost its time in.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS = {"opened first, service started by the herd": ("open-first", False),
            "TileLang first, service running": ("tilelang-first", True),
            # The bench's own worker (stress.worker --open-first), in the same sequence of herds: where
            # its wall and the first variant's differ, the difference is in the worker, not the machine.
            "opened first, the bench's worker": ("bench-worker", False)}


def child(root: str, mode: str) -> None:
    """One process of the herd (`--child`): the barrier protocol of stress.procs, then one get."""
    from stress.procs import worker_handshake, worker_report

    clock = time.monotonic
    cache: Any = None
    if mode == "open-first":
        import kcache

        cache = kcache.KernelCache(root)
    import tilelang  # noqa: F401 - before the cache opens in the other mode, as a program would

    from stress.programs.kernels import CPU_TARGET, pool

    spec = pool(1)[0]
    func = spec.build()
    if cache is None:
        import kcache

        cache = kcache.KernelCache(root)
    worker_handshake()
    go = clock()
    cache._toolchain_fingerprint(cache._tilelang())  # the key's first part: a memo read, or a hash
    fingerprint = clock()
    cache.get_or_compile(func, CPU_TARGET, out_idx=spec.out_idx)
    stats = cache.stats()
    worker_report({"go": go, "fingerprint": fingerprint, "end": clock(), "compiles": stats["compiles"],
                   "compile_s": stats["compile_seconds"], "errors": []})


def one_herd(procs: int, mode: str, running: bool, extra_env: dict[str, str]) -> dict[str, Any]:
    from kcache.compile.service import connection as service_connection
    from stress.procs import Barrier, environ
    from stress.service_runtime import own_services, service_names

    from ..herd import start_warm_service
    from ..suite.children import released, run_workers

    root = tempfile.mkdtemp(prefix="kp-root-", dir="/tmp")
    with own_services("kp-") as runtime:
        env = {**extra_env, "KCACHE_COMPILE_ISOLATION": "server", "XDG_RUNTIME_DIR": str(runtime)}
        if running:
            start_warm_service(env)
        if mode == "bench-worker":
            wall, workers = run_workers("kcache", Path(root), procs, 1, env, ("--open-first",))
            results = [{"end": max(op["end"] for op in r.result["ops"]), "compiles": r.result["stats"]["compiles"],
                        "compile_s": r.result["stats"]["compile_seconds"], "fingerprint": None} for r in workers]
            release = max(r["end"] for r in results) - wall
        else:
            barrier = Barrier("stress.bench.profiles.herd", procs, ["--child", root, mode], env=env)
            release, done = released(barrier, f"a process of the herd ({mode})")
            results = [r.result for r in done]
        with environ({"XDG_RUNTIME_DIR": str(runtime)}):  # the status of the herd's own service
            served = service_connection.request(service_names(runtime)[0], ("status",))
    (compiler,) = [r for r in results if r["compiles"]]
    timed = mode != "bench-worker"  # the bench's worker reports no fingerprint time
    return {
        "wall_s": max(r["end"] for r in results) - release,
        "fingerprint_after_release_s": max(r["fingerprint"] - release for r in results) if timed else None,
        "compiling_process_get_s": compiler["end"] - compiler["fingerprint"] if timed else None,
        "compile_s": compiler["compile_s"],
        "last_ready_after_compiler_s": max(r["end"] for r in results) - compiler["end"],
        "compiles": sum(r["compiles"] for r in results),
        "service_jobs": served.get("jobs"), "service_workers": served.get("workers"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stress.bench.profiles.herd")
    parser.add_argument("--procs", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--as-bench", action="store_true",
                        help="the bench's bytecode settings: kcache compiled ahead, children write bytecode")
    parser.add_argument("--child", nargs=2, metavar=("ROOT", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, help=argparse.SUPPRESS)  # stress.procs.Barrier names each child
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return
    extra_env: dict[str, str] = {}
    if args.as_bench:
        from ..suite.children import bytecode_as_installed

        extra_env = bytecode_as_installed()
    herds: list[dict[str, Any]] = []
    for _ in range(args.repeats):
        for variant, (mode, running) in VARIANTS.items():
            herds.append({"variant": variant, **one_herd(args.procs, mode, running, extra_env)})
            print(json.dumps(herds[-1]), flush=True)
    for variant in VARIANTS:
        walls = [h["wall_s"] for h in herds if h["variant"] == variant]
        print(f"{variant}: median {statistics.median(walls):.3f} s of {len(walls)} herds of {args.procs}")
    if args.json:
        args.json.write_text(json.dumps(herds, indent=1))


if __name__ == "__main__":
    sys.exit(main())
