"""`python -m stress.bench --plots`: the dataset's plots, PNGs drawn with matplotlib (Agg) into docs/img/.

Each plot reads the newest readings of its scenario and names the devices and dates they were taken on;
a plot with no reading in the dataset says so instead of failing, so that the command runs on any slice
of the dataset (tests/test_bench_plots.py draws them from a small one)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .dataset import load

Reading = dict[str, Any]


def _where(readings: list[Reading]) -> str:
    """The devices and dates of `readings`, for a plot's title."""
    devices = sorted({r["device"] for r in readings})
    dates = sorted({r["date"][:10] for r in readings})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return f"{', '.join(devices)}; {when}"


def _newest_run(readings: list[Reading], scenario: str, metric: str) -> list[Reading]:
    """The readings of `scenario` matching `metric` from its newest run (one date and device)."""
    found = [r for r in readings if r["scenario"] == scenario and re.search(metric, r["metric"])]
    if not found:
        return []
    newest = max(found, key=lambda r: r["date"])
    return [r for r in found if r["date"] == newest["date"] and r["device"] == newest["device"]
            and r["source"] == newest["source"]]


def _newest(readings: list[Reading], scenario: str, metric: str) -> Reading | None:
    run = _newest_run(readings, scenario, metric)
    return run[0] if run else None


def cold(readings: list[Reading], axes: Any) -> list[Reading]:
    run = _newest_run(readings, "cold", r"first compile")
    lanes = sorted({r["metric"].split(": first compile, ")[1].split(" (")[0] for r in run})
    kernels = sorted({r["metric"].split(":")[0] for r in run})
    width = 0.8 / max(1, len(kernels))
    for k, kernel in enumerate(kernels):
        ratios = [next((r["ratio"] for r in run if r["metric"].startswith(f"{kernel}: first compile, {lane} (")), 0)
                  for lane in lanes]
        axes.bar([i + k * width for i in range(len(lanes))], ratios, width, label=kernel)
    axes.set_xticks([i + width * (len(kernels) - 1) / 2 for i in range(len(lanes))], lanes, rotation=12, fontsize=8)
    axes.axhline(1.0, color="gray", linewidth=1, label="TileLang's first compile")
    axes.axhline(1.1, color="tab:red", linestyle="--", linewidth=1, label="goal, service running (1.10x)")
    axes.axhline(1.3, color="tab:orange", linestyle=":", linewidth=1, label="goal, no service yet (1.3x)")
    axes.set_ylabel("kcache / TileLang, first compile (p50)")
    axes.set_title("Cold compile against TileLang, per lane")
    return run


def herd(readings: list[Reading], axes: Any) -> list[Reading]:
    runs: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in readings:
        if r["scenario"] != "herd":
            continue
        run = runs.setdefault((r["date"], r["device"], str(r["source"])), {})
        procs = re.search(r"compiler runs \((\d+) procs", r["metric"])
        if procs:
            run["procs"] = int(procs.group(1))
        elif re.fullmatch(r"with the service, median of \d+", r["metric"]):
            run["service"] = r
        elif re.fullmatch(r"barrier to all ready(, own pools)?, median of \d+", r["metric"]):
            run["pools"] = r
    used = []
    for name, variant in (("kcache, compile service", "service"), ("kcache, per-process pools", "pools")):
        points = [(run["procs"], run[variant]) for run in runs.values() if "procs" in run and variant in run]
        axes.plot([p for p, _ in points], [r["kcache"] for _, r in points], "o", label=name, alpha=0.6)
        used += [r for _, r in points]
    baseline = [(run["procs"], run.get("service", run.get("pools"))) for run in runs.values() if "procs" in run]
    baseline = [(p, r) for p, r in baseline if r is not None and r["baseline"] is not None]
    axes.plot([p for p, _ in baseline], [r["baseline"] for _, r in baseline], "x", color="black",
              label="TileLang's own cache")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("processes in the herd")
    axes.set_ylabel("barrier to all ready (s, median of 3)")
    axes.set_title("A cold herd on one kernel against N processes")
    return used


