"""`python -m stress.bench.standalone.deploy`: issue 18's two-machine goal, simulated on one GPU machine with two
roots and fresh processes.

- A (build machine): an empty root, KCACHE_RECORD, `kcache.install()`, the unmodified programs of
  stress/programs/tilelang_programs (GEMM, elementwise, flash attention) run and their outputs saved.
- export: `python -m kcache --dir A export BUNDLE --keys KEYS`, signed (KCACHE_BUNDLE_SECRET), then
  `verify-coverage`; import: `python -m kcache --dir B import BUNDLE` into an empty root, timed (the
  CLI's wall time, and the import's own seconds).
- B (serving machine): a fresh process on root B under KCACHE_JIT_GUARD=error runs the same programs:
  it must compile nothing (kcache's count, and an nvcc wrapper's) and compute exactly A's outputs.
- baselines, fresh processes on the same machine: kcache compiling the same kernels into an empty root
  C, and TileLang alone with an empty TILELANG_CACHE_DIR.

A kernel is ready when the program has it (the compiled kernel returned); times are from the start of
the process (its imports included: what a serving process pays, and the launches of the programs
before) and, per program, from the start of its first call. Each program's launch (its own check,
synchronized) comes after its kernel is ready, and is reported apart (launched_s). Every machine has its own compile service (a fresh runtime directory), stopped after.
`--no-launch` (a machine with no GPU) builds and loads every kernel but runs none: outputs are not
compared, and the JSON says so.

Prints a table and one line "result {json}" (`--json PATH` writes the same; `--rows PATH` the bench's
rows: B's compiles, and import plus B's first kernel ready against each baseline); exits 1 if B compiled
anything, refused a kernel, or computed another output than A.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stress.gpu import gpu_missing, tilelang_target_env
from stress.nvcc_counter import NvccCounter
from stress.procs import PROJECT, run_for_result, worker_env, worker_report
from stress.service_runtime import own_services

from ..suite.own_run import own_parser, run_own, write_rows
from ..suite.rows import row
from ..suite.timing import utc_now

PROGRAMS = ("gemm", "elementwise", "attention")
BUNDLE_SECRET = "bench-deploy"
# Each machine is its root and nothing else: no remote tier, no recording or guard but its own, and the
# plain baseline never gets kcache through KCACHE_TILELANG.
MACHINE_DEFAULTS = {"KCACHE_REMOTE": "", "KCACHE_RECORD": "", "KCACHE_JIT_GUARD": "off", "KCACHE_TILELANG": ""}


def run_machine(work: Path, name: str, root: Path, *, launch: bool, plain: bool = False,
                env: dict[str, str] | None = None) -> dict[str, Any]:
    """One fresh process of stress.bench.jobs.deploy_machine on `root`, its compiles counted by an nvcc wrapper;
    its report, with its ready times from the process's start."""
    home = work / name
    (home / "outputs").mkdir(parents=True)
    counter = NvccCounter(home)
    command = [sys.executable, "-m", "stress.bench.jobs.deploy_machine", "--outputs", str(home / "outputs"),
               *(word for program in PROGRAMS for word in ("--program", program)),
               *(["--no-launch"] if not launch else []), *(["--plain"] if plain else [])]
    with own_services("kd-") as runtime:
        machine_env = {**MACHINE_DEFAULTS, "KCACHE_DIR": str(root), "TILELANG_CACHE_DIR": str(home / "tilelang"),
                       "XDG_RUNTIME_DIR": str(runtime), **counter.env(), **tilelang_target_env(), **(env or {})}
        started = time.time()
        result = run_for_result(command, f"machine {name}", machine_env, timeout=1800)
    ready = [row["ready_at"] - started for row in result["programs"] if "ready_at" in row]
    stats = result["stats"]
    return {**result, "machine": name, "imports_s": result["imported_at"] - started,
            "first_ready_s": ready[0] if ready else None,
            "all_ready_s": ready[-1] if len(ready) == len(PROGRAMS) else None,
            "compiles": int(stats["compiles"]) if stats else None, "nvcc_runs": counter.count(),
            "refused": [row["program"] for row in result["programs"] if "refused" in row]}


