"""`python -m stress.bench`: kcache against its baseline, side by side in one run, on the same kernels.

The baseline is TileLang's own cache unless a row says otherwise.

The scenarios are registered in stress.bench.suite.scenarios, one module each under stress/bench/: herd, disk,
memory, compile, cli, remote, cold, many, triton and warm are measured in the bench's run (all of them
by default); tune, tune-once, dropin, deploy, bundle, multigpu, helion and triton-library have runs of their
own, started when named with --only (arguments the bench does not know go to them). A scenario whose tools are missing
here (redis-server for remote, a CUDA toolkit for the ones that compile) is skipped with one line saying
why and what to install.

  --record        appends the run's readings to the dataset (benchmarks/results.jsonl, or --results); an own
                  run writes its readings as rows to a file the bench names (--rows FILE), recorded alike.
  --profile       breaks a scenario's time into phases instead of measuring it (herd, disk, cold, triton).
  --plots         draws the dataset's plots into docs/img/ (or --out) and measures nothing.

The bench runs its children's compile services in a runtime directory of its own and stops them at
its end, with every process it started. SIGINT or SIGTERM stops it with one line: the scenarios done,
their rows (written to `--json FILE` if given), the work directory removed; exit status 130 or 143.
`--json FILE` writes the rows {"scenario", "metric", "kcache", "tilelang", "ratio", "unit", "baseline"}:
"tilelang" holds the baseline's value, "baseline" names it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kcache.interruption import Interrupted, ignore_further_signals

from ..command_scope import command_scope
from ..procs import PROJECT
from .cold import MODES as COLD_MODES
from .suite.children import bytecode_as_installed
from .suite.dataset import DATASET, record
from .suite.needs import unavailable
from .suite.rows import print_table
from .suite.scenarios import BY_NAME, IN_RUN, SCENARIOS

PLOTS = PROJECT / "docs" / "img"
WRITES_JSON = ("tune-once", "deploy", "multigpu")  # the own runs that take --json FILE


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m stress.bench", description=__doc__.splitlines()[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[3:]))
    p.add_argument("--only", choices=[s.name for s in SCENARIOS], action="append",
                   help="run only these scenarios (default: every one measured in the bench's run)")
    p.add_argument("--record", action="store_true", help="append the readings to the dataset")
    p.add_argument("--results", type=Path, default=DATASET, help=f"the dataset (default {DATASET.relative_to(PROJECT)})")
    p.add_argument("--profile", action="store_true", help="profile the --only scenarios instead of measuring them")
    p.add_argument("--plots", action="store_true", help="draw the dataset's plots, measure nothing")
    p.add_argument("--out", type=Path, default=PLOTS, help=f"where --plots writes (default {PLOTS.relative_to(PROJECT)})")
    p.add_argument("--procs", type=int, default=4, help="herd size (use 16 on a 16-core machine)")
    p.add_argument("--repeats", type=int, default=10, help="fresh processes per disk-hit measurement")
    p.add_argument("--herd-repeats", type=int, default=3, help="cold herds per cache (medians are reported)")
    p.add_argument("--sequential", type=int, default=8, help="distinct kernels compiled one by one (compile scenario)")
    p.add_argument("--parallel", type=int, default=16, help="configs compiled at once (compile scenario)")
    p.add_argument("--cli-entries", type=int, default=10_000, help="entries for the cli scenario")
    p.add_argument("--compile-workers", default="auto", help="pool size for the compile scenario (default: CPU count)")
    p.add_argument("--cold-repeats", type=int, default=5, help="fresh processes per mode (cold scenario)")
    p.add_argument("--cold-without-pool", action="store_true",
                   help="leave out the per-process pool's mode, which no goal reads (cold scenario)")
    p.add_argument("--cold-mode", action="append", choices=COLD_MODES[1:],
                   help="run only TileLang's mode and this one (repeatable; cold scenario)")
    p.add_argument("--many-procs", type=int, default=8, help="processes (many scenario)")
    p.add_argument("--many-configs", type=int, default=16, help="configs each process compiles (many scenario)")
    p.add_argument("--warm-kernels", type=int, default=200, help="kernels on disk (warm scenario)")
    p.add_argument("--warm-repeats", type=int, default=3, help="fresh processes per mode (warm scenario)")
    p.add_argument("--triton-rows", action="append", choices=("hit", "cold", "precompile", "autotune", "tunes"),
                   help="only these rows of the triton scenario (default: all; autotune and tunes need a GPU)")
    p.add_argument("--json", help="write the rows to this file")
    return p.parse_known_args(argv)


def profile_arguments(argv: list[str]) -> list[str]:
    """The command line without --only NAME and --profile: the rest is the profile's own (its --repeats,
    --procs and --json mean what the profile says, not what the bench's parser would take them for)."""
    rest, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--only":
            skip = True
        elif arg != "--profile" and not arg.startswith("--only="):
            rest.append(arg)
    return rest


