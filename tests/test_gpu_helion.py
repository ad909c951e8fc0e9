"""On a GPU: Helion's autotune on kcache (issue 57). Each process is a fresh `python -m
stress.programs.helion_program` (a matmul, Helion's RandomSearch over 8 configs through its autotune cache);
compiles are counted by the runs of Triton's assemblers (counting wrappers), not by kcache.

- A second fresh process gets the pick from kcache and compiles nothing.
- 8 processes at once: one tune (Helion's own log line, counted), every pick equal, every result correct
  against torch, and one tune's compiles.
- A config whose compile aborts (Triton's stage hook): the session lives, its result correct.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("helion", reason="the Helion tests need helion (pip install -e '.[test]')")

from stress.procs import READY_WITHIN_S, line_within  # noqa: E402
from stress.programs.triton_programs.assemblers import assembler_runs, counting_assemblers  # noqa: E402

from .helpers import PROJECT, child_env  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible; run these on the GPU machine"),
]
KCACHE = {"HELION_REMOTE_CACHE_BACKEND": "kcache.helion.Backend", "HELION_AUTOTUNE_CACHE": "RemoteAutotuneCache",
          "TRITON_CACHE_MANAGER": "kcache.triton:CacheManager"}


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Counting assemblers, kcache's root, and Helion's own local cache (`extra` may name another)."""
    folder = tmp_path / "ptxas"
    folder.mkdir(exist_ok=True)
    return child_env(**{**counting_assemblers(folder), "KCACHE_DIR": str(tmp_path / "root"),
                        "HELION_CACHE_DIR": str(tmp_path / "helion-own"), "KT_FIRED": str(tmp_path / "fired"), **extra})


def start(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "stress.programs.helion_program"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(PROJECT))


def finish(process: subprocess.Popen[str]) -> dict:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[err.rfind("Traceback"):][:4000] if "Traceback" in err else err[-3000:]
    return json.loads(out.splitlines()[-1]) | {"stderr": err}


def test_a_second_process_gets_the_pick_and_compiles_nothing(tmp_path: Path) -> None:
    first = finish(start(env_for(tmp_path, **KCACHE)))
    assert first["correct"] and assembler_runs(tmp_path / "ptxas") >= 1
    before = assembler_runs(tmp_path / "ptxas")
    second = finish(start(env_for(tmp_path, **KCACHE, HELION_CACHE_DIR=str(tmp_path / "helion-own-2"))))
    assert second["correct"] and second["config"] == first["config"]
    assert assembler_runs(tmp_path / "ptxas") == before, "the second process compiled"
    print(f"helion: first process {first['ready_s']:.2f} s, second {second['ready_s']:.3f} s "
          f"({second['ready_s'] / first['ready_s']:.3f}x)")


def test_8_processes_at_once_run_one_tune_and_get_one_pick(tmp_path: Path) -> None:
    herd = [start({**env_for(tmp_path, **KCACHE, HELION_CACHE_DIR=str(tmp_path / f"own-{i}")), "KT_GATE": "1"})
            for i in range(8)]
    for process in herd:
        assert line_within(process, READY_WITHIN_S).strip() == "ready", process.stderr.read()
    for process in herd:
        process.stdin.write("go\n")
        process.stdin.flush()
    results = [finish(process) for process in herd]
    assert all(result["correct"] for result in results)
    assert len({result["config"] for result in results}) == 1
    tuned = sum("Starting autotuning process" in result["stderr"] for result in results)  # Helion's own line
    runs = assembler_runs(tmp_path / "ptxas")
    print(f"helion: herd of 8: {tuned} tune(s), {runs} compiles")
    assert tuned == 1, tuned
    # One tune's compiles: the 8 candidates and the accuracy baseline, each once (Helion's precompile
    # children publish into its throwaway directory, where its parent finds them), and the winner once more.
    assert runs <= 10, runs


def test_a_config_whose_compile_aborts_leaves_the_session_alive(tmp_path: Path) -> None:
    done = finish(start(env_for(tmp_path, **KCACHE, KT_ABORT="1")))
    assert done["correct"]
    assert (tmp_path / "fired").exists(), "the abort never fired: the test proves nothing"
    assert int((tmp_path / "fired").read_text()) != done["pid"]  # in a fork: Helion's, or kcache's
    (tmp_path / "plain").mkdir()
    plain = subprocess.run([sys.executable, "-m", "stress.programs.helion_program"], capture_output=True, text=True,
                           timeout=600, cwd=str(PROJECT), env=env_for(tmp_path / "plain", KT_ABORT="1"))
    print(f"helion: plain Helion with the aborting config exited {plain.returncode}")  # the control, reported
