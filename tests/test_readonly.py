"""KCACHE_READONLY=1: hits are served, misses compile privately, nothing under the root changes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import kcache
from stress.programs import synthetic

from .helpers import snapshot


def test_a_readonly_cache_serves_hits_compiles_misses_privately_and_writes_nothing(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = kcache.KernelCache(cache_root, backend=synthetic)
    made = writer.get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
    for entry in (cache_root / "kernels").iterdir():
        os.utime(entry, (0, 0))  # a last use long ago: a writable cache would record this hit
    from kcache.maintenance.counter_file import _flush_all

    _flush_all()  # the writer's pending counts
    before = snapshot(cache_root)

    monkeypatch.setenv("KCACHE_READONLY", "1")
    reader = kcache.KernelCache(cache_root, backend=synthetic)
    assert reader.get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic").library_sha == made.library_sha
    fresh = reader.get_or_compile(synthetic.SyntheticFunc("k1"), "synthetic")
    assert len(fresh.library_sha) == 64
    stats = reader.stats()
    assert (stats["disk_hits"], stats["misses"], stats["compiles"]) == (1, 1, 1)
    reader.get_or_compile(synthetic.SyntheticFunc("k1"), "synthetic")
    assert reader.stats()["memory_hits"] == 1  # the private kernel is kept in memory
    _flush_all()  # what exit would write
    assert snapshot(cache_root) == before


def test_readonly_on_a_missing_root_compiles_everything_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KCACHE_READONLY", "yes")
    cache = kcache.KernelCache(tmp_path / "absent", backend=synthetic)
    cache.get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
    assert cache.stats()["compiles"] == 1 and not (tmp_path / "absent").exists()
    monkeypatch.setenv("KCACHE_READONLY", "maybe")
    with pytest.raises(ValueError, match="KCACHE_READONLY"):
        kcache.KernelCache(tmp_path / "absent", backend=synthetic)


@pytest.mark.tilelang
def test_a_readonly_cache_loads_real_kernels_and_compiles_misses_privately(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tilelang")
    from stress.programs.kernels import CPU_TARGET, elementwise_add

    kcache.KernelCache(cache_root).get_or_compile(elementwise_add(n=1024), CPU_TARGET, out_idx=[2])
    before = snapshot(cache_root)
    monkeypatch.setenv("KCACHE_READONLY", "1")
    reader = kcache.KernelCache(cache_root)
    hit = reader.get_or_compile(elementwise_add(n=1024), CPU_TARGET, out_idx=[2])
    miss = reader.get_or_compile(elementwise_add(n=2048), CPU_TARGET, out_idx=[2])
    assert hit.adapter.libpath.startswith(str(cache_root)) and not miss.adapter.libpath.startswith(str(cache_root))
    assert "add_2048" in miss.get_kernel_source()
    assert (reader.stats()["disk_hits"], reader.stats()["compiles"]) == (1, 1)
    assert snapshot(cache_root) == before
