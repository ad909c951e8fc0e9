"""get_or_compile with real TileLang compiles (CPU: compile and load, no launch)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")

import kcache  # noqa: E402
from kcache.store.entries import EntryStore  # noqa: E402
from stress.nvcc_counter import NvccCounter  # noqa: E402
from stress.programs.kernels import CPU_TARGET, elementwise_add  # noqa: E402

from .faults import fill_filesystem, needs_root, tmpfs  # noqa: E402

pytestmark = pytest.mark.tilelang
OUT_IDX = [2]


def get(cache: kcache.KernelCache, func=None, **kw):
    return cache.get_or_compile(func if func is not None else elementwise_add(), CPU_TARGET, out_idx=OUT_IDX, **kw)


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root holding one compiled entry; tests work on copies of it."""
    root = tmp_path_factory.mktemp("populated")
    cache = kcache.KernelCache(root)
    get(cache)
    assert cache.stats()["compiles"] == 1
    return root


@pytest.fixture
def root_copy(populated: Path, tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(populated, root, symlinks=True)
    return root


def only_entry(root: Path) -> Path:
    (entry,) = (root / "kernels").iterdir()
    return entry


def test_an_entry_holds_every_component_with_its_manifest(populated: Path) -> None:
    entry = only_entry(populated)
    names = sorted(os.listdir(entry))
    assert names == ["device.cu", "host.cu", "kernel.cubin", "kernel.so", "manifest.json", "meta.json", "params.json"]
    # Written once, so read-only, the linker's kernel.so included (nobody may truncate a mapped library).
    assert {name: oct(os.stat(entry / name).st_mode & 0o777) for name in names} == dict.fromkeys(names, "0o444")
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["kernel"] == "add_4096_256_float32"
    assert meta["target"]["arch"] == "sm_90a" and meta["compile_seconds"] > 0
    import tilelang

    assert meta["toolchain"]["tilelang"] == tilelang.__version__
    assert "release" in meta["toolchain"]["nvcc"]  # "Cuda compilation tools, release 13.0, V13.0.88"
    assert (entry / "kernel.cubin").read_bytes()[:4] == b"\x7fELF"
    assert "__global__" in (entry / "device.cu").read_text()
    cuobjdump = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if os.path.exists(cuobjdump):
        listing = subprocess.run([cuobjdump, "--list-elf", str(entry / "kernel.cubin")], capture_output=True, text=True)
        assert listing.returncode == 0, listing.stderr


def test_a_fresh_cache_on_the_same_root_hits_disk_without_compiling(root_copy: Path) -> None:
    cache = kcache.KernelCache(root_copy)
    kernel = get(cache)
    assert cache.stats()["disk_hits"] == 1 and cache.stats()["compiles"] == 0 and cache.stats()["misses"] == 0
    assert [int(d) for d in kernel.params[2].shape] == [4096]


def test_memory_hits_on_the_same_and_on_a_structurally_equal_primfunc(root_copy: Path) -> None:
    cache = kcache.KernelCache(root_copy)
    func = elementwise_add()
    first = get(cache, func)
    assert get(cache, func) is first
    assert get(cache, elementwise_add()) is first
    assert cache.stats()["memory_hits"] == 2 and cache.stats()["disk_hits"] == 1
    other = get(cache, elementwise_add(n=8192))
    assert other is not first


@pytest.mark.parametrize("damage", ["truncate-so", "flip-so", "delete-cubin", "garbage-params"])
def test_corrupt_entries_are_quarantined_and_recompiled_never_loaded(root_copy: Path, damage: str) -> None:
    entry = only_entry(root_copy)
    if damage == "truncate-so":
        os.truncate(entry / "kernel.so", 4096)  # TileLang 0.1.15 dies of SIGBUS loading this
    elif damage == "flip-so":
        data = bytearray((entry / "kernel.so").read_bytes())
        data[len(data) // 3] ^= 0x5A
        (entry / "kernel.so").write_bytes(bytes(data))
    elif damage == "delete-cubin":
        (entry / "kernel.cubin").unlink()
    else:
        (entry / "params.json").write_text("garbage")
    cache = kcache.KernelCache(root_copy)
    kernel = get(cache)
    assert kernel is not None
    assert cache.stats()["corrupt_entries"] == 1 and cache.stats()["compiles"] == 1
    quarantined = list((root_copy / ".quarantine").iterdir())
    assert len(quarantined) == 1 and (quarantined[0] / "QUARANTINED.txt").exists()
    # The recompiled entry is complete and verifies.
    assert EntryStore(root_copy, "kernels", cache.store.required).read(entry.name) is not None


def test_a_verified_entry_that_cannot_be_loaded_is_corrupt_too(root_copy: Path) -> None:
    # A well-formed but wrong library: the manifest is rewritten to match it,
    # so only the load can tell.
    from kcache.store.manifest import build_manifest

    entry = only_entry(root_copy)
    shutil.copy("/bin/true", entry / "kernel.so")
    (entry / "manifest.json").unlink()
    (entry / "manifest.json").write_bytes(build_manifest(entry))
    cache = kcache.KernelCache(root_copy)
    assert get(cache) is not None
    assert cache.stats()["corrupt_entries"] == 1 and cache.stats()["compiles"] == 1


def test_compile_errors_carry_kernel_summary_and_full_log(cache_root: Path) -> None:
    cache = kcache.KernelCache(cache_root)
    with pytest.raises(kcache.CompileError) as caught:
        get(cache, compile_flags=["--no-such-nvcc-flag"])
    err = caught.value
    assert err.kernel_name == "add_4096_256_float32"
    assert "no-such-nvcc-flag" in err.summary and len(err.summary.splitlines()) <= 8
    assert err.log_path and Path(err.log_path).is_file()
    assert "no-such-nvcc-flag" in Path(err.log_path).read_text()
    # The message names the kernel, nvcc's error, its command and the log; the source is in the log only.
    told = str(err)
    assert "'add_4096_256_float32'" in told and "Command: " in told and f"(full log: {err.log_path})" in told
    assert "__global__" not in told and "__global__" in Path(err.log_path).read_text()
    assert not (cache_root / "kernels").exists() or not os.listdir(cache_root / "kernels")


def test_a_compile_errors_message_is_bounded_however_long_the_source() -> None:
    """TileLang's nvcc failure carries the whole CUDA source before nvcc's output (19,718 characters
    in issue 58): the message keeps the kernel, the error lines, the command and the log's path."""
    import pickle

    source = 'extern "C" __global__ void big_kernel(float* A) { A[0] = 1.0f; }\n' * 320  # about 20,000 characters
    nvcc_error = 'big.cu(12): error: identifier "undefined_thing" is undefined'
    message = f"{source}\nCompilation error:\n{nvcc_error}\n\nCommand: nvcc --cubin -arch=sm_90a big.cu"
    err = kcache.CompileError("big_kernel", nvcc_error, "/root/.logs/compile-big_kernel.log", message)
    told = str(err)
    assert len(message) > 20000 and len(told) < 1000, len(told)
    assert "kernel 'big_kernel'" in told and nvcc_error in told and "Command: nvcc --cubin -arch=sm_90a big.cu" in told
    assert "(full log: /root/.logs/compile-big_kernel.log)" in told and "__global__" not in told
    assert f"the CUDA source before it, {len(source.strip())} characters, is in the log" in told
    assert err.compiler_message == message and str(pickle.loads(pickle.dumps(err))) == told
    endless = kcache.CompileError("k", "error", None, "x" * 50000)  # no nvcc marker: head and tail, the cut said
    assert len(str(endless)) < 6000 and "characters cut" in str(endless)


def test_the_next_call_after_a_compile_error_still_works(cache_root: Path) -> None:
    cache = kcache.KernelCache(cache_root)
    with pytest.raises(kcache.CompileError):
        get(cache, compile_flags=["--no-such-nvcc-flag"])
    assert get(cache) is not None


def test_every_key_input_changes_the_key(cache_root: Path) -> None:
    from kcache.keys import derive_key
    from kcache.tilelang import backend
    from kcache.tilelang.backend import toolchain_fingerprint

    func = elementwise_add()
    toolchain = toolchain_fingerprint(cache_root)
    target = backend.resolve_target(CPU_TARGET, "tvm_ffi")

    def key(**over):
        args = dict(func=func, resolved=target, out_idx=[2], pass_configs={}, compile_flags=None, toolchain=toolchain)
        args.update(over)
        return derive_key(backend.key_fields(**args))

    base = key()
    assert base == key(func=elementwise_add())  # same program, fresh object
    variants = [
        key(func=elementwise_add(block=128)),
        key(resolved=backend.resolve_target({"kind": "cuda", "arch": "sm_80"}, "tvm_ffi")),
        key(out_idx=[1]),
        key(pass_configs={"tl.disable_tma_lower": True}),
        key(compile_flags=["-O1"]),
        key(toolchain=dict(toolchain, nvcc="Cuda compilation tools, release 12.8")),
        key(toolchain=dict(toolchain, tilelang_libs={"libtilelang.so": "0" * 64})),
    ]
    assert len({base, *variants}) == len(variants) + 1


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU error; this machine has a GPU")
@pytest.mark.parametrize("target", [None, "cuda"])
def test_no_gpu_and_no_arch_is_a_clear_error(cache_root: Path, target) -> None:
    cache = kcache.KernelCache(cache_root)
    with pytest.raises(kcache.TargetError) as caught:
        cache.get_or_compile(elementwise_add(), target, out_idx=OUT_IDX)
    assert "no GPU" in str(caught.value) and "arch" in caught.value.fix


def test_unsupported_execution_backend_is_refused(cache_root: Path) -> None:
    with pytest.raises(ValueError, match="tvm_ffi"):
        get(kcache.KernelCache(cache_root), execution_backend="cython")


@pytest.mark.parametrize("isolation", ["pool", "inprocess"])
def test_tilelang_caches_neither_serve_nor_store_kcache_compiles(
    cache_root: Path, tmp_path: Path, monkeypatch, isolation: str
) -> None:
    import tilelang
    from tilelang.contrib import nvcc

    n = {"pool": 2048, "inprocess": 3072}[isolation]  # TileLang's memory cache outlives a test

    calls = []
    real_compile = nvcc.compile_cuda

    def counting_compile(*args, **kwargs):
        calls.append(1)
        return real_compile(*args, **kwargs)

    monkeypatch.setattr(nvcc, "compile_cuda", counting_compile)
    # TileLang's own path fills its kernel cache and its CUDA binary cache.
    tilelang.compile(elementwise_add(n=n), out_idx=OUT_IDX, target=CPU_TARGET, execution_backend="tvm_ffi")
    assert len(calls) == 1
    tilelang_dir = Path(os.environ["TILELANG_CACHE_DIR"])
    before = sorted(p for p in tilelang_dir.rglob("*") if p.is_file())
    assert any("cuda-binaries" in str(p) for p in before)

    # A pool worker is another process: count its nvcc runs with a wrapper in its CUDA_HOME.
    counter = NvccCounter(tmp_path)
    for name, value in counter.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KCACHE_COMPILE_ISOLATION", isolation)
    with kcache.CompilePool(1) as pool:
        get(kcache.KernelCache(cache_root, compile_pool=pool), elementwise_add(n=n))
    # nvcc really ran: TileLang's binary cache did not serve the binary
    assert (len(calls) - 1, counter.count()) == ((1, 0) if isolation == "inprocess" else (0, 1))
    assert sorted(p for p in tilelang_dir.rglob("*") if p.is_file()) == before  # and nothing was stored


def test_a_lost_publish_race_uses_the_winners_entry(root_copy: Path, tmp_path: Path) -> None:
    # A writer that ignores our lock (another host without working flock)
    # publishes while we are staging; inject it at our "verified" step.
    winner = only_entry(root_copy)
    stash = tmp_path / "winner"
    shutil.move(winner, stash)
    cache = kcache.KernelCache(root_copy)
    fired = []

    def other_writer_publishes(step: str) -> None:
        if step == "verified":
            fired.append(step)
            shutil.copytree(stash, winner)

    cache.store.fault_hook = other_writer_publishes
    kernel = get(cache)
    assert fired == ["verified"]
    assert cache.stats()["lost_races"] == 1 and cache.stats()["compiles"] == 1
    assert kernel.adapter.libpath == str(winner / "kernel.so")


@needs_root
def test_a_full_disk_after_a_good_compile_returns_the_kernel_and_warns_once(tmp_path: Path, caplog) -> None:
    with tmpfs(tmp_path / "tiny", size="1m") as mount:
        cache = kcache.KernelCache(mount / "cache")
        from kcache.tilelang.backend import toolchain_fingerprint

        toolchain_fingerprint(cache.root)  # the small files that come before the entry
        fill_filesystem(mount, leave_bytes=8 * 1024)
        with caplog.at_level(logging.WARNING, logger="kcache"):
            kernel = get(cache)
        assert kernel is not None and cache.stats()["publish_failures"] == 1
        warnings = [r for r in caplog.records if "could not save" in r.getMessage()]
        assert len(warnings) == 1 and "ENOSPC" in warnings[0].getMessage()
        assert not (cache.root / "kernels").exists() or os.listdir(cache.root / "kernels") == []
        assert os.listdir(cache.root / ".staging") == []


@pytest.mark.parametrize("out_idx", [[2], -1, None])
def test_a_disk_hit_builds_the_same_kernel_as_tilelangs_from_database(cache_root: Path, out_idx) -> None:
    # kcache assembles the JITKernel itself (faster, see docs/benchmarks.md); it
    # must set exactly what TileLang's own loader sets.
    import tvm
    from tilelang.engine.param import load_kernel_params
    from tilelang.jit import JITKernel
    from tilelang.jit.adapter.base import CachedTextSource

    from kcache.tilelang import backend

    func = elementwise_add()
    cache = kcache.KernelCache(cache_root)
    cache.get_or_compile(func, CPU_TARGET, out_idx=out_idx)
    resolved = backend.resolve_target(CPU_TARGET, "tvm_ffi")
    norm_idx = backend.normalize_out_idx(out_idx)
    configs = backend.normalize_pass_configs(None)
    (key,) = cache.store.keys()  # the one entry, under the key the cache derived (a key derived here by hand from
    # key_fields missed it on the GPU machine: the cache builds its key through KernelRequest)
    files, entry = cache.store.read(key), cache.store.entry_path(key)
    ours = backend.load_kernel(func, entry, files, resolved, norm_idx, configs, None)
    assert norm_idx == backend.normalize_out_idx(out_idx)  # the caller's list is left alone
    theirs = JITKernel.from_database(
        func=func, host_kernel_source=CachedTextSource(text=files["host.cu"].decode()),
        device_kernel_source=CachedTextSource(text=files["device.cu"].decode()), kernel_lib_path=str(entry / "kernel.so"),
        params=load_kernel_params(files["params.json"].decode()), target=resolved.context.target,
        target_host=resolved.context.target_host, out_idx=backend.normalize_out_idx(out_idx), execution_backend="tvm_ffi",
        pass_configs=configs, compile_flags=None, backend_context=resolved.context,
    )
    assert set(vars(ours)) == set(vars(theirs))
    assert set(vars(ours.adapter)) == set(vars(theirs.adapter))
    a, b = theirs.adapter, ours.adapter
    assert a.result_idx == b.result_idx
    assert a._ffi_callee_allocated_output_abi == b._ffi_callee_allocated_output_abi
    assert a.ir_module.script(show_meta=True) == b.ir_module.script(show_meta=True)
    assert str(a.target) == str(b.target) and a.libpath == b.libpath
    assert [(str(p.dtype), [str(s) for s in p.shape]) for p in a.params] == [
        (str(p.dtype), [str(s) for s in p.shape]) for p in b.params]
    assert (a.dynamic_symbolic_map is None) == (b.dynamic_symbolic_map is None)
    assert tvm.ir.structural_equal(ours.prim_func, theirs.prim_func)
