"""On a GPU: kernels from kcache (compiled, from disk in a fresh process) run and match torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")

import kcache  # noqa: E402
from stress.gpu import gpu_target  # noqa: E402
from stress.programs.kernels import POOL, elementwise_add  # noqa: E402

from .faults import needs_root, tmpfs  # noqa: E402
from .helpers import spawn  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible; run these on the GPU machine"),
]


def assert_matches(spec, kernel) -> None:
    inputs = spec.make_inputs("cuda")
    out = kernel(*inputs)
    expected = spec.reference(*inputs)
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), expected.float(), rtol=spec.tolerance, atol=spec.tolerance)


@pytest.mark.parametrize("spec", POOL, ids=[s.name for s in POOL])
def test_compiled_and_disk_loaded_kernels_match_torch(spec, cache_root: Path) -> None:
    compiled = kcache.KernelCache(cache_root).get_or_compile(spec.build(), gpu_target(), out_idx=spec.out_idx)
    assert_matches(spec, compiled)
    fresh = kcache.KernelCache(cache_root)
    loaded = fresh.get_or_compile(spec.build(), gpu_target(), out_idx=spec.out_idx)
    assert fresh.stats()["disk_hits"] == 1 and fresh.stats()["compiles"] == 0
    assert_matches(spec, loaded)


def test_target_none_means_the_gpu_present(cache_root: Path) -> None:
    cache = kcache.KernelCache(cache_root)
    kernel = cache.get_or_compile(elementwise_add(), None, out_idx=[2])
    assert_matches(POOL[0], kernel)
    (entry,) = (cache_root / "kernels").iterdir()
    major, minor = torch.cuda.get_device_capability()
    assert json.loads((entry / "meta.json").read_text())["target"]["arch"].startswith(f"sm_{major}{minor}")


def test_a_fresh_process_runs_the_cached_kernel_correctly(cache_root: Path) -> None:
    spec = POOL[2]  # matmul
    kcache.KernelCache(cache_root).get_or_compile(spec.build(), gpu_target(), out_idx=spec.out_idx)
    child = spawn(f"""
        import json, torch, kcache
        from stress.programs.kernels import POOL
        spec = POOL[2]
        cache = kcache.KernelCache({str(cache_root)!r})
        kernel = cache.get_or_compile(spec.build(), {gpu_target()!r}, out_idx=spec.out_idx)
        a, b = spec.make_inputs("cuda")
        out, expected = kernel(a, b).float(), spec.reference(a, b).float()
        # Both sides are rounded to fp16 after summing in another order: one ulp apart at most, which
        # is 0.06 for outputs past 64. So relative, as assert_matches checks.
        close = torch.allclose(out, expected, rtol=spec.tolerance, atol=spec.tolerance)
        err = (out - expected).abs().max().item()
        print("result " + json.dumps({{"close": close, "err": err, **cache.stats()}}), flush=True)
    """)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err[-3000:]
    result = json.loads(next(line for line in out.splitlines() if line.startswith("result "))[7:])
    assert result["compiles"] == 0 and result["disk_hits"] == 1
    assert result["close"], result["err"]


@needs_root
def test_kernels_loaded_from_copies_on_a_noexec_mount_run_correctly(tmp_path: Path) -> None:
    from kcache.store import exec_copy

    with tmpfs(tmp_path / "noexec", size="64m", options="noexec") as mount:
        root = mount / "root"
        first = kcache.KernelCache(root)
        kernels = {spec.name: first.get_or_compile(spec.build(), gpu_target(), out_idx=spec.out_idx) for spec in POOL}
        assert exec_copy.noexec_mount(root) == mount and first.stats()["compiles"] == len(POOL)
        again = kcache.KernelCache(root)  # and the disk hits of another cache, loaded from copies too
        for spec in POOL:
            assert_matches(spec, kernels[spec.name])
            assert_matches(spec, again.get_or_compile(spec.build(), gpu_target(), out_idx=spec.out_idx))
        assert again.stats()["disk_hits"] == len(POOL)


def test_a_kernel_runs_only_on_the_compute_capability_its_target_names(cache_root: Path) -> None:
    """Arch safety (issue 18): a kernel built for another arch than the device's refuses its first call,
    compiled here or loaded from disk; one built for the device's arch runs."""
    major, minor = torch.cuda.get_device_capability()
    other = "sm_80" if (major, minor) != (8, 0) else "sm_86"
    spec = POOL[0]
    for cache in (kcache.KernelCache(cache_root), kcache.KernelCache(cache_root)):  # compiled, then a disk hit
        kernel = cache.get_or_compile(elementwise_add(), {"kind": "cuda", "arch": other}, out_idx=[2])
        with pytest.raises(kcache.ArchMismatch, match=f"built for {other}.*compute capability {major}.{minor}"):
            kernel(*spec.make_inputs("cuda"))
    assert cache.stats()["disk_hits"] == 1
    assert_matches(spec, kcache.KernelCache(cache_root).get_or_compile(elementwise_add(), gpu_target(), out_idx=[2]))
