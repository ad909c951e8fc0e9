"""`python -m stress.bench --only triton-library`: a real Triton library's own tests under kcache, beside
plain Triton (issue 67), on the GPU.

The library is installed (by default fla-core, flash-linear-attention's kernels: `.whl`, put there by
`.ci/gpu-library.sh`), and one module of its own tests, with their conftest, is in `--library` (by
default `.gpu/library/fla`, the repository's files at the installed version's tag; the default module,
test_hgrn.py, autotunes configs that only split independent channels, so that any pick computes the same
numbers and verdicts cannot differ by the pick). Each run is a fresh
`python -m pytest` of that module on a fresh copy of the folder, timed from its start to its exit (what
the user waits for); plain Triton's runs with an empty TRITON_CACHE_DIR, kcache's as a user starts them,
`kcache run -m pytest ...`, with a root and a compile service of its own. A turn:
- cold: plain Triton (empty TRITON_CACHE_DIR) and kcache (empty root); the two in turns, which goes
  first alternating. Goal: kcache at most 0.6x plain Triton.
- first machine: kcache on an empty root with the project's S3 test server as a shared tier
  (KCACHE_REMOTE, KCACHE_REMOTE_SECRET): it compiles and uploads. No goal: what the tier costs it.
- second machine: an empty root (and service) on the same tier: the first machine's entries.
  Goal: at most 0.3x plain Triton's cold run.
- warm: plain Triton on its cold run's cache and kcache on its cold run's root, `--warm-runs` each, in
  turns. Goal: at most 1.05x.
- tuning alone: plain Triton on a copy of its cold run's cache less the tunes' results (Triton's
  `*.autotune.json`): every kernel is compiled and every tune benchmarks again. No goal: the floor
  under the cold run of any cache that keeps the program's tunes (a cold run tunes; a cache of
  compiled kernels takes away the compiles, never the benchmarks). With each tune's longest compile or C
  build (its launcher) in plain Triton's cold run, and the C builds of no tune: the floor where a tune's
  configs compile at once; and with each tune's front halves in turn: the floor of a cache that runs the
  program's code only in its process (library_floors).
Medians over the turns (`--turns`; `--within-s` starts no turn that could end after it). pytest's verdicts
(every test's outcome, from its JUnit XML) must be identical in every run: the bench lists every test whose
verdict differs, records that count as a reading (goal: 0) and exits 1. Each run's output is kept in
`--logs`. Without a GPU, the library or its tests, one line saying why, and exit 0.
"""

from __future__ import annotations

import importlib.metadata
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stress.procs import PROJECT, worker_env
from stress.service_runtime import fresh_runtime, stop_services

from ..suite.children import bytecode_as_installed
from ..suite.own_run import own_parser, run_own, skipped, write_rows
from .library_floors import untuned
from .library_rows import bench_rows, report
from .library_run import Library, Run
from .library_verdicts import summary, verdicts

LIBRARY = PROJECT / ".gpu" / "library" / "fla"
DIST = "fla-core"
TESTS = "tests/ops/test_hgrn.py"
RUN_TIMEOUT_S = 1200.0  # one pytest run; a cold run of the default module takes a few minutes on an H200


