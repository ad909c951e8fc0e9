"""On a GPU: Triton's isolated compiles (issues 56 and 67), where an autotuner really benchmarks.

- `@triton.autotune` over 16 matmul configs, one of whose compiles aborts (Triton's stage hook): plain
  Triton dies; under kcache the tune completes, its pick is correct against torch, the abort fired in
  another process (a worker of the compile service), and the configs compiled at once (Triton's assembler runs overlapping in time);
  Triton's launcher built once, by the C compiler, beside the tune's compiles (its build began before the first
  assembly ended: from the kernel's source, as the tune began).
- the same tune with configs ptxas refuses (a register cap): skipped as plain Triton skips them, no
  lock waited for.
- Inductor (`torch.compile`) with every kernel's compile aborting: Inductor's error, wrapping kcache's
  TritonCompilerCrashed, and the process lives; plain Triton dies.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="the Triton tests need triton (pip install -e '.[test]')")

from stress.programs.triton_programs.assemblers import most_at_once, timed_assemblers  # noqa: E402

from .helpers import PROJECT, child_env  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible; run these on the GPU machine"),
]
MANAGER = {"TRITON_CACHE_MANAGER": "kcache.triton:CacheManager"}


def timed_c_compiler(folder: Path) -> dict[str, str]:
    """CC for Triton's C builds (its driver's module, its launchers): a wrapper appending `SOURCE START END`
    (nanoseconds since the epoch) to `folder/cc-runs` per build."""
    real = shutil.which("gcc") or shutil.which("clang")
    wrapper = folder / "cc"
    wrapper.write_text(f'#!/bin/sh\nstart=$(date +%s%N)\n{real} "$@"\nstatus=$?\n'
                       f'echo "$(basename "$1") $start $(date +%s%N)" >> {folder / "cc-runs"}\nexit $status\n')
    wrapper.chmod(0o755)
    return {"CC": str(wrapper)}


def c_builds(folder: Path, source: str) -> list[tuple[int, int]]:
    """(start, end) of each C build of `source` (a file name) that the wrapper of timed_c_compiler ran."""
    runs = folder / "cc-runs"
    lines = runs.read_text().splitlines() if runs.exists() else []
    return [(int(start), int(end)) for name, start, end in (line.split() for line in lines) if name == source]


def assemblies_ended_before(folder: Path, stamp: int) -> int:
    return sum(int(line.split()[1]) < stamp for line in (folder / "spans").read_text().splitlines() if line.startswith("-"))


def tune(tmp_path: Path, name: str, **extra: str) -> subprocess.CompletedProcess[str]:
    folder = tmp_path / f"{name}-ptxas"
    folder.mkdir()
    env = child_env(**timed_assemblers(folder), **timed_c_compiler(folder), KCACHE_DIR=str(tmp_path / f"{name}-root"),
                    TRITON_CACHE_DIR=str(tmp_path / f"{name}-plain"), KT_FIRED=str(tmp_path / f"{name}-fired"), **extra)
    if "TRITON_CACHE_MANAGER" not in extra:
        env.pop("TRITON_CACHE_MANAGER", None)
    return subprocess.run([sys.executable, "-m", "stress.programs.triton_programs.tune"], capture_output=True,
                          text=True, env=env, cwd=str(PROJECT), timeout=600)


def test_an_autotune_whose_config_aborts_completes_correct_with_its_configs_compiled_at_once(tmp_path: Path) -> None:
    plain = tune(tmp_path, "plain", KT_ABORT="1")
    assert plain.returncode == -signal.SIGABRT and (tmp_path / "plain-fired").read_text(), plain.stderr[-2000:]
    done = tune(tmp_path, "kcache", KT_ABORT="1", **MANAGER)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    fired = [int(pid) for pid in (tmp_path / "kcache-fired").read_text().split()]
    assert fired and result["pid"] not in fired  # the abort fired, in a worker, once (remembered after)
    assert result["correct"] and result["best"] != result["aborted_config"], result
    skipped = [line for line in done.stderr.splitlines() if "worker crashed (SIGABRT)" in line]
    assert skipped and "num_stages=5" in skipped[0] and "skips this config" in skipped[0], done.stderr[-3000:]
    assert most_at_once(tmp_path / "kcache-ptxas") >= 2, "the configs compiled one after another"
    assert most_at_once(tmp_path / "plain-ptxas") == 1  # plain Triton's: one at a time
    launcher = c_builds(tmp_path / "kcache-ptxas", "__triton_launcher.c")
    # Begun before any config's assembly ended (one may have: the compile service's own warm-up kernel's).
    assert len(launcher) == 1 and assemblies_ended_before(tmp_path / "kcache-ptxas", launcher[0][0]) <= 1, launcher



def test_an_autotune_whose_configs_ptxas_refuses_skips_them_as_plain_triton_without_waiting(tmp_path: Path) -> None:
    """A register cap of 72 (KT_VARIANT=20): ptxas refuses some configs (a PTXASError the autotuner skips).
    Both complete with a correct pick; under kcache no compile waits for a lock its own failed compile
    kept (before: each refused config's benchmark waited KCACHE_LOCK_TIMEOUT, 15 minutes by default)."""
    plain = tune(tmp_path, "plain", KT_VARIANT="20")
    assert plain.returncode == 0 and "Insufficient registers" in plain.stdout + plain.stderr, plain.stderr[-2000:]
    done = tune(tmp_path, "kcache", KT_VARIANT="20", KCACHE_LOCK_TIMEOUT="30", KCACHE_LOG="debug", **MANAGER)
    assert done.returncode == 0, done.stderr[-3000:]
    ours, theirs = (json.loads(run.stdout.splitlines()[-1]) for run in (done, plain))
    assert ours["correct"] and theirs["correct"], (ours, theirs)
    assert "held the compile lock" not in done.stderr and "failed in its worker (PTXASError" in done.stderr

INDUCTOR = """
import json, os, sys
import torch
from triton import knobs

def hook(self=None, stages=None, options=None, language=None, capability=None):
    if self is None and stages is None:  # Triton 3.7 and later ask it what it adds to the cache key
        return "", ""
    if stages is None:
        return
    llir = stages["llir"]
    def aborting(src, metadata):
        open(os.environ["KT_FIRED"], "a").write(f"{os.getpid()}\\n")
        os.abort()
    stages["llir"] = aborting

knobs.runtime.add_stages_inspection_hook = hook
model = torch.compile(lambda x, y: torch.relu(x * y + 1.0).sum(dim=-1))
x = torch.randn(64, 256, device="cuda")
try:
    model(x, x)
    print(json.dumps({"raised": None}))
except Exception as err:
    chain, seen = [], err
    while seen is not None:
        chain.append(type(seen).__name__)
        seen = seen.__cause__ or seen.__context__
    print(json.dumps({"raised": type(err).__name__, "chain": chain, "message": str(err)[-3000:]}))
"""


def test_inductor_with_a_kernel_that_aborts_raises_its_error_wrapping_kcaches_and_lives(tmp_path: Path) -> None:
    def run(name: str, **extra: str) -> subprocess.CompletedProcess[str]:
        env = child_env(KCACHE_DIR=str(tmp_path / f"{name}-root"), TRITON_CACHE_DIR=str(tmp_path / f"{name}-plain"),
                        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / f"{name}-inductor"), TORCHINDUCTOR_COMPILE_THREADS="1",
                        KT_FIRED=str(tmp_path / f"{name}-fired"), **extra)
        if "TRITON_CACHE_MANAGER" not in extra:
            env.pop("TRITON_CACHE_MANAGER", None)
        return subprocess.run([sys.executable, "-c", INDUCTOR], capture_output=True, text=True, env=env,
                              cwd=str(tmp_path), timeout=600)

    plain = run("plain")
    assert plain.returncode == -signal.SIGABRT and (tmp_path / "plain-fired").exists(), plain.stderr[-2000:]
    done = run("kcache", **MANAGER)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["raised"] and ("TritonCompilerCrashed" in result["chain"] or "TritonCompilerCrashed" in
                                 result["message"]), result
    assert (tmp_path / "kcache-fired").exists()
