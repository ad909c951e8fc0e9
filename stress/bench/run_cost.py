"""The `run` scenario of `python -m stress.bench`: what `kcache run` adds to a program's start (issue 58).

`python -m kcache run empty.py` against `python empty.py`, in turns, each a fresh interpreter as a user
types it; the p50 of each. The program imports nothing, so `kcache run` must import nothing of TileLang's,
Triton's or Helion's (kcache.cli.launch, kcache.dropin.on_import). The goal: within 0.1 s of plain Python.
A second row, context: the same through the whole command line (`kcache --dir ROOT run`), which loads
kcache's other commands first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..procs import worker_env
from .suite.rows import row
from .suite.timing import percentile, seconds_of, take_turns

REPEATS = 15


def measure(work: Path, env: dict[str, str], repeats: int = REPEATS) -> dict[str, list[float]]:
    folder = work / "run"
    folder.mkdir()
    program = folder / "empty.py"
    program.write_text("")
    commands = {
        "python": [sys.executable, str(program)],
        "kcache run": [sys.executable, "-m", "kcache", "run", str(program)],
        "kcache --dir run": [sys.executable, "-m", "kcache", "--dir", str(folder / "root"), "run", str(program)],
    }
    for command in commands.values():
        seconds_of(command, env, folder)  # the first start reads from disk: not a reading
    return take_turns(list(commands), repeats, lambda name, _turn: seconds_of(commands[name], env, folder))


def rows(options: argparse.Namespace, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    samples = measure(work, worker_env(env))
    plain = percentile(samples["python"], 50)
    return [
        row("run (empty program)", f"kcache run empty.py, p50 of {REPEATS}", percentile(samples["kcache run"], 50),
            plain, "s", "python empty.py"),
        row("run (empty program)", f"  kcache --dir ROOT run empty.py, p50 of {REPEATS}",
            percentile(samples["kcache --dir run"], 50), plain, "s", "python empty.py"),
    ]