def kcache_cli(*argv: str) -> tuple[dict[str, Any], float]:
    """`python -m kcache --json ARGV` as a user runs it (signed bundles): its JSON answer and wall seconds."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kcache", "--json", *argv], capture_output=True, text=True,
                          env=worker_env({**MACHINE_DEFAULTS, "KCACHE_BUNDLE_SECRET": BUNDLE_SECRET}),
                          cwd=str(PROJECT), timeout=600, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"kcache {' '.join(argv)} failed (exit status {done.returncode}): "
                           f"{done.stdout[-2000:]} {done.stderr[-2000:]}")
    return json.loads(done.stdout), wall


def same_outputs(a: dict[str, Any], b: dict[str, Any]) -> dict[str, bool]:
    """Per program: whether B's saved outputs equal A's exactly (the same kernel on the same inputs)."""
    import torch

    equal = {}
    for row_a, row_b in zip(a["programs"], b["programs"], strict=True):
        if "outputs" not in row_a or "outputs" not in row_b:
            equal[row_a["program"]] = False
            continue
        saved_a, saved_b = torch.load(row_a["outputs"]), torch.load(row_b["outputs"])
        equal[row_a["program"]] = saved_a.keys() == saved_b.keys() and all(
            torch.equal(saved_a[name], saved_b[name]) for name in saved_a)
    return equal


def ratio(over: float | None, under: float | None) -> float | None:
    return over / under if over is not None and under else None


def summarize(machines: dict[str, dict[str, Any]], exported: dict[str, Any], imported: dict[str, Any],
              import_wall_s: float, keys: int, launch: bool) -> dict[str, Any]:
    a, b, cold, plain = machines["A"], machines["B"], machines["C"], machines["plain"]
    outputs = same_outputs(a, b) if launch else None
    first_after_import = b["first_ready_s"] + import_wall_s if b["first_ready_s"] is not None else None
    all_after_import = b["all_ready_s"] + import_wall_s if b["all_ready_s"] is not None else None
    return {
        "programs": list(PROGRAMS), "launched": launch,
        "outputs_compared": launch, "outputs_equal": all(outputs.values()) if outputs is not None else None,
        "outputs_equal_by_program": outputs,
        "sources_equal": [r.get("sources") for r in a["programs"]] == [r.get("sources") for r in b["programs"]],
        "keys_recorded": keys, "compiles_on_a": a["compiles"], "exported_entries": exported["entries"],
        "bundle_bytes": exported["bytes"], "imported_entries": imported["imported"],
        "import_s": imported["seconds"], "import_wall_s": import_wall_s,
        "compiles_on_b": b["compiles"], "nvcc_runs_on_b": b["nvcc_runs"], "refused_on_b": b["refused"],
        "b_first_ready_s": b["first_ready_s"], "b_all_ready_s": b["all_ready_s"],
        "import_plus_first_ready_s": first_after_import, "import_plus_all_ready_s": all_after_import,
        "cold_kcache_first_ready_s": cold["first_ready_s"], "cold_kcache_all_ready_s": cold["all_ready_s"],
        "cold_kcache_compiles": cold["compiles"],
        "plain_tilelang_first_ready_s": plain["first_ready_s"], "plain_tilelang_all_ready_s": plain["all_ready_s"],
        "plain_tilelang_nvcc_runs": plain["nvcc_runs"],
        "ratio_import_plus_first_ready_over_cold_kcache": ratio(first_after_import, cold["first_ready_s"]),
        "ratio_import_plus_first_ready_over_plain_tilelang": ratio(first_after_import, plain["first_ready_s"]),
        "ratio_import_plus_all_ready_over_cold_kcache": ratio(all_after_import, cold["all_ready_s"]),
        "ratio_import_plus_all_ready_over_plain_tilelang": ratio(all_after_import, plain["all_ready_s"]),
        "machines": machines,
    }


def bench_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """B's compiles, and the import plus B's first kernel ready (where B had one) against each baseline."""
    first, ready = "import plus first kernel ready on B", result["import_plus_first_ready_s"]
    rows = [row("deploy", "compiles on B", result["compiles_on_b"], None, "runs", "")]
    if ready is not None:
        rows += [row("deploy", first, ready, result["cold_kcache_first_ready_s"], "s", "a cold kcache"),
                 row("deploy", f"{first}, against TileLang alone", ready, result["plain_tilelang_first_ready_s"],
                     "s", "TileLang alone")]
    return rows


def print_table(result: dict[str, Any], device: str) -> None:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    print(f"deploy: {', '.join(PROGRAMS)} on {device}, {'launched' if result['launched'] else 'not launched'}, "
          f"{utc_now()}")
    print(f"{'machine':24} {'compiles':>8} {'nvcc':>5} {'imports s':>9} {'first ready s':>13} {'all ready s':>11}  "
          "call to ready s, per program")
    labels = {"A": "A: record", "B": "B: bundle, guard=error", "C": "C: kcache cold", "plain": "TileLang alone, cold"}
    for name, label in labels.items():
        m = result["machines"][name]
        calls = ", ".join(f"{row['program']} {seconds(row.get('call_to_ready_s'))}" if "refused" not in row
                          else f"{row['program']} REFUSED" for row in m["programs"])
        compiles = "-" if m["compiles"] is None else str(m["compiles"])
        print(f"{label:24} {compiles:>8} {m['nvcc_runs']:>5} {m['imports_s']:>9.2f} {seconds(m['first_ready_s']):>13} "
              f"{seconds(m['all_ready_s']):>11}  {calls}")
    print(f"bundle: {result['exported_entries']} entries of {result['keys_recorded']} recorded keys, "
          f"{result['bundle_bytes'] / 1e6:.1f} MB; import {result['import_wall_s']:.2f} s wall "
          f"({result['import_s']:.2f} s in import_bundle)")
    print(f"import + first kernel ready on B: {seconds(result['import_plus_first_ready_s'])} s "
          f"(cold kcache {seconds(result['cold_kcache_first_ready_s'])} s, TileLang alone "
          f"{seconds(result['plain_tilelang_first_ready_s'])} s); import + all ready: "
          f"{seconds(result['import_plus_all_ready_s'])} s (cold kcache {seconds(result['cold_kcache_all_ready_s'])} s, "
          f"TileLang alone {seconds(result['plain_tilelang_all_ready_s'])} s)")
    outputs = result["outputs_equal"] if result["outputs_compared"] else "not compared (--no-launch)"
    print(f"B: {result['compiles_on_b']} compiles, {result['nvcc_runs_on_b']} nvcc runs; outputs equal to A's: "
          f"{outputs}; kernel sources equal: {result['sources_equal']}")


def main(argv: list[str] | None = None) -> int:
    parser = own_parser("deploy")
    parser.add_argument("--no-launch", action="store_true",
                        help="no GPU here: build and load the kernels, run none (outputs are not compared)")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--dir", help="where to work (default: the temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the roots, bundle and outputs")
    args = parser.parse_args(argv)
    launch = not args.no_launch
    missing = gpu_missing()
    if launch and missing is not None:
        print(f"deploy: {missing}; pass --no-launch to check the flow without running kernels", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="kcache-bench-deploy-", dir=args.dir))
    try:
        keys_file, bundle = work / "keys.jsonl", work / "deploy.kcb"
        machines = {"A": run_machine(work, "A", work / "root-a", launch=launch, env={"KCACHE_RECORD": str(keys_file)})}
        from kcache.bundle.importer import read_key_list

        keys = len(read_key_list(keys_file))
        exported, _ = kcache_cli("--dir", str(work / "root-a"), "export", str(bundle), "--keys", str(keys_file))
        kcache_cli("verify-coverage", "--keys", str(keys_file), str(bundle))
        imported, import_wall_s = kcache_cli("--dir", str(work / "root-b"), "import", str(bundle))
        machines["B"] = run_machine(work, "B", work / "root-b", launch=launch, env={"KCACHE_JIT_GUARD": "error"})
        machines["C"] = run_machine(work, "C", work / "root-c", launch=launch)
        machines["plain"] = run_machine(work, "plain", work / "root-plain", launch=launch, plain=True)
        result = summarize(machines, exported, imported, import_wall_s, keys, launch)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if launch:
        import torch

        device = torch.cuda.get_device_name()
    else:
        device = "no GPU (--no-launch)"
    result["device"] = device
    print_table(result, device)
    if args.keep:
        print(f"kept: {work}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    write_rows(args.rows, bench_rows(result))
    worker_report(result)
    served = (result["compiles_on_b"] == 0 and result["nvcc_runs_on_b"] == 0 and not result["refused_on_b"]
              and result["sources_equal"] and result["outputs_equal"] is not False)
    return 0 if served else 1


if __name__ == "__main__":
    run_own("deploy", main)
