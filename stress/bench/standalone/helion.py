"""`python -m stress.bench.standalone.helion`: Helion's autotune with and without kcache (issue 57), on the GPU.

Each reading is a fresh `python -m stress.programs.helion_program` (a kernel of Helion's examples, `--kernel`,
tuned by Helion's RandomSearch over 8 configs through Helion's autotune cache, with Helion's default
fork precompile); its `ready_s` is what the user waits for at the first call: the tune, the winner's
compile and the run. Compiles are counted by the runs of Triton's assemblers (counting wrappers).

- plain: Helion alone, as it ships: its own local autotune cache and Triton's own cache, both fresh.
- first: the same under kcache (HELION_REMOTE_CACHE_BACKEND=kcache.helion.Backend and kcache's Triton
  manager) on a fresh root: Helion's fork children compile through kcache's manager, which forks again.
  Goal: first / plain <= 1.0x (the founding report's constraint: isolation costs no more than fork).
- second: a fresh process on the first's root, Helion's own local cache fresh (another node): it gets
  the pick from kcache. Goals: 0 compiles; second / first <= 0.1x.
- herd: `--procs` fresh processes (default 8) at once on one fresh root. Goals: one tune (compiles at
  most the configs plus the winner), every pick equal, every result correct against torch.

The herd runs first; then plain and first take turns, `--turns` times (medians). Within a turn every
process draws the same 8 configs (HELION_AUTOTUNE_RANDOM_SEED, SEED + the turn, which the program seeds
`random` with before it builds Helion's RandomSearch: Helion draws there, before it seeds; two draws
differ in compile and benchmark time by more than kcache's cost); each turn draws anew, the herd the
draws of turn 1, whose plain tune its compiles are held to. `--within-s S` starts no turn that could end
after S seconds (the longest turn so far plus one of Helion's compile timeouts), so that a device call's
limit cuts no run short: the rows then hold the turns taken. Each reading is printed as it is taken,
with the configs whose compile Helion gave up on (its "Timeout after" warning, after
`autotune_compile_timeout`, 60 s by default: the outliers of a tune's time, in either lane); each
process's stderr is kept in the work directory's `logs/`, beside Helion's own autotune log of it
(HELION_AUTOTUNE_LOG: `autotune-<process>.csv`, a config a line, with its compile time). Every process
has caches of its own, Helion's, Triton's and Inductor's (where Helion writes the code it generates). At
the end a table, and with --rows the bench's rows.

`--against-itself` measures the floor under the first-tune goal: no kcache at all, the kcache lane
replaced by a second lane of Helion alone (fresh caches, the same draws), no herd. Its one row, "Helion
alone against itself", is the ratio that chance alone gives at that many turns.
With no GPU visible, or without Helion, one line saying why, and exits 0.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from stress.procs import PROJECT, release_gated
from stress.programs.triton_programs.assemblers import assembler_runs, counting_assemblers

from ..suite.own_run import own_parser, print_readings, run_own, skipped, write_rows
from ..suite.rows import row
from ..suite.timing import utc_now

CONFIGS = 8  # stress.programs.helion_program's RandomSearch count
KERNELS = ("matmul", "softmax", "layer_norm")  # stress.programs.helion_program's examples (KT_KERNEL)
SEED = 1000  # a turn's seed for Helion's RandomSearch: SEED + the turn
HELION_TIMEOUT_WARNING = "Timeout after "  # Helion's warning for a config whose compile it gave up on
HELION_COMPILE_TIMEOUT_S = 60.0  # Helion's autotune_compile_timeout by default: what one such config adds
KCACHE_ENV = {"HELION_REMOTE_CACHE_BACKEND": "kcache.helion.Backend", "HELION_AUTOTUNE_CACHE": "RemoteAutotuneCache",
              "TRITON_CACHE_MANAGER": "kcache.triton:CacheManager"}


class Lane:
    """Fresh processes of one kernel in `work`, their compiles counted in `work/ptxas`."""

    def __init__(self, work: Path, kernel: str) -> None:
        self.work, self.kernel = work, kernel
        self.counted = work / "ptxas"
        self.counted.mkdir(parents=True)
        self.logs = work / "logs"  # each process's stderr (Helion's own warnings among it), kept
        self.logs.mkdir()
        self._runs = 0

    def env(self, name: str, root: str | None, seed: int = SEED, own: Path | None = None) -> dict[str, str]:
        base = {key: value for key, value in os.environ.items() if not key.startswith(("KCACHE_", "HELION_"))
                and key not in ("TRITON_CACHE_MANAGER", "TRITON_CACHE_DIR")}
        self._runs += 1
        # Helion's and Triton's own caches: fresh for each process, unless `own` names another's (Helion
        # alone on its warm local cache: the user's alternative to kcache for a second process)
        own = own or self.work / f"{name}-{self._runs}"
        self.last_own = own
        return {**base, **counting_assemblers(self.counted), "KT_KERNEL": self.kernel,
                "PYTHONPATH": os.pathsep.join([str(PROJECT), *filter(None, [os.environ.get("PYTHONPATH")])]),
                "HELION_CACHE_DIR": str(own / "helion"), "TRITON_CACHE_DIR": str(own / "triton"),
                "TORCHINDUCTOR_CACHE_DIR": str(own / "inductor"),  # Helion writes its generated code there
                "HELION_AUTOTUNE_RANDOM_SEED": str(seed),
                # Helion's per-config CSV (compile time, status, perf) beside the stderr: where a tune's time went
                "HELION_AUTOTUNE_LOG": str(self.logs / f"autotune-{name}-{self._runs}"),  # .csv and .log
                **({**KCACHE_ENV, "KCACHE_DIR": root} if root is not None else {})}

    def start(self, env: dict[str, str], gate: bool = False) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "stress.programs.helion_program"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(PROJECT),
                                env={**env, **({"KT_GATE": "1"} if gate else {})})

    def one(self, name: str, root: str | None, seed: int, own: Path | None = None) -> dict[str, Any]:
        """One fresh process: its result, and the compiles it ran (`own`: the local caches it shares)."""
        before = assembler_runs(self.counted)
        env = self.env(name, root, seed, own)
        result = finish(self.start(env), self.logs / f"{name}-{self._runs}.log")
        return result | {"compiles": assembler_runs(self.counted) - before}

    def herd(self, procs: int, root: str | None) -> dict[str, Any]:
        """`procs` processes at once: on kcache's `root`, or (None) Helion alone with one local cache."""
        before = assembler_runs(self.counted)
        shared = None if root is not None else self.work / f"herd-alone-{self._runs}"
        herd = [self.start(self.env(f"herd-{i}", root, own=shared), gate=True) for i in range(procs)]
        logs = [self.logs / f"herd-{i}.log" for i in range(procs)]
        released = release_gated(herd)
        results = [finish(process, log) for process, log in zip(herd, logs)]
        return {"wall_s": time.perf_counter() - released, "compiles": assembler_runs(self.counted) - before,
                "picks": len({r["config"] for r in results}), "correct": all(r["correct"] for r in results)}


