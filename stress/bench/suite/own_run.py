"""What the scenarios with runs of their own (stress/bench/standalone/) share: a command line with
`--rows FILE`, where a run writes its readings as the bench's rows (which `python -m stress.bench --record`
appends to the dataset), the one line that says a run is skipped here, its readings printed, and its
entry point."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from .rows import format_value

PACKAGE = "stress.bench.standalone"


def own_parser(module: str, description: str | None = None) -> argparse.ArgumentParser:
    """The command line of `python -m stress.bench.standalone.MODULE`, its `--rows FILE` already there."""
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.{module}", description=description)
    parser.add_argument("--rows", type=Path, help="write the readings here as the bench's rows (JSON), "
                        "which `python -m stress.bench --record` appends to the dataset")
    return parser


def write_rows(path: Path | None, rows: list[dict[str, Any]]) -> None:
    if path is not None:
        path.write_text(json.dumps(rows, indent=1))


def skipped(name: str, reason: str | None) -> bool:
    """Whether `reason` keeps the run from this machine, said in one line: `NAME: skipped: REASON`. A
    skipped run measures nothing and exits 0."""
    if reason:
        print(f"{name}: skipped: {reason}", flush=True)
    return bool(reason)


def print_readings(rows: list[dict[str, Any]], width: int) -> None:
    """A run's rows under its heading: metric, value, unit, the baseline's value, the ratio."""
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}x"
        print(f"  {r['metric']:{width}} {r['kcache']:>9.4g} {r['unit']:5} vs {format_value(r['tilelang']):>8}  {ratio}")


def run_own(module: str, main: Callable[[], int]) -> NoReturn:
    """`python -m stress.bench.standalone.MODULE`: `main` in a command scope of its own (stress.command_scope:
    whatever it started is stopped however it ends), its exit status the process's."""
    from stress.command_scope import run_command

    sys.exit(run_command(f"python -m {PACKAGE}.{module}", main))
