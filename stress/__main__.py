"""`python -m stress`: concurrent workers, SIGKILLs and corruption against one cache root, then the invariants.

The default run (no flags) is the README's main job: 4 workers for 40 s, with kills and corruption on,
on a throwaway root in the temporary directory, removed at the end (`--keep-root` keeps it,
`--cache-dir` names a root of yours instead). Exits 1 if an invariant is violated, 2 if the run cannot
start here (TileLang missing: `--synthetic` needs none), 130 or 143 when SIGINT or SIGTERM stopped
it; every end but a pass says in one line what was kept and where. Nothing the run started outlives
it (stress.command_scope).
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

from kcache.interruption import Interrupted, ignore_further_signals

from .command_scope import command_scope
from .procs import WorkerFailedToStart
from .run import StressRun


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stress", description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--procs", type=int, default=4, help="worker processes (default 4)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--duration", type=float, help="seconds of load (default 40)")
    length.add_argument("--ops", type=int, help="total operations instead of a duration")
    p.add_argument("--kernels", type=int, help="distinct kernels (default 3, or 64 with --synthetic)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--cache-dir", "--dir", dest="cache_dir", metavar="ROOT",
                       help="the cache root to put under load, kept (default: a throwaway root in the temporary "
                            "directory; KCACHE_DIR is not used: the run corrupts entries and kills processes)")
    where.add_argument("--fresh", action="store_true", help="a throwaway root (the default; for older command lines)")
    p.add_argument("--keep-root", action="store_true",
                   help="keep the throwaway root at the end (kept anyway when an invariant fails)")
    p.add_argument("--kill-rate", type=float, default=0.05, help="SIGKILLs of random workers per second (default 0.05)")
    p.add_argument("--corrupt-rate", type=float, default=0.2, help="corrupted published files per second (default 0.2)")
    p.add_argument("--isolation", choices=["pool", "inprocess", "server"],
                   help="KCACHE_COMPILE_ISOLATION of the workers (default: as set in the environment, else server: "
                        "a compile service of the run's own, stopped at its end)")
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
EXIT_CANNOT_RUN = 2  # something the run needs is missing here: one line says what to install


def missing_requirement(args: argparse.Namespace) -> str | None:
    """Why this run cannot start here (and what to install), or None: said before anything is started."""
    from kcache.errors import TileLangMissing
    from kcache.tilelang.installed import tilelang_installed

    if not args.synthetic and not tilelang_installed():
        return str(TileLangMissing("or `python -m stress --synthetic`: a fake compiler, the same load on kcache "
                                   "without TileLang"))
    if args.remote == LOCAL_S3:
        from .servers.s3 import S3ServerMissing, check_installed

        try:
            check_installed()
        except S3ServerMissing as missing:
            return str(missing)
    return None


def main(argv: list[str] | None = None) -> int:
    """The run, from its checks to its last line; the exit status (the module's docstring says which)."""
    args = parse(argv)
    missing = missing_requirement(args)
    if missing is not None:
        print(f"stress: {missing}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    root = Path(args.cache_dir) if args.cache_dir else Path(tempfile.mkdtemp(prefix="kcache-stress-root-"))
    run_dir = Path(tempfile.mkdtemp(prefix="kcache-stress-run-"))
    keep_root = bool(args.cache_dir or args.keep_root)
    try:
        with command_scope() as scope:
            if args.remote == LOCAL_S3:
                from .servers.s3 import s3_server

                with s3_server() as bucket:
                    os.environ.update(bucket.env)  # the workers inherit the endpoint and credentials
                    os.environ["KCACHE_REMOTE"] = bucket.url(f"stress-{args.seed}")
                    print(f"stress: remote tier {os.environ['KCACHE_REMOTE']} at {bucket.endpoint} (stress.servers.s3)")
                    summary = _run(args, root, run_dir, scope.runtime)
            else:
                summary = _run(args, root, run_dir, scope.runtime)
    except (Interrupted, WorkerFailedToStart) as ended:
        ignore_further_signals()
        if not args.quiet and sys.stdout.isatty():
            print(flush=True)  # ends the redrawn progress line
        why = f"interrupted by {ended.name} {ended.done}" if isinstance(ended, Interrupted) else str(ended)
        print(f"stress: {why}; workers' logs kept in {run_dir}; {_leave_root(root, keep_root)}", file=sys.stderr)
        return ended.exit_status if isinstance(ended, Interrupted) else 1
    except BaseException:
        print(f"stress: workers' logs kept in {run_dir}; {_leave_root(root, keep_root)}", file=sys.stderr)
        raise  # a bug of the harness: its traceback
    passed = summary["invariants"]["pass"]
    if args.keep_logs or not passed:
        print(f"workers' logs: {run_dir}")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    if args.cache_dir:
        pass  # the user's own root: theirs to keep
    elif not passed or args.keep_root:  # a failed run's root is its evidence
        print(f"root kept: {root}")
    else:  # the run's own throwaway root: nothing of it is wanted once it passed
        shutil.rmtree(root, ignore_errors=True)
    return 0 if passed else 1


def _leave_root(root: Path, keep: bool) -> str:
    """Remove the throwaway root of a run that ended early (nothing in it is evidence of anything),
    unless it is to be kept; say which."""
    if keep:
        return f"root kept: {root}"
    shutil.rmtree(root, ignore_errors=True)
    return f"throwaway root {root} removed"


def _run(args: argparse.Namespace, root: Path, run_dir: Path, runtime: Path) -> dict:
    mode = "synthetic compiler" if args.synthetic else f"{args.backend} with TileLang"
    span = f"{args.duration:g} s" if args.duration else f"{args.ops} ops"
    whose = ("yours, kept" if args.cache_dir else
             "throwaway: " + ("kept at the end" if args.keep_root else "removed at the end, --keep-root keeps it"))
    print(f"stress: {args.procs} workers, {args.kernels} kernels, {span}, {mode}, kill rate {args.kill_rate}/s, "
          f"corrupt rate {args.corrupt_rate}/s, seed {args.seed}; root {root} ({whose}); workers' logs in "
          f"{run_dir}; compile services in {runtime}", flush=True)
    summary = StressRun(args, root, run_dir, runtime).run()
    print_report(summary)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    sys.exit(main())
