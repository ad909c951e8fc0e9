"""`python -m stress`: N fresh processes call get_or_compile on a few kernels against one cache root.

This is the README's main job. It prints what each process did (compiles,
hits, errors) and exits non-zero if an invariant is broken: a worker
failed, or more compiles happened than there are distinct kernels.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from .procs import Barrier


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m stress", description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, default=4, help="fresh worker processes (default 4)")
    p.add_argument("--kernels", type=int, default=3, help="distinct kernels from the pool (default 3)")
    p.add_argument("--rounds", type=int, default=2, help="passes over the kernels per process (default 2)")
    p.add_argument("--cache-dir", help="cache root (default: $KCACHE_DIR or the user cache directory)")
    p.add_argument("--fresh", action="store_true", help="use a new empty cache root in a temporary directory")
    p.add_argument("--check-gpu", action="store_true", help="run every kernel on the GPU against torch")
    p.add_argument("--json", help="also write the summary as JSON to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.fresh:
        root = Path(tempfile.mkdtemp(prefix="kcache-stress-"))
    elif args.cache_dir:
        root = Path(args.cache_dir)
    else:
        from kcache.config import default_root

        root = default_root()
    print(f"kcache stress: {args.procs} processes, {args.kernels} kernels, {args.rounds} rounds, root {root}")
    started = time.monotonic()
    barrier = Barrier("stress.worker", args.procs, [
        "--root", str(root), "--kernels", str(args.kernels), "--rounds", str(args.rounds),
        *(["--check-gpu"] if args.check_gpu else []),
    ])
    barrier.wait_ready()
    release = barrier.release()
    results = barrier.collect()
    wall = time.monotonic() - release

    rows, failures = [], []
    totals = {"compiles": 0, "memory_hits": 0, "disk_hits": 0, "lock_waits": 0, "corrupt_entries": 0}
    for r in results:
        if r.result is None:
            failures.append(f"worker {r.index} died (rc={r.returncode}): {r.stderr[-2000:]}")
            continue
        stats = r.result["stats"]
        for name in totals:
            totals[name] += stats[name]
        failures += [f"worker {r.index}: {e}" for e in r.result["errors"]]
        if r.result["wrong_results"]:
            failures.append(f"worker {r.index}: {r.result['wrong_results']} wrong results")
        rows.append((r.index, r.result["pid"], stats["compiles"], stats["disk_hits"], stats["memory_hits"],
                     stats["lock_waits"], len(r.result["errors"])))

    print(f"{'proc':>4} {'pid':>8} {'compiles':>8} {'disk':>6} {'memory':>7} {'waits':>6} {'errors':>6}")
    for row in rows:
        print(f"{row[0]:>4} {row[1]:>8} {row[2]:>8} {row[3]:>6} {row[4]:>7} {row[5]:>6} {row[6]:>6}")
    if totals["compiles"] > args.kernels:
        failures.append(f"{totals['compiles']} compiles for {args.kernels} distinct kernels")
    print(f"total: {totals['compiles']} compiles for {args.kernels} kernels, {totals['disk_hits']} disk hits, "
          f"{totals['memory_hits']} memory hits, {totals['lock_waits']} lock waits; "
          f"{wall:.1f} s after the barrier ({time.monotonic() - started:.1f} s in all)")
    summary = {"procs": args.procs, "kernels": args.kernels, "rounds": args.rounds, "root": str(root),
               "wall_s": wall, "totals": totals, "failures": failures}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    print("invariants:", "FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