def finish(process: subprocess.Popen[str], log: Path | None = None) -> dict[str, Any]:
    """A program's reading, with the configs whose compile Helion gave up on (`timeouts`); its stderr
    written to `log`."""
    out, err = process.communicate(timeout=900)
    if log is not None:
        log.write_text(err)
    if process.returncode != 0:
        raise RuntimeError(f"stress.programs.helion_program exited {process.returncode}: {err[-3000:]}")
    return json.loads(out.splitlines()[-1]) | {"timeouts": err.count(HELION_TIMEOUT_WARNING)}


class TurnBudget:
    """Whether one more turn fits `within_s` seconds of the whole run (None: always): the longest turn
    so far, plus one of Helion's compile timeouts, must end in time. A kernel's first turn always runs."""

    def __init__(self, within_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.within_s, self.clock = within_s, clock
        self.started = clock()
        self.longest_s: float | None = None

    def next_fits(self, turn: int) -> bool:
        if self.within_s is None or self.longest_s is None or turn == 0:
            return True
        return self.clock() - self.started + self.longest_s + HELION_COMPILE_TIMEOUT_S <= self.within_s

    def took(self, seconds: float) -> None:
        self.longest_s = max(seconds, self.longest_s or 0.0)


def measure(kernel: str, turns: int, procs: int, budget: TurnBudget,
            against_itself: bool = False) -> dict[str, Any]:
    lane = Lane(Path(tempfile.mkdtemp(prefix="kcache-bench-helion-")), kernel)
    print(f"  {kernel}: each process's stderr in {lane.logs}", flush=True)
    herd = herd_alone = None
    if not against_itself:  # first, so that --within-s bounds only the turns
        herd = lane.herd(procs, str(lane.work / "root-herd"))
        herd_alone = lane.herd(procs, None)  # the user's alternative: Helion alone, one local cache
        print(f"  {kernel}: herd of {procs}: {herd['picks']} pick(s), {herd['compiles']} compiles, "
              f"in {herd['wall_s']:.1f} s; Helion alone {herd_alone['compiles']} compiles in "
              f"{herd_alone['wall_s']:.1f} s", flush=True)
    plain: list[dict[str, Any]] = []
    plain_warm: list[dict[str, Any]] = []  # Helion alone's second process, on the first's local cache
    first: list[dict[str, Any]] = []
    second: list[dict[str, Any]] = []
    for turn in range(turns):  # taking turns: a drift of the machine falls on both lanes
        if not budget.next_fits(turn):
            print(f"  {kernel}: {turn} turns taken: another could end after --within-s {budget.within_s:g}",
                  flush=True)
            break
        begun = time.monotonic()
        root = str(lane.work / f"root-{turn}")
        others = [("plain-b", first, None)] if against_itself else [("plain-warm", plain_warm, None),
                                                                     ("first", first, root), ("second", second, root)]
        plain_caches = None
        for name, readings, where in [("plain", plain, None), *others]:
            readings.append(lane.one(name, where, SEED + turn, plain_caches if name == "plain-warm" else None))
            plain_caches = plain_caches or lane.last_own  # the plain process's own caches
            # as it is taken: a run cut short by a time limit still shows its readings, and where it stopped
            timeouts = readings[-1]["timeouts"]
            print(f"  {kernel}, turn {turn + 1}: {name} ready in {readings[-1]['ready_s']:.2f} s, "
                  f"{readings[-1]['compiles']} compiles"
                  + (f", {timeouts} config(s) timed out in Helion's precompile" if timeouts else ""), flush=True)
        budget.took(time.monotonic() - begun)
    every = plain + plain_warm + first + second
    return {"kernel": kernel, "plain": plain, "plain_warm": plain_warm, "first": first, "second": second, "herd": herd,
            "herd_alone": herd_alone, "procs": procs, "against_itself": against_itself,
            "correct": all(r["correct"] for r in every) and all(h is None or h["correct"] for h in (herd, herd_alone)),
            "same_pick": all(s["config"] == f["config"] for f, s in zip(first, second))}


def bench_rows(found: dict[str, Any]) -> list[dict[str, Any]]:
    kernel = found["kernel"]

    def median(lane: str, field: str = "ready_s") -> float:
        return statistics.median(r[field] for r in found[lane])

    timeouts = row("helion", f"{kernel}: configs timed out in Helion's precompile, all turns",
                   sum(r["timeouts"] for r in found["first"]), sum(r["timeouts"] for r in found["plain"]), "configs",
                   "Helion alone (fork)")  # not a goal: why a lane's median can move by a minute, in either lane
    if found.get("against_itself"):  # the floor: chance's ratio, no goal
        return [row("helion", f"{kernel}: Helion alone against itself, ready", median("first"), median("plain"), "s",
                    "Helion alone (fork)"), timeouts]
    herd = found["herd"]
    return [
        row("helion", f"{kernel}: first tune, ready", median("first"), median("plain"), "s", "Helion alone (fork)"),
        row("helion", f"{kernel}: second process, ready", median("second"), median("plain_warm"), "s",
            "Helion alone on its warm local cache"),
        row("helion", f"{kernel}: second process, compiles", max(r["compiles"] for r in found["second"]), None,
            "runs", ""),
        # against turn 1's plain tune: the herd's draws (SEED); another turn's draws time out other configs
        row("helion", f"{kernel}: herd of {found['procs']}, compiles", herd["compiles"], found["plain"][0]["compiles"],
            "runs", "one plain tune"),
        row("helion", f"{kernel}: herd of {found['procs']}, distinct picks", herd["picks"], None, "picks", ""),
        row("helion", f"{kernel}: herd of {found['procs']}, wall", herd["wall_s"], found["herd_alone"]["wall_s"], "s",
            f"{found['procs']} Helion processes on its local cache"),
        timeouts,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = own_parser("helion")
    parser.add_argument("--kernel", action="append", choices=KERNELS)
    parser.add_argument("--turns", type=int, default=3, help="readings of each lane, taking turns (medians)")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--within-s", type=float, help="start no turn that could end after this many seconds")
    parser.add_argument("--against-itself", action="store_true",
                        help="the floor: a second lane of Helion alone in place of kcache's, no herd")
    parser.add_argument("--readings", type=Path, help="write every process's reading here (JSON)")
    args = parser.parse_args(argv)
    from ..suite.needs import unavailable

    if skipped("helion", unavailable("helion")):
        return 0
    import torch

    budget = TurnBudget(args.within_s)
    found = [measure(kernel, args.turns, args.procs, budget, args.against_itself)
             for kernel in args.kernel or ["matmul"]]
    if args.readings:
        args.readings.write_text(json.dumps(found, indent=1))
    rows = [r for one in found for r in bench_rows(one)]
    write_rows(args.rows, rows)
    taken = ", ".join(f"{one['kernel']} {len(one['first'])}" for one in found)
    print(f"helion: {CONFIGS} configs, RandomSearch, turns taken: {taken}, {torch.cuda.get_device_name()}, "
          f"{utc_now()}")
    print_readings(rows, 40)
    for one in found:
        herd = one["herd"]
        print(f"  {one['kernel']}: correct {one['correct']}" + ("" if herd is None else
              f", second's pick equal {one['same_pick']}, herd {herd['picks']} pick(s), {herd['compiles']} compiles, "
              f"wall {herd['wall_s']:.1f} s"))
    return 0


if __name__ == "__main__":
    run_own("helion", main)
