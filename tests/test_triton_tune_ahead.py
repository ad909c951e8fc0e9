"""A tune's compile-ahead on the CPU (kcache.triton.parallel_tune, issue 67): a real `@triton.autotune`
over 16 matmul configs, with a driver that compiles for sm_90 and launches nothing
(stress.programs.triton_programs.cpu_tune), in a fresh process each way. Under kcache the first config's compile
finds the tune up its stack and compiles every config at once, their back halves in the compile
service's workers and their front halves shared where equal; the launcher is made ahead, before the first
benchmark's; the pick and every config's cubin are plain Triton's. With a config whose compile aborts,
plain Triton dies and the tune under kcache skips that config (tests/test_gpu_triton_isolation.py does
the same where the autotuner really benchmarks)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the Triton tests need triton (pip install -e '.[test]')")

from .helpers import PROJECT  # noqa: E402
from .test_triton import MANAGER, program_env, ptxas, runs  # noqa: E402, F401 - a fixture

CONFIGS = 16


def tune(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stress.programs.triton_programs.cpu_tune"], capture_output=True, text=True,
                          env=env, cwd=str(PROJECT), timeout=600)


def result(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_tunes_configs_compile_ahead_in_the_services_workers_as_plain_triton_compiles_them(
        tmp_path: Path, ptxas: Path, runtime: Path) -> None:  # noqa: F811
    plain = result(tune(program_env(ptxas, tmp_path / "plain-root")))
    assert len(plain["cubins"]) == CONFIGS and plain["fronts"] == CONFIGS
    assert plain["events"][:2] == ["launcher", "launch"]  # Triton makes the launcher at the first load
    done = tune(program_env(ptxas, tmp_path / "root", KCACHE_LOG="debug", KCACHE_CALLER_FORK="0", **MANAGER))
    ours = result(done)
    assert f"compiling the {CONFIGS} configs of" in done.stderr, done.stderr[-3000:]
    assert done.stderr.count("(in a worker)") == CONFIGS, done.stderr[-3000:]  # every back half away
    assert (ours["best"], ours["cubins"]) == (plain["best"], plain["cubins"])
    assert ours["fronts"] == 8  # the configs that differ only in num_warps and num_stages share one
    assert "built Triton's launcher for matmul_kernel ahead, from its source" in done.stderr
    # Made from the source as the tune began, before any config compiled; then the first benchmark's load.
    assert ours["events"][:3] == ["launcher before any kernel", "launcher", "launch"]
    assert runs(ptxas) == 2 * CONFIGS  # each lane assembled every config once


def test_a_tune_whose_config_aborts_skips_it_under_kcache_where_plain_triton_dies(
        tmp_path: Path, ptxas: Path, runtime: Path) -> None:  # noqa: F811
    fired = tmp_path / "fired"
    plain = tune(program_env(ptxas, tmp_path / "plain-root", KT_ABORT="1", KT_FIRED=str(fired)))
    assert plain.returncode == -signal.SIGABRT and fired.read_text(), plain.stderr[-2000:]
    fired.unlink()
    ours = result(tune(program_env(ptxas, tmp_path / "root", KT_ABORT="1", KT_FIRED=str(fired), **MANAGER)))
    aborted = [int(pid) for pid in fired.read_text().split()]
    assert aborted and ours["pid"] not in aborted  # the abort fired, in a worker
    assert len(ours["cubins"]) == CONFIGS - 1 and not any(label.endswith(" s5") for label in ours["cubins"])
    assert "num_stages: 5" not in ours["best"]


def test_a_tune_whose_configs_ptxas_refuses_skips_them_as_plain_triton_and_waits_for_no_lock(
        tmp_path: Path, ptxas: Path, runtime: Path) -> None:  # noqa: F811
    """A register cap of 72 (KT_VARIANT=20): ptxas refuses the configs whose wgmma needs more registers
    ("Insufficient registers"), a Python error (PTXASError) that Triton's autotuner skips. Before, the
    compile-ahead's failed compile kept its key's lock in the caller, and the benchmark of that config
    waited for it until KCACHE_LOCK_TIMEOUT (15 minutes by default), each failing config in turn."""
    plain = result(tune(program_env(ptxas, tmp_path / "plain-root", KT_VARIANT="20")))
    refused = CONFIGS - len(plain["cubins"])
    assert refused > 0, "ptxas accepted every config: the test would show nothing"
    assert runs(ptxas) == CONFIGS
    done = tune(program_env(ptxas, tmp_path / "root", KT_VARIANT="20", KCACHE_LOG="debug", KCACHE_LOCK_TIMEOUT="30",
                            KCACHE_CALLER_FORK="0", **MANAGER))
    ours = result(done)
    assert (ours["best"], ours["cubins"]) == (plain["best"], plain["cubins"])
    assert "held the compile lock" not in done.stderr and "for another process's compile" not in done.stderr
    assert done.stderr.count("failed in its worker (PTXASError") == refused, done.stderr[-3000:]
    # Each refused config: once away (ahead), once in the caller (its benchmark's, raising Triton's error).
    assert runs(ptxas) - CONFIGS == CONFIGS + refused


def test_a_tune_whose_config_fails_its_front_half_raises_plain_tritons_error_and_waits_for_no_lock(
        tmp_path: Path, ptxas: Path, runtime: Path) -> None:  # noqa: F811
    """A last config with BM=48 (KT_BAD_CONFIG): its front half raises Triton's CompilationError (a block
    not a power of 2), which ends a tune. Under kcache the tune ends with the same error, without
    waiting KCACHE_LOCK_TIMEOUT for the lock its compile-ahead's failed compile kept."""
    plain = tune(program_env(ptxas, tmp_path / "plain-root", KT_BAD_CONFIG="1"))
    assert plain.returncode == 1 and "CompilationError" in plain.stderr, plain.stderr[-2000:]
    done = tune(program_env(ptxas, tmp_path / "root", KT_BAD_CONFIG="1", KCACHE_LOCK_TIMEOUT="30",
                            KCACHE_CALLER_FORK="0", **MANAGER))
    assert done.returncode == 1 and "held the compile lock" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == plain.stderr.strip().splitlines()[-1]
