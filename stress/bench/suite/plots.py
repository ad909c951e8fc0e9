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
    return [r for r in found if (r["date"], r["device"], r["source"]) == (newest["date"], newest["device"], newest["source"])]


def cold(readings: list[Reading], axes: Any) -> list[Reading]:
    run = _newest_run(readings, "cold", r"first compile")
    lanes = sorted({r["metric"].split(": first compile, ")[1].split(" (")[0] for r in run})
    kernels = sorted({r["metric"].split(":")[0] for r in run})
    width = 0.8 / max(1, len(kernels))
    for k, kernel in enumerate(kernels):
        ratios = [next((r["ratio"] for r in run if r["metric"].startswith(f"{kernel}: first compile, {lane} (")), 0)
                  for lane in lanes]
        axes.bar([i + k * width for i in range(len(lanes))], ratios, width, label=kernel)
    axes.set_xticks([i + width * (len(kernels) - 1) / 2 for i in range(len(lanes))], lanes, rotation=12, fontsize=9)
    axes.axhline(1.0, color="gray", linewidth=1, label="TileLang's first compile")
    axes.axhline(1.1, color="tab:red", linestyle="--", linewidth=1, label="goal, service running (1.10x)")
    axes.axhline(1.3, color="tab:orange", linestyle=":", linewidth=1, label="goal, no service yet (1.3x)")
    axes.set_ylim(0, 1.75)  # room above the goals for the legend, which would hide the bars below
    axes.legend(fontsize=9, loc="upper center", ncol=3)
    axes.set_ylabel("kcache / TileLang, first compile (p50)")
    axes.set_title("A fresh process's first compile against TileLang's, per lane (ratio; lower is better)", fontsize=10)
    return run


HERD_SYSTEMS = (("service", "kcache, compile service", "o", "-"),
                ("pools", "kcache, per-process pools", "^", ":"),
                ("tilelang", "TileLang's own cache", "s", "--"))


def _herd_runs(readings: list[Reading]) -> list[dict[str, Any]]:
    """One dict per herd run: its device, date, N ("procs") and the readings of each system."""
    runs: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in readings:
        if r["scenario"] != "herd":
            continue
        run = runs.setdefault((r["date"], r["device"], str(r["source"])), {"device": r["device"], "date": r["date"]})
        procs = re.search(r"compiler runs \((\d+) procs", r["metric"])
        if procs:
            run["procs"] = int(procs.group(1))
        elif re.fullmatch(r"with the service, median of \d+", r["metric"]):
            run["service"] = r
        elif re.fullmatch(r"barrier to all ready(, own pools)?, median of \d+", r["metric"]):
            run["pools"] = r
    for run in runs.values():  # TileLang's herd is the same in both of kcache's rows of a run
        kcache_row = run.get("service") or run.get("pools")
        if kcache_row is not None and kcache_row["baseline"] is not None:
            run["tilelang"] = kcache_row
    return [run for run in runs.values() if "procs" in run]


