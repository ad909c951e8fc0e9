"""`kcache stats`: what a root holds and how its lookups went, per compiler and in total, as `ccache -s`
does; `kcache stats --zero` zeroes the counters, as `ccache -z` does.

A lookup is a hit when it was served without compiling (from memory, the disk or a remote tier, a wait
for another process's compile included), else a miss; the hit rate is hits / (hits + misses). A
compile is one compiler run that produced the kernel (Helion: one tune's pick saved).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kcache.cli.entries import is_triton_crash
from kcache.cli.format import count_of, format_table, human_age, human_size, human_time
from kcache.config import Settings
from kcache.maintenance.counter_file import LOOKUP_COUNTERS, OTHER_COMPILERS
from kcache.maintenance.eviction import recorded_size, scan_entries
from kcache.maintenance.stats import COUNTERS, read_persisted, zero_counters
from kcache.store import layout
from kcache.store.components import KERNELS

# Up to this many entries `kcache stats` measures the size itself: a stat of every file, about 0.2 s at
# the rate docs/benchmarks.md measured (10,000 entries: 1.1 s), which keeps stats within its 0.5 s
# goal. Above, it shows what the last gc or prune measured, and when.
LIVE_SIZE_MAX_ENTRIES = 2000
COMPILER_NAMES = {"tilelang": "TileLang", "triton": "Triton", "helion": "Helion"}
TILELANG_HITS = ("memory_hits", "disk_hits", "remote_hits")


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    stats = command("stats", "hits, misses and compiles of every process, per compiler (TileLang, Triton, "
                    "Helion) and in total; the entries and their size")
    stats.add_argument("--zero", action="store_true",
                       help="zero the counters (as ccache -z); the entries stay")


@dataclass
class MeasuredSize:
    size_bytes: int | None  # None: never measured
    measured_at: float | None  # epoch seconds
    live: bool  # measured by this command, not read from the last gc's record
    entries: int | None  # the entries it counted


def measure_size(root: Path, entries: int) -> MeasuredSize:
    if entries <= LIVE_SIZE_MAX_ENTRIES:
        found = scan_entries(root) + scan_entries(root, layout.TRITON)
        return MeasuredSize(sum(e.size for e in found), time.time(), True, len(found))
    record = recorded_size(root) or {}
    size, at, counted = record.get("bytes"), record.get("measured"), record.get("entries")
    if not isinstance(size, int) or not isinstance(at, (int, float)):
        return MeasuredSize(None, None, False, None)
    return MeasuredSize(size, at, False, counted if isinstance(counted, int) else None)


def lookups(counters: dict[str, float]) -> dict[str, dict[str, Any]]:
    """{compiler: {hits, misses, compiles, hit_rate}} and "total": hit_rate is None before a lookup."""
    per: dict[str, dict[str, Any]] = {"tilelang": {"hits": sum(counters[name] for name in TILELANG_HITS), "misses": counters["misses"],
                        "compiles": counters["compiles"]}}
    for compiler in OTHER_COMPILERS:
        per[compiler] = {name: counters.get(f"{compiler}_{name}", 0) for name in LOOKUP_COUNTERS}
    per["total"] = {name: sum(per[compiler][name] for compiler in list(per)) for name in LOOKUP_COUNTERS}
    for counts in per.values():
        looked_up = counts["hits"] + counts["misses"]
        counts["hit_rate"] = counts["hits"] / looked_up if looked_up else None
    return per


def cmd_stats(args: argparse.Namespace, settings: Settings) -> tuple[Any, str, int]:
    if getattr(args, "zero", False):
        zeroed = settings.root.is_dir() and zero_counters(settings.root)
        return ({"root": str(settings.root), "zeroed": zeroed},
                f"zeroed the counters of {settings.root}" if zeroed else f"no counters to zero in {settings.root}", 0)
    counters = read_persisted(settings.root)
    entries, triton_entries = (_count_keys(settings.root / namespace) for namespace in (KERNELS, layout.TRITON))
    size = measure_size(settings.root, entries + triton_entries)
    crashes = _count_triton_crashes(settings.root) if triton_entries else 0
    helion = _count_keys(settings.root / layout.HELION)
    per_compiler = lookups(counters)
    result = {"root": str(settings.root), "entries": entries, "triton_entries": triton_entries, "helion_picks": helion,
              "triton_crashes_remembered": crashes,
              "size_bytes": size.size_bytes,
              "size_measured_at": size.measured_at, "size_is_live": size.live,
              "max_size_bytes": settings.max_size_bytes, **counters,
              "hit_rate": per_compiler["total"]["hit_rate"], "lookups": per_compiler}
    limit = human_size(settings.max_size_bytes) if settings.max_size_bytes else "no limit"
    tritons = f" (and {triton_entries} of Triton's" + (f", {crashes} of them crashes remembered" if crashes else "") + ")"
    rows = [("root", str(settings.root)), ("entries", str(entries) + (tritons if triton_entries else "")
                                          + (f" (and {count_of(helion, 'Helion pick', 'Helion picks')})" if helion else "")),
            ("size", _size_text(size, limit, entries + triton_entries)),
            ("hit rate", _rate(per_compiler["total"]["hit_rate"]))]
    table = [(COMPILER_NAMES.get(name, name), *(_number(counts[c]) for c in LOOKUP_COUNTERS), _rate(counts["hit_rate"]))
             for name, counts in per_compiler.items()]
    details = [(name.replace("_", " "), _number(counters[name])) for name in COUNTERS]
    text = "\n".join([format_table(["", ""], rows, show_header=False), "",
                      format_table(["lookups", "hits", "misses", "compiles", "hit rate"], table), "",
                      "TileLang's details:", format_table(["", ""], [(f"  {n}", v) for n, v in details], show_header=False)])
    return result, text, 0


def _rate(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.1%}"


def _number(value: float) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _count_triton_crashes(root: Path) -> int:
    """Triton compiles remembered as crashed (kcache.triton.crashes): `kcache clear` forgets them."""
    directory = root / layout.TRITON
    try:
        return sum(1 for name in os.listdir(directory) if layout.is_key(name) and is_triton_crash(directory / name))
    except FileNotFoundError:
        return 0


def _count_keys(directory: Path) -> int:
    try:
        return sum(1 for name in os.listdir(directory) if layout.is_key(name))
    except FileNotFoundError:
        return 0


def _size_text(size: MeasuredSize, limit: str, entries: int) -> str:
    if size.live:
        return f"{human_size(size.size_bytes)} of {limit} (measured now)"
    too_many = f"{entries} entries are too many to measure at each `kcache stats`"
    if size.measured_at is None:
        return f"not measured yet ({too_many}; `kcache gc` measures it)"
    counted = f" of {count_of(size.entries, 'entry', 'entries')}" if size.entries is not None else ""
    return (f"{human_size(size.size_bytes)}{counted} of {limit}, as of {human_time(size.measured_at)} "
            f"({human_age(time.time() - size.measured_at)} ago, by the last gc or prune; {too_many}: "
            "`kcache gc` measures again)")
