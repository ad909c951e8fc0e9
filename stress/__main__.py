"""`python -m stress`: concurrent workers, SIGKILLs and corruption against one cache root, then the invariants.

The default run (no flags) is the README's main job: 4 workers for 40 s on
the default local cache, with kills and corruption on. Exits non-zero if an
invariant is violated.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

from .run import run_stress


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stress", description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, default=4, help="worker processes (default 4)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--duration", type=float, help="seconds of load (default 40)")
    length.add_argument("--ops", type=int, help="total operations instead of a duration")
    p.add_argument("--kernels", type=int, help="distinct kernels (default 3, or 64 with --synthetic)")
    p.add_argument("--cache-dir", help="cache root (default: $KCACHE_DIR or the user cache directory)")
    p.add_argument("--fresh", action="store_true", help="use a new empty root in a temporary directory")
    p.add_argument("--kill-rate", type=float, default=0.05, help="SIGKILLs of random workers per second (default 0.05)")
    p.add_argument("--corrupt-rate", type=float, default=0.2, help="corrupted published files per second (default 0.2)")
    p.add_argument("--isolation", choices=["pool", "inprocess", "server"],
                   help="KCACHE_COMPILE_ISOLATION of the workers (default: as set in the environment, else server)")
    p.add_argument("--server-kill-rate", type=float, default=0.0,
                   help="SIGKILLs of the run's compile service per second (with --isolation server)")
    p.add_argument("--synthetic", action="store_true", help="a fake compiler with realistic artifacts: store stress without TileLang")
    p.add_argument("--backend", choices=["kcache", "tilelang"], default="kcache", help="the cache under load")
    p.add_argument("--remote", help="every worker's remote tiers (KCACHE_REMOTE): redis://..., s3://BUCKET/PREFIX (with "
                   "the AWS_* settings), both comma-separated, or 'local-s3': an S3-protocol server started for the run")
    p.add_argument("--check-gpu", action="store_true", help="run every loaded kernel on the GPU against torch")
    p.add_argument("--json", help="also write the summary as JSON to this file")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the workers' logs (kept anyway when an invariant fails; removed otherwise)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    p.add_argument("--quiet", action="store_true", help="no live progress line")
    p.add_argument("--hang-grace", type=float, default=420.0,
                   help="seconds after the end a worker may take to finish before it counts as hung (default 420)")
    args = p.parse_args(argv)
    if args.remote and args.remote != LOCAL_S3:
        os.environ["KCACHE_REMOTE"] = args.remote  # the workers inherit it
    if args.synthetic and args.backend == "tilelang":
        p.error("--synthetic replaces the compiler of kcache; TileLang's own cache has no such mode")
    from kcache.config import Settings

    isolation = args.isolation or os.environ.get("KCACHE_COMPILE_ISOLATION") or Settings.compile_isolation
    if args.server_kill_rate and isolation != "server":
        p.error(f"--server-kill-rate kills the compile service, and the workers compile with {isolation}: "
                "use it with --isolation server")
    if args.duration is None and args.ops is None:
        args.duration = 40.0
    if args.kernels is None:
        args.kernels = 64 if args.synthetic else 3
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    return args


def print_report(summary: dict) -> None:
    print(f"\n{'operation':<10} {'count':>8} {'p50 ms':>9} {'p99 ms':>9}")
    for name, row in summary["ops_by_type"].items():
        print(f"{name:<10} {row['count']:>8} {row['p50_ms']:>9.3f} {row['p99_ms']:>9.3f}")
    c = summary["corruptions"]
    print(f"\nops {summary['ops']} in {summary['wall_s']} s ({summary['ops_per_s']}/s); "
          f"hits: memory {summary['hits']['memory']}, disk {summary['hits']['disk']}, remote {summary['hits']['remote']}; "
          f"misses {summary['misses']}")
    print(f"compiles {summary['compiles']} (nvcc saw {'-' if summary.get('nvcc_compiles') is None else summary['nvcc_compiles']}; "
          f"{summary['compiles_interrupted']} interrupted by kills); lost races {summary['lost_races']}; "
          f"lock waits {summary['lock_waits']}")
    print(f"kills {summary['kills']} (compile service: {summary.get('server_kills', 0)}); crashes {summary['crashes']}; corruptions injected {c['injected']}"
          f"{' (' + ', '.join(f'{m} {n}' for m, n in sorted(c['by_mode'].items())) + ')' if c['by_mode'] else ''}, "
          f"detected {c['detected']} ({c['by_workers']} by workers, {c['at_final_check']} at the final check)")
    if summary["results_checked"]:
        print(f"kernels launched against torch: wrong results {summary['wrong_results']}")
    else:
        print("kernels compiled and loaded, not launched: results not checked (--check-gpu on a GPU checks them)")
    for violation in summary["invariants"]["violations"]:
        print("VIOLATION:", violation, file=sys.stderr)
    print("invariants checked:", "; ".join(summary["invariants"]["checked"]))
    print("invariants:", "PASS" if summary["invariants"]["pass"] else "FAIL")


LOCAL_S3 = "local-s3"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.remote == LOCAL_S3:
        from .s3_server import s3_server

        with s3_server() as bucket:
            os.environ.update(bucket.env)  # the workers inherit the endpoint and credentials
            os.environ["KCACHE_REMOTE"] = bucket.url(f"stress-{args.seed}")
            print(f"stress: remote tier {os.environ['KCACHE_REMOTE']} at {bucket.endpoint} (stress.s3_server)")
            return _run(args)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.fresh:
        root = Path(tempfile.mkdtemp(prefix="kcache-stress-"))
    elif args.cache_dir:
        root = Path(args.cache_dir)
    else:
        from kcache.config import default_root

        root = default_root()
    mode = "synthetic compiler" if args.synthetic else f"{args.backend} with TileLang"
    span = f"{args.duration:g} s" if args.duration else f"{args.ops} ops"
    print(f"stress: {args.procs} workers, {args.kernels} kernels, {span}, {mode}, kill rate {args.kill_rate}/s, "
          f"corrupt rate {args.corrupt_rate}/s, seed {args.seed}, root {root}")
    summary = run_stress(args, root)
    print_report(summary)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    passed = summary["invariants"]["pass"]
    if args.keep_logs or not passed:
        print(f"workers' logs: {summary['run_dir']}")
    else:
        shutil.rmtree(summary["run_dir"], ignore_errors=True)
        if args.fresh:  # the run's own temporary root: nothing of it is wanted once it passed
            shutil.rmtree(root, ignore_errors=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