def herd(readings: list[Reading], axes: Any) -> list[Reading]:
    """Per device (a colour) and system (a marker), the newest run at each N, joined by a line. Most
    devices were measured at one N only: their lines are single points. The devices' points at one N
    are spread a little sideways (by a factor 2^(0.12 k), k a step per device) so as not to hide each other."""
    from matplotlib.lines import Line2D

    runs = _herd_runs(readings)
    devices = sorted({run["device"] for run in runs})
    colours = {device: f"C{i}" for i, device in enumerate(devices)}
    used: list[Reading] = []
    device_handles = []
    for device in devices:  # each point on its N's tick: the devices told apart by colour alone
        dates = set()
        for system, _label, marker, style in HERD_SYSTEMS:
            newest: dict[int, dict[str, Any]] = {}
            for run in runs:
                if run["device"] == device and system in run:
                    # ">=": of two runs with one date (no time), the later line (appended later) wins
                    if run["procs"] not in newest or run["date"] >= newest[run["procs"]]["date"]:
                        newest[run["procs"]] = run
            points = sorted(newest.items())
            if not points:
                continue
            values = [run[system]["baseline" if system == "tilelang" else "kcache"] for _, run in points]
            axes.plot([n for n, _ in points], values, marker=marker, linestyle=style, color=colours[device],
                      markerfacecolor="none" if system == "tilelang" else colours[device])
            used += [run[system] for _, run in points]
            dates |= {run["date"][:10] for _, run in points}
        when = min(dates) if len(dates) == 1 else f"{min(dates)} to {max(dates)[5:]}"  # the year once
        device_handles.append(Line2D([], [], color=colours[device], linewidth=6, label=f"{device}, {when}"))
    system_handles = [Line2D([], [], color="black", marker=marker, linestyle=style, label=label,
                             markerfacecolor="none" if system == "tilelang" else "black")
                      for system, label, marker, style in HERD_SYSTEMS]
    if used:
        # Beside the axes: inside, they hid the CPU's points at N=4. The wider (devices) is the axes' own
        # legend, which savefig's tight box makes room for; the one added as an artist gets none.
        first = axes.legend(handles=system_handles, fontsize=9, loc="lower left", bbox_to_anchor=(1.01, 0.0))
        axes.add_artist(first)
        axes.legend(handles=device_handles, fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                    title="device, its runs' dates", title_fontsize=9)
    ns = sorted({run["procs"] for run in runs})
    axes.set_xscale("log", base=2)
    axes.set_xticks(ns, [str(n) for n in ns])
    axes.set_xticks([], minor=True)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("processes in the herd (N)")
    axes.set_ylabel("barrier to all ready (s, median of the herds)")
    axes.set_title("A cold herd on one kernel: N processes ask for it at once")
    return used


HITS = (("memory", r"^same PrimFunc, p50$", "memory hit"), ("disk", r"^p50 of", "disk hit"),
        ("remote", r"^redis hit on a fresh root", "Redis hit, fresh root"),
        ("remote", r"^s3 hit on a fresh root", "S3 hit, fresh root"))


def hits(readings: list[Reading], axes: Any) -> list[Reading]:
    used, labels, ours, tilelang = [], [], [], []
    for scenario, metric, label in HITS:
        measured = [r for r in readings if r["baseline"] is not None]  # beside a baseline, where one was taken
        run = _newest_run(measured, scenario, metric) or _newest_run(readings, scenario, metric)
        if not run:
            continue
        r = run[0]
        scale = 1e-3 if r["unit"] == "us" else 1.0
        used.append(r)
        labels.append(f"{label}\n{r['device']}, {r['date'][:10]}")
        ours.append(r["kcache"] * scale)
        tilelang.append(r["baseline"] * scale if r["against"] == "tilelang" and r["baseline"] else float("nan"))
    x = range(len(labels))
    axes.bar([i - 0.2 for i in x], ours, 0.4, label="kcache")
    axes.bar([i + 0.2 for i in x], tilelang, 0.4, label="TileLang's own cache (no remote tier)")
    axes.set_xticks(list(x), labels, fontsize=9)
    axes.set_yscale("log")
    axes.legend(fontsize=9, loc="upper left")
    axes.set_ylabel("one hit (ms, p50; log scale)")
    axes.set_title("Hits against TileLang's (each bar's device and date under it)", fontsize=10)
    return used


def tune(readings: list[Reading], axes: Any) -> list[Reading]:
    run = _newest_run(readings, "tune", r"configs")
    labels = [r["metric"] for r in run]
    axes.barh(range(len(run)), [r["kcache"] for r in run], 0.35, label="kcache's tuner")
    axes.barh([i + 0.35 for i in range(len(run))], [r["baseline"] for r in run], 0.35, label="TileLang's AutoTuner")
    axes.set_yticks(list(range(len(run))), labels, fontsize=9)
    if run:  # room on the right for the legend, which would cover the longest bar
        axes.set_xlim(0, 1.4 * max(max(r["kcache"], r["baseline"] or 0) for r in run))
    axes.legend(fontsize=9, loc="lower right")
    axes.set_xlabel("tune of a 16-config matmul (s)")
    axes.set_title("The tune's time against TileLang's AutoTuner (lower is better)", fontsize=10)
    return run