HITS = (("memory", r"^same PrimFunc, p50$", "memory hit"), ("disk", r"^p50 of", "disk hit"),
        ("remote", r"^redis hit on a fresh root", "Redis hit, fresh root"),
        ("remote", r"^s3 hit on a fresh root", "S3 hit, fresh root"))


def hits(readings: list[Reading], axes: Any) -> list[Reading]:
    used, labels, ours, tilelang = [], [], [], []
    for scenario, metric, label in HITS:
        measured = [r for r in readings if r["baseline"] is not None]  # beside a baseline, where one was taken
        r = _newest(measured, scenario, metric) or _newest(readings, scenario, metric)
        if r is None:
            continue
        scale = 1e-3 if r["unit"] == "us" else 1.0
        used.append(r)
        labels.append(f"{label}\n{r['device']}, {r['date'][:10]}")
        ours.append(r["kcache"] * scale)
        tilelang.append(r["baseline"] * scale if r["against"] == "tilelang" and r["baseline"] else float("nan"))
    x = range(len(labels))
    axes.bar([i - 0.2 for i in x], ours, 0.4, label="kcache")
    axes.bar([i + 0.2 for i in x], tilelang, 0.4, label="TileLang's own cache (no remote tier)")
    axes.set_xticks(list(x), labels, fontsize=7)
    axes.set_yscale("log")
    axes.set_ylabel("one hit (ms, p50; log scale)")
    axes.set_title("Hits: memory, disk, remote, against TileLang's")
    return used


def tune(readings: list[Reading], axes: Any) -> list[Reading]:
    run = _newest_run(readings, "tune", r"configs")
    labels = [r["metric"] for r in run]
    axes.barh(range(len(run)), [r["kcache"] for r in run], 0.35, label="kcache's tuner")
    axes.barh([i + 0.35 for i in range(len(run))], [r["baseline"] for r in run], 0.35, label="TileLang's AutoTuner")
    axes.set_yticks(list(range(len(run))), labels, fontsize=7)
    axes.set_xlabel("tune of a 16-config matmul (s)")
    axes.set_title("The tune's time")
    return run


def triton(readings: list[Reading], axes: Any) -> list[Reading]:
    found = sorted((r for r in readings if r["scenario"] == "triton" and re.fullmatch(r"p50 ms", r["metric"])),
                   key=lambda r: r["date"])[-8:]
    labels = [f"{r['device']}\n{r['date'][5:16].replace('T', ' ')}" for r in found]
    x = range(len(found))
    axes.bar([i - 0.2 for i in x], [r["kcache"] for r in found], 0.4, label="kcache's cache manager")
    axes.bar([i + 0.2 for i in x], [r["baseline"] for r in found], 0.4, label="Triton's FileCacheManager")
    axes.set_xticks(list(x), labels, fontsize=6)
    axes.set_ylabel("a fresh process's hit (ms, p50)")
    axes.set_title("Triton's hit, against plain Triton (goal: +1 ms at most)")
    return found


PLOTS: dict[str, Callable[[list[Reading], Any], list[Reading]]] = {
    "cold.png": cold, "herd.png": herd, "hits.png": hits, "tune.png": tune, "triton.png": triton}


def draw(results: Path, out: Path) -> list[Path]:
    """Every plot of PLOTS from the dataset at `results`, written into `out`; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    readings = load(results)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, plot in PLOTS.items():
        figure, axes = plt.subplots(figsize=(7.5, 4.2))
        used = plot(readings, axes)
        if used:
            axes.legend(fontsize=7)
            figure.text(0.99, 0.01, _where(used), ha="right", va="bottom", fontsize=7, color="dimgray")
        else:
            axes.text(0.5, 0.5, f"no readings in {results.name}", ha="center", va="center", transform=axes.transAxes)
        figure.tight_layout(rect=(0, 0.03, 1, 1))
        figure.savefig(out / name, dpi=100)
        plt.close(figure)
        written.append(out / name)
    return written
