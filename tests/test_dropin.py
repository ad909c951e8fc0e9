"""kcache.install(): unmodified TileLang programs compile each kernel once across processes, build the
same kernels as TileLang, and leave TileLang's cache directory alone; uninstall restores TileLang."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")

import kcache  # noqa: E402
from kcache.store.locks import read_note  # noqa: E402
from stress.nvcc_counter import NvccCounter  # noqa: E402
from stress.programs.kernels import CPU_TARGET, elementwise_add  # noqa: E402

from .helpers import PROJECT, child_env  # noqa: E402

pytestmark = pytest.mark.tilelang
PROGRAMS = PROJECT / "stress" / "programs" / "tilelang_programs"
# Programs written as TileLang's examples are pick their target from TileLang's own setting.
TARGET_ENV = {"TILELANG_DEFAULT_TARGET": json.dumps(CPU_TARGET)}
# A host target kcache does not build for: `c` with a non-default option (this TileLang has no LLVM).
OTHER_HOST = {"kind": "c", "mcpu": "x86-64"}


def files_under(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()) if directory.exists() else []


def start(program: str, workdir: Path, *, with_kcache: bool, **env: str) -> subprocess.Popen[str]:
    """`python PROGRAM`, or `python -m kcache run PROGRAM`, in `workdir` (TileLang's AutoTuner writes
    autotuner.log into the working directory)."""
    command = [sys.executable, "-m", "kcache", "run"] if with_kcache else [sys.executable]
    return subprocess.Popen([*command, str(PROGRAMS / f"{program}.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(**TARGET_ENV, **env), cwd=str(workdir))


def result_of(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=600)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{err[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


class ProgramRuns:
    """Each program once plainly under TileLang (its own cache), then `copies` of each at once under
    `kcache run`, compiles counted by an nvcc wrapper, TileLang's cache directory watched."""

    def __init__(self, programs: tuple[str, ...], copies: int, workdir: Path) -> None:
        self.workdir = workdir
        plain_dir = workdir / "tilelang-own"
        self.plain = {p: result_of(start(p, workdir, with_kcache=False, TILELANG_CACHE_DIR=str(plain_dir)))
                      for p in programs}
        assert files_under(plain_dir)  # the control: TileLang alone writes its cache
        self.counter = NvccCounter(workdir)
        self.untouched = workdir / "tilelang-untouched"
        self.env = {"KCACHE_DIR": str(workdir / "kcache"), "TILELANG_CACHE_DIR": str(self.untouched),
                    **self.counter.env()}
        running = [start(p, workdir, with_kcache=True, **self.env) for p in programs for _ in range(copies)]
        self.results = [result_of(proc) for proc in running]

    def entries(self) -> int:
        return len(os.listdir(self.workdir / "kcache" / "kernels"))


def test_unmodified_programs_in_several_processes_compile_each_kernel_once(tmp_path: Path) -> None:
    programs = ("gemm", "elementwise", "reduction", "eager_add")
    runs = ProgramRuns(programs, 2, tmp_path)
    for result in runs.results:
        assert result["sources"] == runs.plain[result["program"]]["sources"]  # the kernels TileLang builds
    assert runs.counter.count() == len(programs) == runs.entries()  # once each, across all the processes
    assert files_under(runs.untouched) == []