TRITON_PROFILE = r"^profile: kcache's manager, ms over Triton's own"


def triton(readings: list[Reading], axes: Any) -> list[Reading]:
    """What kcache adds to a fresh process's Triton hit, in ms over Triton's own: the bench's p50s (two
    p50s of ~400 ms each, so their difference is noisy) and the profile's median of paired turns (the
    measure the +1 ms goal is read from), one colour per device."""
    bench = sorted((r for r in readings if r["scenario"] == "triton" and r["metric"] == "p50 ms"
                    and r["baseline"] is not None), key=lambda r: r["date"])[-8:]
    profile = sorted((r for r in readings if r["scenario"] == "triton" and re.match(TRITON_PROFILE, r["metric"])),
                     key=lambda r: r["date"])[-4:]
    found = bench + profile
    devices = sorted({r["device"] for r in found})
    colours = {device: f"C{i}" for i, device in enumerate(devices)}
    for i, r in enumerate(found):
        added = r["kcache"] - r["baseline"] if r in bench else r["kcache"]
        axes.bar(i, added, 0.6, color=colours[r["device"]], hatch="//" if r in profile else None,
                 edgecolor="white" if r in profile else None)
    labels = [f"{'profile' if r in profile else 'bench'}\n{r['date'][5:16].replace('T', ' ')}" for r in found]
    axes.set_xticks(list(range(len(found))), labels, fontsize=9)
    axes.axhline(0, color="gray", linewidth=1)
    axes.axhline(1, color="tab:red", linestyle="--", linewidth=1)
    from matplotlib.patches import Patch

    handles = [Patch(color=colours[d], label=d) for d in devices]
    handles += [Patch(facecolor="lightgray", label="bench: difference of the p50s"),
                Patch(facecolor="lightgray", hatch="//", edgecolor="white",
                      label="profile: median of paired turns"),
                axes.plot([], [], color="tab:red", linestyle="--", linewidth=1, label="goal: +1 ms at most")[0]]
    if found:
        axes.legend(handles=handles, fontsize=9, loc="upper right")
    axes.set_ylabel("kcache's hit minus Triton's own (ms)")
    axes.set_title("What kcache's manager adds to a fresh process's Triton hit", fontsize=10)
    return found


TRITON_COMPILES = (("cold compile median s", "cold compile\n(fresh process)", 1.05),
                   ("autotune compile phase median s", "16-config autotune:\ncompile phase", 0.35),
                   ("compile phases together median s", "8 different tunes\nat once", 0.55),
                   ("children median s", "8 forks of a caller\n(Helion's precompile)", None))  # no goal of its own


def triton_compiles(readings: list[Reading], axes: Any) -> list[Reading]:
    """Triton's compiles under kcache (in forks; a tune's configs at once) against plain Triton's (in
    the process; in Helion's precompile, in the same forks): the newest ratio per device, each beside
    its goal, where it has one."""
    used: list[Reading] = []
    devices = sorted({r["device"] for r in readings if r["scenario"] == "triton"
                      and r["metric"] in {metric for metric, _, _ in TRITON_COMPILES}})
    width = 0.8 / max(1, len(devices))
    for slot, (metric, _, goal) in enumerate(TRITON_COMPILES):
        if goal is not None:
            axes.hlines(goal, slot - 0.45, slot + 0.45, colors="tab:red", linestyles="--", linewidth=1,
                        label="goal" if slot == 0 else None)
        for index, device in enumerate(devices):
            found = [r for r in readings if r["scenario"] == "triton" and r["metric"] == metric and r["device"] == device]
            if found:
                newest = max(found, key=lambda r: r["date"])
                used.append(newest)
                axes.bar(slot - 0.4 + width * (index + 0.5), newest["ratio"], width * 0.9, color=f"C{index}",
                         label=device if slot == 0 or not any(u["device"] == device for u in used[:-1]) else None)
    axes.axhline(1, color="gray", linewidth=1)
    axes.set_xticks(range(len(TRITON_COMPILES)), [label for _, label, _ in TRITON_COMPILES], fontsize=9)
    if used:  # above the bars: each slot has one near 1.0x
        axes.set_ylim(0, max(1.3, max(r["ratio"] for r in used) + 0.25))
        axes.legend(fontsize=9, loc="upper center", ncol=3)
    axes.set_ylabel("kcache / plain Triton (lower is better)")
    axes.set_title("Triton's compiles under kcache against plain Triton's", fontsize=10)
    return used