def profile(names: list[str], passed_on: list[str]) -> int:
    """Each named scenario's profile, given every argument but --only and --profile (e.g. --kernel matmul)."""
    missing = [name for name in names if BY_NAME[name].profile is None]
    if missing or not names:
        with_one = ", ".join(s.name for s in SCENARIOS if s.profile)
        print(f"stress.bench: --profile needs --only with one of {with_one}", file=sys.stderr)
        return 2
    for name in names:
        reason = unavailable(name)  # what the profile needs is what its scenario needs
        if reason is not None:
            print(f"{name}: profile skipped: {reason}", file=sys.stderr)
            return 2
        BY_NAME[name].load_profile().main(passed_on)
    return 0


def own_run(name: str, passed_on: list[str]) -> int:
    command = [sys.executable, "-m", f"stress.bench.{BY_NAME[name].module}", *passed_on]
    print(f"{name}: its own run: {' '.join(command[1:])}", flush=True)
    return subprocess.run(command, cwd=PROJECT, check=False).returncode


def own_run_recorded(name: str, passed_on: list[str], results: Path) -> int:
    """The own run, asked for its rows (--rows FILE), which are recorded as the bench's own: whatever its
    exit status (a missed goal is a reading too); none where it wrote none (skipped, or failed first)."""
    with tempfile.TemporaryDirectory(prefix="kcache-bench-rows-") as scratch:
        rows_file = Path(scratch) / "rows.json"
        status = own_run(name, [*passed_on, "--rows", str(rows_file)])
        rows = json.loads(rows_file.read_text()) if rows_file.exists() else []
    if not rows:
        print(f"stress.bench: --record: {name} wrote no rows (exit status {status}): nothing recorded",
              file=sys.stderr)
        return status
    print_table(rows)
    readings = record(rows, results)
    print(f"stress.bench: {len(readings)} readings of {name} appended to {results}", flush=True)
    return status


def measure(options: argparse.Namespace, names: list[str]) -> int:
    env = bytecode_as_installed()
    only = [name for name in names if name in IN_RUN]
    for name in list(only):
        reason = unavailable(name)
        if reason is not None:
            print(f"{name}: skipped: {reason}", flush=True)
            only.remove(name)
    work = Path(tempfile.mkdtemp(prefix="kcache-bench-"))
    rows: list[dict[str, Any]] = []
    done: list[str] = []
    try:
        # Its own runtime directory: the compile services of the scenarios that name none are the
        # bench's, stopped at its end, never the user's (stress.command_scope).
        with command_scope() as scope:
            print(f"stress.bench: scenarios {', '.join(only) or 'none'}; work directory "
                  f"{work}; compile services in {scope.runtime}", flush=True)
            for name in only:
                print(f"{name}: measuring", flush=True)
                rows += BY_NAME[name].load().rows(options, work, env)
                done.append(name)
    except Interrupted as stop:
        ignore_further_signals()
        shutil.rmtree(work, ignore_errors=True)
        during = next((name for name in only if name not in done), None)
        written = f", written to {options.json}" if options.json and rows else ""
        if written:
            Path(options.json).write_text(json.dumps(rows, indent=1))
        print(f"stress.bench: interrupted by {stop.name}{f' during {during}' if during else ''}: "
              f"{len(rows)} rows measured ({', '.join(done) or 'no scenario finished'}){written}; "
              f"work directory {work} removed", file=sys.stderr)
        return stop.exit_status
    except BaseException:
        print(f"stress.bench: work directory kept: {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    if options.json:
        Path(options.json).write_text(json.dumps(rows, indent=1))
    if options.record and rows:
        readings = record(rows, options.results)
        print(f"stress.bench: {len(readings)} readings appended to {options.results}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    options, passed_on = parse(argv)
    if options.plots:
        from .suite.plots import draw

        for path in draw(options.results, options.out):
            print(path)
        return 0
    names = options.only or list(IN_RUN)
    if options.profile:
        return profile(options.only or [], profile_arguments(sys.argv[1:] if argv is None else argv))
    own = [name for name in names if BY_NAME[name].own_run]
    if passed_on and not own:
        print(f"stress.bench: unrecognized arguments: {' '.join(passed_on)}", file=sys.stderr)
        return 2
    status = measure(options, names) if any(name in IN_RUN for name in names) else 0
    for name in own:
        # Only tune-once, deploy and multigpu take --json (their rows, in their own shape); the others'
        # parsers would refuse it. Every own run takes --rows FILE, the bench's rows for --record.
        json_out = ["--json", options.json] if options.json and name in WRITES_JSON else []
        if options.record:
            ran = own_run_recorded(name, [*passed_on, *json_out], options.results)
        else:
            ran = own_run(name, [*passed_on, *json_out])
        status = status or ran
    return status


if __name__ == "__main__":
    sys.exit(main())