def test_decorated_kernels_seen_before_skip_building_and_uninstall_restores_tilelang(
    cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tilelang
    import tilelang.language as T

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tilelang"))
    built: list[int] = []

    @tilelang.jit(out_idx=[-1], target=CPU_TARGET)
    def scale(N, factor):
        built.append(N)

        @T.prim_func
        def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
            with T.Kernel(T.ceildiv(N, 128), threads=128) as bx:
                for i in T.Parallel(128):
                    B[bx * 128 + i] = A[bx * 128 + i] * factor

        return main

    cache = kcache.KernelCache(cache_root)
    kcache.install(cache)
    try:
        first = scale(1024, 2.0)
        assert scale(1024, 2.0) is first and built == [1024]  # a seen call: no PrimFunc built
        assert cache.stats()["compiles"] == 1 and first.adapter.libpath.startswith(str(cache_root))
        again = tilelang.compile(elementwise_add(n=1024), out_idx=[2], target=CPU_TARGET)
        assert tilelang.compile(elementwise_add(n=1024), out_idx=[2], target=CPU_TARGET) is again  # memory hit
        assert cache.stats()["compiles"] == 2 and files_under(tmp_path / "tilelang") == []
    finally:
        kcache.uninstall()
    assert not kcache.is_installed()
    # A size no other test compiles: TileLang's memory cache lasts the whole pytest process.
    own = tilelang.compile(elementwise_add(n=1536), out_idx=[2], target=CPU_TARGET)
    assert not str(getattr(own.adapter, "libpath", "")).startswith(str(cache_root))  # TileLang's own compile
    assert cache.stats()["compiles"] == 2
    assert files_under(tmp_path / "tilelang")  # TileLang's own cache is back


def test_arguments_kcache_does_not_serve_pass_through_to_tilelang(
    cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    import tilelang

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tilelang"))
    cache = kcache.KernelCache(cache_root)
    kcache.install(cache)
    try:
        with caplog.at_level(logging.DEBUG, logger="kcache"):
            for n in (1280, 2304):  # sizes no other test compiles: TileLang's memory cache lasts the process
                kernel = tilelang.compile(elementwise_add(n=n), out_idx=[2], target=CPU_TARGET, target_host=OTHER_HOST)
                assert not str(getattr(kernel.adapter, "libpath", "")).startswith(str(cache_root))
    finally:
        kcache.uninstall()
    assert cache.stats()["misses"] == 0 and files_under(tmp_path / "tilelang")
    passed = [r.getMessage() for r in caplog.records if "passing a compile through" in r.getMessage()]
    assert len(passed) == 1 and f"target_host={OTHER_HOST!r}" in passed[0]


RESULT_ROUND_TRIP = """
import json, sys, kcache, tilelang
from tilelang.autotuner import AutoTuner
from tilelang.autotuner.param import AutotuneResult
from stress.programs.kernels import CPU_TARGET, elementwise_add
cache = kcache.KernelCache(sys.argv[1])
kcache.install(cache)
tuner = AutoTuner.from_kernel(kernel=lambda n=1024: elementwise_add(n=n), configs=[{{"n": 1024}}])
tuner.set_compile_args(out_idx=[2], target=CPU_TARGET, execution_backend="tvm_ffi")
key = "ab" * 32
if sys.argv[2] == "save":
    kernel = tilelang.compile(elementwise_add(n=1024), out_idx=[2], target=CPU_TARGET)
    tuner._save_result_to_disk(key, AutotuneResult(latency=0.25, config={{"n": 1024}}, ref_latency=0.5,
                                                   func=kernel.prim_func, kernel=kernel))
    print("RESULT " + json.dumps({{"stats": cache.stats()}}))
else:
    result = tuner._load_result_from_disk(key)
    print("RESULT " + json.dumps({{"config": result.config, "latency": result.latency, "ref": result.ref_latency,
                                   "source": result.kernel.get_kernel_source() == result.libcode,
                                   "libpath": result.kernel.adapter.libpath, "stats": cache.stats(),
                                   "missing": tuner._load_result_from_disk("cd" * 32)}}))
"""


def test_tilelang_autotuner_results_are_kcache_entries_shared_across_processes(tmp_path: Path) -> None:
    root, tilelang_dir = tmp_path / "kcache", tmp_path / "tilelang"
    env = child_env(TILELANG_CACHE_DIR=str(tilelang_dir))

    def run(step: str) -> dict:
        done = subprocess.run([sys.executable, "-c", RESULT_ROUND_TRIP.format(), str(root), step], capture_output=True,
                              text=True, env=env, cwd=str(PROJECT), timeout=600)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and lines, done.stderr[-3000:]
        return json.loads(lines[-1][len("RESULT "):])

    assert run("save")["stats"]["compiles"] == 1
    (saved,) = [p for p in (root / "autotuner").iterdir() if not p.name.startswith(".")]
    from kcache.dropin.autotuner_results import result_name
    from kcache.results.device import current_device_identity

    # TileLang's key and the identity of the device it was measured on name it.
    assert saved.name == result_name("ab" * 32, current_device_identity()) and (saved / "manifest.json").exists()
    loaded = run("load")
    assert (loaded["config"], loaded["latency"], loaded["ref"]) == ({"n": 1024}, 0.25, 0.5) and loaded["source"]
    assert loaded["stats"]["compiles"] == 0 and loaded["stats"]["disk_hits"] == 1  # the kernel: a kcache hit
    assert loaded["libpath"].startswith(str(root)) and loaded["missing"] is None
    assert files_under(tilelang_dir) == []


TUNE_ONCE_RUN = """
import json, sys, kcache, tilelang
from tilelang.autotuner import AutoTuner
from tilelang.autotuner.param import AutotuneResult
from stress.programs.kernels import CPU_TARGET, elementwise_add

def run_standing_in_for_tilelangs(self):
    # TileLang's AutoTuner.run: look for a saved result; else tune (here: block until told, compile
    # one config, no GPU to time it on) and save what it found.
    found = self._load_result_from_disk(KEY)
    if found is not None:
        return "loaded", found.config
    print("tuning", flush=True)
    sys.stdin.readline()
    kernel = tilelang.compile(elementwise_add(n=1024), out_idx=[2], target=CPU_TARGET)
    self._save_result_to_disk(KEY, AutotuneResult(latency=0.25, config={"pid": PID}, func=kernel.prim_func,
                                                  kernel=kernel))
    return "tuned", {"pid": PID}

import os
KEY, PID = "ef" * 32, os.getpid()
AutoTuner.run = run_standing_in_for_tilelangs
kcache.install(kcache.KernelCache(sys.argv[1]))  # wraps `run`: the claim ends with it
tuner = AutoTuner.from_kernel(kernel=lambda n=1024: elementwise_add(n=n), configs=[{"n": 1024}])
tuner.set_compile_args(out_idx=[2], target=CPU_TARGET, execution_backend="tvm_ffi")
print("RESULT " + json.dumps(tuner.run()), flush=True)
"""


def test_tilelang_autotuner_runs_of_one_key_at_once_tune_once(tmp_path: Path) -> None:
    """Two processes run TileLang's AutoTuner for one key: the second waits in its load for the first's
    result (kcache's claim), and gets its config. TileLang's real run needs a GPU to time configs
    (tests/test_gpu_dropin.py runs it); here a stand-in runs its load-tune-save steps."""
    root = tmp_path / "kcache"
    env = child_env(TILELANG_CACHE_DIR=str(tmp_path / "tilelang"))

    def start_run() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", TUNE_ONCE_RUN, str(root)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(PROJECT))

    first = start_run()
    assert first.stdout.readline().strip() == "tuning", first.stderr.read()[-3000:]
    second = start_run()
    for line in second.stderr:  # its waiting message: a handshake, not a sleep
        if "waiting for its result" in line:
            assert f"pid {first.pid} on " in line, line
            break
    else:
        raise AssertionError(f"the second run did not wait: {second.stdout.read()}")
    first.stdin.write("go\n")
    first.stdin.flush()
    outputs = [p.communicate(timeout=600)[0] for p in (first, second)]
    results = [json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
               for out in outputs]
    assert results == [["tuned", {"pid": first.pid}], ["loaded", {"pid": first.pid}]]
    assert [p.returncode for p in (first, second)] == [0, 0]
    assert [read_note(p) for p in (root / ".locks").glob("tune-*.lock")] == [b""]


def test_kcache_tilelang_at_import_installs_once_tilelang_loads(tmp_path: Path) -> None:
    code = """
import sys, kcache
before = "tilelang" in sys.modules, kcache.is_installed()
import tilelang
from stress.programs.kernels import CPU_TARGET, elementwise_add
tilelang.compile(elementwise_add(n=1024), out_idx=[2], target=CPU_TARGET)
print("RESULT", before, kcache.is_installed(), kcache.default_cache().stats()["compiles"])
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(PROJECT), timeout=600,
                          env=child_env(KCACHE_TILELANG="1", KCACHE_DIR=str(tmp_path / "kcache"),
                                        TILELANG_CACHE_DIR=str(tmp_path / "tilelang")))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT (False, False) True 1" in done.stdout  # TileLang was not imported by kcache itself
    assert files_under(tmp_path / "tilelang") == []
