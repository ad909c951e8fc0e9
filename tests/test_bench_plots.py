"""The benchmark dataset and its plots, on the CPU: `python -m stress.bench --plots` draws every plot from
a small dataset written here, and a recorded reading carries its goal, device and date."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from stress.bench.suite.dataset import FIELDS, load, record
from stress.bench.suite.plots import PLOTS

PROJECT = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def bench_row(scenario: str, metric: str, kcache: float, tilelang: float | None, unit: str,
              baseline: str = "tilelang") -> dict:
    return {"scenario": scenario, "metric": metric, "kcache": kcache, "tilelang": tilelang,
            "ratio": kcache / tilelang if tilelang else None, "unit": unit, "baseline": baseline}


ROWS = [
    bench_row("cold (fresh process)", "add: first compile, server, running (p50 of 3)", 1.9, 2.4, "s"),
    bench_row("cold (fresh process)", "add: first compile, server, cold (p50 of 3)", 2.1, 2.4, "s"),
    bench_row("herd", "compiler runs (32 procs, max of 3), own pools", 1, 32, "runs"),
    bench_row("herd", "  with the service, median of 3", 1.9, 4.6, "s"),
    bench_row("memory hit", "same PrimFunc, p50", 5.0, 460.0, "us"),
    bench_row("disk hit (fresh process)", "p50 of 10", 2.7, 5.5, "ms"),
    bench_row("triton hit (fresh process)", "p50 ms", 438.0, 429.2, "ms", "triton FileCacheManager"),
    bench_row("helion", "matmul: first tune, ready", 21.7, 22.8, "s", "Helion alone (fork)"),
    bench_row("helion", "matmul: second process, ready", 1.7, 21.7, "s", "the first process under kcache"),
]


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, f"{path.name} is not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_a_recorded_reading_carries_its_goal_and_where_it_was_taken(tmp_path: Path) -> None:
    dataset = tmp_path / "results.jsonl"
    record(ROWS[:2], dataset)
    record(ROWS[5:6], dataset)
    readings = load(dataset)
    assert [r["scenario"] for r in readings] == ["cold", "cold", "disk"]
    assert all(list(r) == list(FIELDS) for r in readings)
    running, _, disk = readings
    assert running["goal"] == "<= 1.10x TileLang's" and running["met"] is True
    assert disk["goal"] == "<= 0.5x TileLang's" and disk["met"] is True  # 2.7 / 5.5 = 0.49
    assert running["device"] == "CPU" and running["cores"] >= 1 and running["date"].endswith("Z")
    assert disk["ratio"] == pytest.approx(2.7 / 5.5)


def test_plots_are_drawn_from_a_small_dataset(tmp_path: Path) -> None:
    dataset, out = tmp_path / "results.jsonl", tmp_path / "img"
    record(ROWS, dataset)
    dataset.write_text(dataset.read_text() + json.dumps({**load(dataset)[0], "device": "NVIDIA H100"}) + "\n")
    # A newer run of Helion alone against itself (--against-itself): the Helion plot keeps the kcache run.
    helion = next(r for r in load(dataset) if r["scenario"] == "helion")
    floor = {**helion, "metric": "matmul: Helion alone against itself, ready", "date": "2099-01-01T00:00:00Z"}
    dataset.write_text(dataset.read_text() + json.dumps(floor) + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "stress.bench", "--plots", "--results", str(dataset), "--out", str(out)],
                          capture_output=True, text=True, cwd=PROJECT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(path.name for path in out.iterdir()) == sorted(PLOTS)
    for name in PLOTS:
        width, height = png_size(out / name)
        assert width > 100 and height > 100


def test_the_committed_dataset_is_one_reading_a_line_with_every_field() -> None:
    readings = load()
    assert readings, "benchmarks/results.jsonl is empty"
    assert all(set(FIELDS) <= set(r) for r in readings)
    assert all(r["ratio"] is None or r["baseline"] for r in readings)