@dataclass
class Lanes:
    """Where the runs go (a folder each, a log each in `logs`), with the environment they share."""
    work: Path
    logs: Path
    base: dict[str, str]
    timeout_s: float = RUN_TIMEOUT_S
    runs: list[Run] = field(default_factory=list)
    started: int = 0  # runs started, the warm-up's too: each run's folder and log are numbered

    def run(self, library: Library, lane: str, turn: int, kcache: bool, env: dict[str, str],
            collect_only: bool = False, spans: Path | None = None) -> Run:
        """One fresh pytest of the module on a fresh copy of the library's folder, recorded in `runs`
        unless `collect_only` (a run that only imports: not timed, nothing recorded); with `spans`, its
        compiles timed there by stress.bench.jobs.compile_spans."""
        self.started += 1
        name = f"{self.started:02d}-{lane.replace(' ', '-')}-turn{turn + 1}"
        folder = self.work / name
        copy, junit = folder / "library", folder / "junit.xml"
        shutil.copytree(library.folder, copy, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        # pytest's rootdir, with an empty configuration: no ini file above it (a checkout's pyproject.toml)
        # adds options or plugins to one lane's runs.
        (copy / "pytest.ini").write_text("[pytest]\n")
        command = [sys.executable, *(["-m", "kcache", "run"] if kcache else []), "-m", "pytest", "-q",
                   "-p", "no:cacheprovider", "--rootdir", str(copy), "--junitxml", str(junit), library.tests,
                   *(["-k", library.keyword] if library.keyword else []), *(["--collect-only"] if collect_only else []),
                   *(["-p", "stress.bench.jobs.compile_spans"] if spans else [])]
        if spans:
            env = {**env, "KT_COMPILE_SPANS": str(spans)}
        log = self.logs / f"{name}.log"
        runtime = fresh_runtime("kl-") if kcache else None  # a compile service of its own, as a fresh machine's
        try:
            with log.open("w") as out:
                started = time.perf_counter()
                own = {"XDG_RUNTIME_DIR": str(runtime)} if runtime else {}
                process = subprocess.Popen(command, cwd=copy, stdout=out, stderr=subprocess.STDOUT,
                                           env={**self.base, **env, **own})
                try:
                    status = process.wait(timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                    raise RuntimeError(f"{lane}: pytest ran past {self.timeout_s:g} s (output in {log})") from None
                wall = time.perf_counter() - started
        finally:
            if runtime is not None:
                stop_services(runtime)
                shutil.rmtree(runtime, ignore_errors=True)
        # 0: all passed; 1: some failed, a verdict like any other. Anything else (interrupted, an internal
        # error, a usage error, no tests collected) is no run of the tests.
        if status not in (0, 1) or not junit.exists():
            said = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{lane}: pytest exited {status} (output in {log}):\n{said}")
        stats = {} if collect_only or not kcache else self.stats(env["KCACHE_DIR"])
        found = Run(name, lane, turn, wall, verdicts(junit), stats,
                    json.loads(spans.read_text()) if spans and spans.exists() else None)
        if not collect_only:
            self.runs.append(found)
            got = found.stats.get("lookups", {}).get("triton")
            root = "" if got is None else f"; its root: {got['compiles']} Triton compiles, {got['hits']} hits"
            print(f"  turn {turn + 1}, {lane}: {wall:.1f} s, {summary(found.verdicts)}{root}", flush=True)
        return found

    def stats(self, root: str) -> dict[str, Any]:
        """`kcache stats --json` of `root` after a run (untimed): what it has compiled and hit so far."""
        done = subprocess.run([sys.executable, "-m", "kcache", "--dir", root, "stats", "--json"], capture_output=True,
                              text=True, env=self.base, timeout=120)
        return json.loads(done.stdout) if done.returncode == 0 else {}

    def warm_up(self, library: Library) -> None:
        """Each command once, collecting only, on caches of its own: the Python bytecode that the first run
        would write (pytest's, the library's, kcache's) is written, so that no timed run pays for it."""
        for kcache in (False, True):
            where = self.work / f"warm-up-{kcache}"
            self.run(library, "warm-up", -1, kcache, {"TRITON_CACHE_DIR": str(where / "triton"),
                                                      "KCACHE_DIR": str(where / "root")}, collect_only=True)


def measure(library: Library, lanes: Lanes, turns: int, warm_runs: int, s3: bool,
            within_s: float | None = None) -> None:
    """The turns, each run recorded in `lanes.runs`."""
    from stress.servers.s3 import s3_server

    secret = secrets.token_hex(16)  # as a fleet's nodes share one: entries are signed and checked
    lanes.warm_up(library)
    started, longest = time.monotonic(), 0.0
    with s3_server() if s3 else nullcontext() as server:
        for turn in range(turns):
            # A turn starts only where one as long as the longest so far still ends in time.
            if within_s is not None and turn and time.monotonic() - started + longest > within_s:
                print(f"  {turn} turns taken: another could end after --within-s {within_s:g}", flush=True)
                break
            begun = time.monotonic()
            own = lanes.work / f"turn-{turn}"
            plain = {"TRITON_CACHE_DIR": str(own / "plain-triton")}
            kcache = {"KCACHE_DIR": str(own / "kcache-root"), "TRITON_CACHE_DIR": str(own / "kcache-triton")}
            cold = [("plain cold", False, plain, own / "compile-spans.json"), ("kcache cold", True, kcache, None)]
            for lane, is_kcache, env, spans in cold if turn % 2 == 0 else cold[::-1]:  # a drift falls on both
                lanes.run(library, lane, turn, is_kcache, env, spans=spans)
            if server is not None:
                tier = {**server.env, "KCACHE_REMOTE": server.url(f"library-{turn}"), "KCACHE_REMOTE_SECRET": secret}
                for lane in ("first machine", "second machine"):
                    name = lane.split()[0]
                    lanes.run(library, lane, turn, True, {**tier, "KCACHE_DIR": str(own / f"{name}-root"),
                                                          "TRITON_CACHE_DIR": str(own / f"{name}-triton")})
            lanes.run(library, "tuning alone", turn, False, {"TRITON_CACHE_DIR": str(untuned(own / "plain-triton"))})
            for _ in range(warm_runs):
                lanes.run(library, "plain warm", turn, False, plain)
                lanes.run(library, "kcache warm", turn, True, kcache)
            longest = max(longest, time.monotonic() - begun)


def main(argv: list[str] | None = None) -> int:
    parser = own_parser("triton_library", description=__doc__.splitlines()[0])
    parser.add_argument("--library", type=Path, default=LIBRARY, help="the folder of the library's tests "
                        f"(default {LIBRARY.relative_to(PROJECT)}: bash .ci/gpu-library.sh puts them there)")
    parser.add_argument("--tests", default=TESTS, help=f"the test module, in that folder (default {TESTS})")
    parser.add_argument("--dist", default=DIST, help=f"the library's distribution, for its version (default {DIST})")
    parser.add_argument("--keyword", help="pytest's -k: a part of the module's tests (fewer parametrizations)")
    parser.add_argument("--turns", type=int, default=1, help="cold and shared-tier runs of each lane (medians)")
    parser.add_argument("--warm-runs", type=int, default=3, help="warm runs of each lane per turn")
    parser.add_argument("--within-s", type=float, help="start no turn that could end after this many seconds")
    parser.add_argument("--logs", type=Path, help="keep each run's output here (default: in the work directory)")
    parser.add_argument("--no-s3", action="store_true", help="leave out the first and second machine")
    args = parser.parse_args(argv)
    from stress.gpu import gpu_missing

    try:
        version = importlib.metadata.version(args.dist)
    except importlib.metadata.PackageNotFoundError:
        version = ""
    missing = gpu_missing() or ("" if version else f"{args.dist} is not installed (.ci/gpu-library.sh: its wheel)")
    if not missing and not (args.library / args.tests).exists():
        missing = f"no {args.library / args.tests} (.ci/gpu-library.sh puts the library's tests there)"
    if skipped("triton-library", missing):
        return 0
    s3 = not args.no_s3
    if s3:
        from stress.servers.s3 import S3ServerMissing, check_installed

        try:
            check_installed()
        except S3ServerMissing as why:
            print(f"triton-library: no shared-tier runs: {why}", flush=True)
            s3 = False
    library = Library(args.library.resolve(), args.tests, args.keyword, args.dist, version)
    work = Path(tempfile.mkdtemp(prefix="kcache-bench-library-"))
    logs = args.logs or work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"triton-library: {library.label}; each run's output in {logs}", flush=True)
    lanes = Lanes(work, logs, lane_base_env(bytecode_as_installed()))  # kcache from bytecode, as pip installs it
    try:
        measure(library, lanes, args.turns, args.warm_runs, s3, args.within_s)
    finally:
        # The caches and copies go; the logs stay.
        for item in work.iterdir():
            if item != logs:
                shutil.rmtree(item, ignore_errors=True)
        if args.logs:
            shutil.rmtree(work, ignore_errors=True)
    rows = bench_rows(library, lanes.runs)
    write_rows(args.rows, rows)
    return report(library, lanes.runs, rows)


def lane_base_env(extra: dict[str, str]) -> dict[str, str]:
    """Every run's environment: this one's with `extra`, less kcache's settings, Triton's cache and S3's
    endpoint (each lane sets its own)."""
    return {key: value for key, value in worker_env(extra).items()
            if not key.startswith(("KCACHE_", "AWS_")) and key not in ("TRITON_CACHE_MANAGER", "TRITON_CACHE_DIR")}


if __name__ == "__main__":
    run_own("triton_library", main)
