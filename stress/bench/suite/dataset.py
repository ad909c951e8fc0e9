"""The benchmark dataset, benchmarks/results.jsonl: one JSON object a line, one line per reading.

A reading is a row of the bench (scenario, metric, kcache's value, the baseline's, the ratio) with what
judges it (the goal, met) and where and when it was taken (device, cores, date, commit). The bench's
`--record` appends its run's readings; nothing rewrites old lines. Docs and plots read it."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stress.procs import PROJECT

from .goals import judge
from .scenarios import scenario_of

DATASET = PROJECT / "benchmarks" / "results.jsonl"
FIELDS = ("scenario", "metric", "kcache", "baseline", "ratio", "unit", "against", "goal", "met", "device", "cores",
          "date", "commit", "label", "source")


def reading(row: dict[str, Any], *, device: str, cores: int | None, date: str, commit: str | None,
            source: str | None = None) -> dict[str, Any]:
    """The dataset's line for a bench row ({"scenario", "metric", "kcache", "tilelang", "ratio", "unit",
    "baseline"}: "tilelang" holds the baseline's value, "baseline" names it)."""
    scenario = scenario_of(row["scenario"])
    baseline = row.get("tilelang")
    found = {"scenario": scenario, "metric": row["metric"].strip(), "kcache": row["kcache"], "baseline": baseline,
             "ratio": row.get("ratio") if baseline else None, "unit": row["unit"],
             "against": row.get("baseline") or ("tilelang" if baseline is not None else None)}
    goal, met = judge(scenario, found)
    found.update(goal=goal, met=met, device=device, cores=cores, date=date, commit=commit, label=row["scenario"],
                 source=source)
    return {field: found[field] for field in FIELDS}


def this_machine() -> tuple[str, int | None]:
    """(device, cores): "NVIDIA H100", "2x NVIDIA H200" or "CPU", and the cores this process may use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        name = torch.cuda.get_device_name(0) if gpus else ""
    except ImportError:
        gpus, name = 0, ""
    if not gpus:
        return "CPU", cores
    model = re.match(r"NVIDIA \w+", name)
    name = model.group(0) if model else name
    return (f"{gpus}x {name}" if gpus > 1 else name), cores


def this_commit() -> str | None:
    """The checkout's commit, with "+dirty" where its tracked files differ from it; None outside git.
    KCACHE_BENCH_COMMIT names it instead, where the tree was copied from a checkout (a GPU machine's
    copy carries no history of its own)."""
    if os.environ.get("KCACHE_BENCH_COMMIT"):
        return os.environ["KCACHE_BENCH_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              cwd=PROJECT, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=PROJECT, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def record(rows: Iterable[dict[str, Any]], path: Path = DATASET) -> list[dict[str, Any]]:
    """Append the run's rows, as readings of this machine now, to the dataset at `path`."""
    device, cores = this_machine()
    date, commit = now(), this_commit()
    readings = [reading(row, device=device, cores=cores, date=date, commit=commit) for row in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.writelines(json.dumps(r) + "\n" for r in readings)
    return readings


def load(path: Path = DATASET) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def newest(readings: Iterable[dict[str, Any]], scenario: str, metric: str,
           device: str | None = None) -> dict[str, Any] | None:
    """The newest reading of `scenario` whose metric matches the regular expression `metric`."""
    found = [r for r in readings if r["scenario"] == scenario and re.search(metric, r["metric"])
             and (device is None or r["device"] == device)]
    return max(found, key=lambda r: r["date"], default=None)
