"""On a GPU: Triton's kernels on kcache's store (issue 38) launch and compute what plain Triton computes.

Every process is a fresh `python -m stress.programs.triton_programs.gpu`; compiles are counted by the runs of
Triton's assemblers (counting wrappers, stress.programs.triton_programs.assemblers), not by kcache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="the Triton tests need triton (pip install -e '.[test]')")

from stress.programs.triton_programs.assemblers import assembler_runs, counting_assemblers  # noqa: E402

from .faults import needs_root, tmpfs  # noqa: E402
from .helpers import PROJECT, child_env  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible; run these on the GPU machine"),
]
MANAGER = {"TRITON_CACHE_MANAGER": "kcache.triton:CacheManager"}
PROGRAM = ["-m", "stress.programs.triton_programs.gpu"]


def program_env(work: Path, root: Path, inductor_dir: Path, **extra: str) -> dict[str, str]:
    """Counting assemblers; an Inductor cache of its own per call site (its FX graph cache must not
    stand between a process and Triton); plain Triton's cache unless `extra` names kcache's manager."""
    folder = work / "ptxas"
    folder.mkdir(exist_ok=True)
    env = child_env(**counting_assemblers(folder), KCACHE_DIR=str(root), TRITON_CACHE_DIR=str(work / "plain"),
                    TORCHINDUCTOR_CACHE_DIR=str(inductor_dir), **extra)
    if "TRITON_CACHE_MANAGER" not in extra:
        env.pop("TRITON_CACHE_MANAGER", None)
    return env


def run_program(kind: str, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, *PROGRAM, kind], capture_output=True, text=True, env=env,
                          cwd=str(PROJECT), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def all_correct(results: dict) -> bool:
    return bool(results) and all(r["correct"] for r in results.values())


@pytest.mark.parametrize("kind", ["jit", "inductor"])
def test_kernels_from_kcache_compute_what_plain_tritons_compute_and_a_fresh_process_compiles_nothing(
        tmp_path: Path, kind: str) -> None:
    root = tmp_path / "root"
    plain = run_program(kind, program_env(tmp_path, root, tmp_path / "inductor-plain"))
    plain_runs = assembler_runs(tmp_path / "ptxas")
    first = run_program(kind, program_env(tmp_path, root, tmp_path / "inductor-1", **MANAGER))
    first_runs = assembler_runs(tmp_path / "ptxas") - plain_runs
    second = run_program(kind, program_env(tmp_path, root, tmp_path / "inductor-2", **MANAGER))
    second_runs = assembler_runs(tmp_path / "ptxas") - plain_runs - first_runs
    assert all_correct(plain) and all_correct(first) and all_correct(second), (plain, first, second)
    assert plain == first == second  # the same output bytes: the cache changed nothing
    assert first_runs == plain_runs > 0, (plain_runs, first_runs)
    assert second_runs == 0, second_runs
    assert (root / "triton").is_dir()


def test_inductor_in_8_processes_at_once_compiles_each_kernel_once(tmp_path: Path) -> None:
    """Eight ranks compile one model at once on one root: Triton's compiles of all of them together
    are those of one process alone, and every output equals eager's."""
    alone_work, herd_work = tmp_path / "alone", tmp_path / "herd"
    alone_work.mkdir()
    herd_work.mkdir()
    alone = run_program("inductor", program_env(alone_work, alone_work / "root", alone_work / "inductor", **MANAGER))
    alone_runs = assembler_runs(alone_work / "ptxas")
    procs = [subprocess.Popen([sys.executable, *PROGRAM, "inductor"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=str(PROJECT),
                              env=program_env(herd_work, herd_work / "root", herd_work / f"inductor-{i}",
                                              KT_GATE="1", **MANAGER))
             for i in range(8)]
    for proc in procs:  # each has imported torch and Triton: release them together
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-2000:]
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        outputs.append(json.loads(out.splitlines()[-1]))
    assert all(result == alone for result in outputs) and all_correct(alone), (alone, outputs)
    assert alone_runs > 0 and assembler_runs(herd_work / "ptxas") == alone_runs, (
        alone_runs, assembler_runs(herd_work / "ptxas"))


@needs_root
def test_on_a_noexec_root_kernels_launch_and_the_next_process_compiles_nothing(tmp_path: Path) -> None:
    """On a noexec root plain Triton cannot load the launcher it built; kcache loads private copies."""
    with tmpfs(tmp_path / "noexec", size="256m", options="noexec") as mount:
        assert os.statvfs(mount).f_flag & os.ST_NOEXEC  # the fault is real: nothing there may be mapped to run
        first = run_program("jit", program_env(tmp_path, mount / "root", tmp_path / "inductor-1", **MANAGER))
        runs = assembler_runs(tmp_path / "ptxas")
        second = run_program("jit", program_env(tmp_path, mount / "root", tmp_path / "inductor-2", **MANAGER))
    assert all_correct(first) and first == second
    assert runs > 0 and assembler_runs(tmp_path / "ptxas") == runs
