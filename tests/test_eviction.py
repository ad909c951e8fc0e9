"""LRU eviction, last-use records and persisted stats, under several processes (synthetic compiler)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import kcache
from kcache.maintenance.eviction import evict, scan_entries
from kcache.maintenance.stats import COUNTERS, read_persisted
from kcache.store.last_use import LAST_USE_RESOLUTION_S, note_use
from kcache.store.manifest import verify_entry
from stress.programs import synthetic

from .helpers import spawn

POPULATE = """
import json, sys, kcache
from stress.programs import synthetic
cache = kcache.KernelCache({root!r}, backend=synthetic)
for name in {names!r}:
    cache.get_or_compile(synthetic.SyntheticFunc(name), "synthetic")
print(json.dumps(cache.stats()))
"""


def populate(root: Path, names: list[str]) -> kcache.KernelCache:
    cache = kcache.KernelCache(root, backend=synthetic)
    for name in names:
        cache.get_or_compile(synthetic.SyntheticFunc(name), "synthetic")
    return cache


def key_of(root: Path, name: str) -> str:
    (key,) = [e.key for e in scan_entries(root) if json.loads((e.path / "meta.json").read_text())["kernel"] == name]
    return key


def test_prune_keeps_the_most_recently_used_entries(cache_root: Path) -> None:
    names = [f"k{i}" for i in range(5)]
    populate(cache_root, names)
    now = time.time()
    for age_rank, name in enumerate(["k3", "k0", "k4", "k1", "k2"]):  # k3 used last, k2 first
        entry = cache_root / "kernels" / key_of(cache_root, name)
        os.utime(entry, (now - 100 * age_rank, now - 100 * age_rank))
    sizes = {json.loads((e.path / "meta.json").read_text())["kernel"]: e.size for e in scan_entries(cache_root)}
    report = evict(cache_root, max_size=sizes["k3"] + sizes["k0"], max_age_s=None)  # sizes differ by a byte or two
    assert (report.evicted, report.remaining) == (3, 2)
    kept = {json.loads((e.path / "meta.json").read_text())["kernel"] for e in scan_entries(cache_root)}
    assert kept == {"k3", "k0"}
    assert os.listdir(cache_root / ".trash") == []

    report = evict(cache_root, max_size=None, max_age_s=50)  # k0 was last used 100 s ago
    assert report.evicted == 1 and [e.key for e in scan_entries(cache_root)] == [key_of(cache_root, "k3")]


def test_last_use_is_written_at_most_once_an_hour(cache_root: Path) -> None:
    populate(cache_root, ["k0"])
    (entry,) = scan_entries(cache_root)
    recent = time.time() - 600
    os.utime(entry.path, (recent, recent))
    note_use(entry.path)
    assert os.stat(entry.path).st_mtime == recent  # used ten minutes ago: no write
    stale = time.time() - LAST_USE_RESOLUTION_S - 5
    os.utime(entry.path, (stale, stale))
    fresh_cache = kcache.KernelCache(cache_root, backend=synthetic)
    fresh_cache.get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")  # a disk hit records the use
    assert fresh_cache.stats()["disk_hits"] == 1
    assert time.time() - os.stat(entry.path).st_mtime < 60


def test_eviction_racing_loaders_in_several_processes_never_breaks_a_load(cache_root: Path) -> None:
    names = [f"k{i}" for i in range(8)]
    populate(cache_root, names)
    entry_size = scan_entries(cache_root)[0].size
    loader = """
import json, random, kcache
from stress.programs import synthetic
errors, compiles = [], 0
for i in range(400):
    cache = kcache.KernelCache({root!r}, backend=synthetic)  # a fresh object: no memory tier, every get reads disk
    name = random.choice({names!r})
    try:
        kernel = cache.get_or_compile(synthetic.SyntheticFunc(name), "synthetic")
        assert kernel.name == name and len(kernel.library_sha) == 64
    except Exception as err:
        errors.append(repr(err))
    compiles += cache.stats()["compiles"]
print(json.dumps({{"errors": errors, "compiles": compiles}}))
"""
    evictor = """
import json
from pathlib import Path
from kcache.maintenance.eviction import evict
evicted = sum(evict(Path({root!r}), max_size={limit}, max_age_s=None).evicted for _ in range(300))
print(json.dumps({{"evicted": evicted}}))
"""
    loaders = [spawn(loader.format(root=str(cache_root), names=names)) for _ in range(3)]
    pruner = spawn(evictor.format(root=str(cache_root), limit=3 * entry_size))
    outcomes = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in loaders]
    evicted = json.loads(pruner.communicate()[0].strip().splitlines()[-1])["evicted"]

    assert [o["errors"] for o in outcomes] == [[], [], []]
    assert evicted > 0 and sum(o["compiles"] for o in outcomes) > 0  # they really raced: evicted entries recompiled
    from stress.programs.synthetic import COMPONENTS

    for entry in scan_entries(cache_root):
        verify_entry(entry.path, COMPONENTS)


def test_stats_persist_and_sum_over_processes(cache_root: Path) -> None:
    runs = [["a", "b", "a"], ["a", "c"], ["d", "d", "d", "b"]]
    children = [spawn(POPULATE.format(root=str(cache_root), names=names)) for names in runs]
    per_process = [json.loads(c.communicate()[0].strip().splitlines()[-1]) for c in children]
    assert all(c.returncode == 0 for c in children)

    persisted = read_persisted(cache_root)
    for counter in COUNTERS:
        assert persisted[counter] == pytest.approx(sum(p[counter] for p in per_process)), counter
    assert persisted["compiles"] == 4 and persisted["memory_hits"] >= 3  # 4 distinct kernels, 3 repeats in-process

    # gc folds the dead processes' files into one total, and the sum does not change.
    kcache.KernelCache(cache_root, backend=synthetic).gc()
    assert {n for n in os.listdir(cache_root / ".stats") if not n.startswith(".")} == {"total.json", "size.json"}
    assert read_persisted(cache_root)["compiles"] == persisted["compiles"]