def helion(readings: list[Reading], axes: Any) -> list[Reading]:
    """A Helion autotune's first and second process, alone and under kcache, in seconds until the first
    result, each kernel's newest run; Helion alone's warm second only where measured (from 2026-11-29)."""
    kernels = sorted({r["metric"].split(":")[0] for r in readings if r["scenario"] == "helion"
                      and r["metric"].endswith("first tune, ready")})
    run = [r for kernel in kernels for r in _newest_run(readings, "helion", rf"^{re.escape(kernel)}: (first tune|second process), ready$")]
    labelled: set[str] = set()
    for k, kernel in enumerate(kernels):
        first = next(r for r in run if r["metric"] == f"{kernel}: first tune, ready")
        second = next((r for r in run if r["metric"] == f"{kernel}: second process, ready"), None)
        warm_alone = second["baseline"] if second and str(second.get("against")).startswith("Helion alone") else None
        bars = ((first["baseline"], "Helion alone, first process"), (first["kcache"], "kcache, first process"),
                (warm_alone, "Helion alone on its warm cache, second process"),
                (second["kcache"] if second else None, "kcache, second process"))
        for slot, (seconds, label) in ((s, b) for s, b in enumerate(bars) if b[0] is not None):
            x = k + (slot - 1.5) * 0.21  # each label once, on its first bar; a second's seconds written over it
            axes.bar(x, seconds, 0.2, color=f"C{slot}", label=None if label in labelled else label)
            labelled.add(label)
            axes.text(x, seconds, f"{seconds:.1f}" if slot >= 2 else "", ha="center", va="bottom", fontsize=9)
    axes.set_xticks(range(len(kernels)), kernels)
    if run:  # room above the bars for the legend
        axes.set_ylim(0, 1.35 * max(max(r["kcache"], r["baseline"] or 0) for r in run))
        axes.legend(fontsize=9, loc="upper center", ncol=2)
    axes.set_ylabel("seconds until the first result (median)")
    axes.set_title("A Helion autotune (8 configs) alone and under kcache", fontsize=10)
    return run


PLOTS: dict[str, Callable[[list[Reading], Any], list[Reading]]] = {
    "cold.png": cold, "herd.png": herd, "hits.png": hits, "tune.png": tune, "triton.png": triton,
    "triton-compiles.png": triton_compiles, "helion.png": helion}


def draw(results: Path, out: Path) -> list[Path]:
    """Every plot of PLOTS from the dataset at `results`, written into `out`; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    readings = load(results)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, plot in PLOTS.items():
        figure, axes = plt.subplots(figsize=(9.5 if name == "herd.png" else 7.5, 4.2))  # herd: legends beside
        used = plot(readings, axes)  # each plot places its own legend, where it hides no reading
        if used:
            figure.text(0.99, 0.01, _where(used), ha="right", va="bottom", fontsize=9, color="dimgray")
        else:
            axes.text(0.5, 0.5, f"no readings in {results.name}", ha="center", va="center", transform=axes.transAxes)
        figure.tight_layout(rect=(0, 0.03, 1, 1))
        figure.savefig(out / name, dpi=100, bbox_inches="tight")  # "tight": the legends beside the axes too
        plt.close(figure)
        written.append(out / name)
    return written
