"""What the scenarios of `python -m stress.bench` share: a herd of workers behind a barrier, the timing
of their operations, and a row of the bench's table (which an own run writes to `--rows FILE`, for the
bench to record)."""

from __future__ import annotations

import argparse
import compileall
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from stress.procs import PROJECT, Barrier

BACKENDS = ("kcache", "tilelang")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def row(scenario: str, metric: str, kc: float, tl: float | None, unit: str,
        baseline: str = "tilelang") -> dict[str, Any]:
    return {"scenario": scenario, "metric": metric, "kcache": kc, "tilelang": tl,
            "ratio": (kc / tl) if tl else None, "unit": unit, "baseline": baseline}


def rows_option(parser: argparse.ArgumentParser) -> None:
    """An own run's `--rows FILE`: where it writes its readings as the bench's rows, for `--record`."""
    parser.add_argument("--rows", type=Path, help="write the readings here as the bench's rows (JSON), "
                        "which `python -m stress.bench --record` appends to the dataset")


def write_rows(path: Path | None, rows: list[dict[str, Any]]) -> None:
    if path is not None:
        path.write_text(json.dumps(rows, indent=1))


def print_result(value: Any) -> None:
    """What a scenario's fresh process reports to the bench: one `result JSON` line (`child_result`)."""
    print("result " + json.dumps(value), flush=True)


def child_result(command: list[str], what: str, **run: Any) -> Any:
    """Run one fresh process of a scenario (`subprocess.run`'s `run` arguments) and read its last
    `result` line; a failure, or no such line, raises naming `what`, with the end of its output."""
    done = subprocess.run(command, capture_output=True, text=True, **run)
    lines = [line for line in done.stdout.splitlines() if line.startswith("result ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{what} failed (exit status {done.returncode}): {done.stderr[-2000:]}\n"
                           f"its output: {done.stdout[-2000:]}")
    return json.loads(lines[-1][len("result "):])


def format_value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def run_workers(backend: str, root: Path, procs: int, kernels: int, env: dict[str, str],
                extra_args: tuple[str, ...] = ()) -> tuple[float, list[Any]]:
    barrier = Barrier("stress.worker", procs,
                      ["--root", str(root), "--kernels", str(kernels), "--backend", backend, *extra_args], env=env)
    barrier.wait_ready()
    release = barrier.release()
    results = barrier.collect()
    for r in results:
        if r.result is None or r.result["errors"]:
            raise RuntimeError(f"{backend} worker {r.index} failed: {r.result and r.result['errors']} {r.stderr[-2000:]}")
    wall = max(op["end"] for r in results for op in r.result["ops"]) - release
    return wall, results


def get_seconds(results: list[Any]) -> list[float]:
    return [op["end"] - op["start"] for r in results for op in r.result["ops"]]


def bytecode_as_installed() -> dict[str, str]:
    """Both caches' modules load from bytecode, as after a pip install: kcache's compiled now, and the
    children may write theirs. The environment for the children."""
    compileall.compile_dir(str(PROJECT / "kcache"), quiet=1)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return {"PYTHONDONTWRITEBYTECODE": ""}
