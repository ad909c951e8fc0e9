"""`python -m stress.bench.helion`: Helion's autotune with and without kcache (issue 57), on the GPU.

Each reading is a fresh `python -m stress.helion_program` (a kernel of Helion's examples, `--kernel`,
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

plain and first take turns, `--turns` times (medians). Within a turn every process draws the same 8
configs (HELION_AUTOTUNE_RANDOM_SEED, SEED + the turn: Helion's default seed is the time, and two
draws differ in compile and benchmark time by more than kcache's cost); each turn draws anew. Each
reading is printed as it is taken; at the end a table, and with --rows the bench's rows.
With no GPU visible, or without Helion, one line saying why, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..procs import PROJECT, READY_WITHIN_S, line_within
from ..triton_program import assembler_runs, counting_assemblers
from .rows import row, rows_option, write_rows

CONFIGS = 8  # stress.helion_program's RandomSearch count
SEED = 1000  # a turn's seed for Helion's RandomSearch: SEED + the turn
KCACHE_ENV = {"HELION_REMOTE_CACHE_BACKEND": "kcache.helion.Backend", "HELION_AUTOTUNE_CACHE": "RemoteAutotuneCache",
              "TRITON_CACHE_MANAGER": "kcache.triton:CacheManager"}


class Lane:
    """Fresh processes of one kernel in `work`, their compiles counted in `work/ptxas`."""

    def __init__(self, work: Path, kernel: str) -> None:
        self.work, self.kernel = work, kernel
        self.counted = work / "ptxas"
        self.counted.mkdir(parents=True)
        self._runs = 0

    def env(self, name: str, root: str | None, seed: int = SEED) -> dict[str, str]:
        base = {key: value for key, value in os.environ.items() if not key.startswith(("KCACHE_", "HELION_"))
                and key not in ("TRITON_CACHE_MANAGER", "TRITON_CACHE_DIR")}
        self._runs += 1
        own = self.work / f"{name}-{self._runs}"  # Helion's and Triton's own caches: fresh for each process
        return {**base, **counting_assemblers(self.counted), "KT_KERNEL": self.kernel,
                "PYTHONPATH": os.pathsep.join([str(PROJECT), *filter(None, [os.environ.get("PYTHONPATH")])]),
                "HELION_CACHE_DIR": str(own / "helion"), "TRITON_CACHE_DIR": str(own / "triton"),
                "HELION_AUTOTUNE_RANDOM_SEED": str(seed),
                **({**KCACHE_ENV, "KCACHE_DIR": root} if root is not None else {})}

    def start(self, env: dict[str, str], gate: bool = False) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "stress.helion_program"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(PROJECT),
                                env={**env, **({"KT_GATE": "1"} if gate else {})})

    def one(self, name: str, root: str | None, seed: int) -> dict[str, Any]:
        """One fresh process: its result, and the compiles it ran."""
        before = assembler_runs(self.counted)
        result = finish(self.start(self.env(name, root, seed)))
        return result | {"compiles": assembler_runs(self.counted) - before}

    def herd(self, procs: int, root: str) -> dict[str, Any]:
        before = assembler_runs(self.counted)
        herd = [self.start(self.env(f"herd-{i}", root), gate=True) for i in range(procs)]
        for process in herd:
            if line_within(process, READY_WITHIN_S).strip() != "ready":
                raise RuntimeError(f"a herd process did not start: {process.communicate(timeout=60)[1][-2000:]}")
        released = time.perf_counter()
        for process in herd:
            process.stdin.write("go\n")  # type: ignore[union-attr]
            process.stdin.flush()  # type: ignore[union-attr]
        results = [finish(process) for process in herd]
        return {"wall_s": time.perf_counter() - released, "compiles": assembler_runs(self.counted) - before,
                "picks": len({r["config"] for r in results}), "correct": all(r["correct"] for r in results)}


def finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = process.communicate(timeout=900)
    if process.returncode != 0:
        raise RuntimeError(f"stress.helion_program exited {process.returncode}: {err[-3000:]}")
    return json.loads(out.splitlines()[-1])


def measure(kernel: str, turns: int, procs: int) -> dict[str, Any]:
    lane = Lane(Path(tempfile.mkdtemp(prefix="kcache-bench-helion-")), kernel)
    plain, first, second = [], [], []
    for turn in range(turns):  # taking turns: a drift of the machine falls on both lanes
        root = str(lane.work / f"root-{turn}")
        for name, readings, where in (("plain", plain, None), ("first", first, root), ("second", second, root)):
            readings.append(lane.one(name, where, SEED + turn))
            # as it is taken: a run cut short by a time limit still shows its readings, and where it stopped
            print(f"  {kernel}, turn {turn + 1}: {name} ready in {readings[-1]['ready_s']:.2f} s, "
                  f"{readings[-1]['compiles']} compiles", flush=True)
    herd = lane.herd(procs, str(lane.work / "root-herd"))  # a draw of its own: SEED
    every = plain + first + second
    return {"kernel": kernel, "plain": plain, "first": first, "second": second, "herd": herd, "procs": procs,
            "correct": all(r["correct"] for r in every) and herd["correct"],
            "same_pick": all(s["config"] == f["config"] for f, s in zip(first, second))}


def bench_rows(found: dict[str, Any]) -> list[dict[str, Any]]:
    kernel = found["kernel"]

    def median(lane: str, field: str = "ready_s") -> float:
        return statistics.median(r[field] for r in found[lane])

    herd = found["herd"]
    return [
        row("helion", f"{kernel}: first tune, ready", median("first"), median("plain"), "s", "Helion alone (fork)"),
        row("helion", f"{kernel}: second process, ready", median("second"), median("first"), "s",
            "the first process under kcache"),
        row("helion", f"{kernel}: second process, compiles", max(r["compiles"] for r in found["second"]), None,
            "runs", ""),
        row("helion", f"{kernel}: herd of {found['procs']}, compiles", herd["compiles"], median("plain", "compiles"),
            "runs", "one plain tune"),
        row("helion", f"{kernel}: herd of {found['procs']}, distinct picks", herd["picks"], None, "picks", ""),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stress.bench.helion")
    parser.add_argument("--kernel", action="append", choices=("matmul", "softmax"))
    parser.add_argument("--turns", type=int, default=3, help="readings of each lane, taking turns (medians)")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--readings", type=Path, help="write every process's reading here (JSON)")
    rows_option(parser)
    args = parser.parse_args(argv)
    from ..gpu import gpu_missing

    missing = gpu_missing()
    try:
        import helion  # noqa: F401
    except ImportError:
        missing = missing or "Helion is not installed (pip install helion)"
    if missing is not None:
        print(f"helion: skipped: {missing}", flush=True)
        return 0
    import torch

    found = [measure(kernel, args.turns, args.procs) for kernel in args.kernel or ["matmul"]]
    if args.readings:
        args.readings.write_text(json.dumps(found, indent=1))
    rows = [r for one in found for r in bench_rows(one)]
    write_rows(args.rows, rows)
    print(f"helion: {CONFIGS} configs, RandomSearch, {args.turns} turns, {torch.cuda.get_device_name()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}x"
        baseline = "-" if r["tilelang"] is None else f"{r['tilelang']:.4g}"
        print(f"  {r['metric']:40} {r['kcache']:>9.4g} {r['unit']:4} vs {baseline:>8}  {ratio}")
    for one in found:
        print(f"  {one['kernel']}: correct {one['correct']}, second's pick equal {one['same_pick']}, herd "
              f"{one['herd']['picks']} pick(s), {one['herd']['compiles']} compiles, wall {one['herd']['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    from ..command_scope import run_command

    sys.exit(run_command("python -m stress.bench.helion", main))
