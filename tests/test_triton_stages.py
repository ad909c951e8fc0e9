"""The back half of a Triton compile in the compile service's template (kcache.triton.stages): its
warm-up compiles through every stage and leaves the template as a template must be, one thread and its
own environment, so that its workers are forks of a process with nothing held."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the Triton tests need triton (pip install -e '.[test]')")

WARM_UP = """
import json, os, threading
before = dict(os.environ)
from kcache.triton import stages
stages.warm_up_template()
print(json.dumps({"threads": threading.active_count(), "tasks": len(os.listdir("/proc/self/task")),
                  "environment_kept": dict(os.environ) == before,
                  "ptx_versions_known": __import__("triton.backends.nvidia.compiler", fromlist=["x"])
                  .ptx_get_version.cache_info().currsize}))
"""


def test_the_warm_up_compiles_and_leaves_one_thread_and_the_environment_and_runs_no_assembler(
        tmp_path: Path) -> None:
    from stress.programs.triton_programs.assemblers import assembler_runs, counting_assemblers

    env = {**os.environ, **counting_assemblers(tmp_path)}  # the starter's TRITON_PTXAS_PATH, a counting one
    done = subprocess.run([sys.executable, "-c", WARM_UP], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    # ptx_get_version is asked as the llir stage makes the PTX: the warm-up went through its stages.
    assert found == {"threads": 1, "tasks": 1, "environment_kept": True, "ptx_versions_known": 1}, found
    assert assembler_runs(tmp_path) == 0  # no program of the user's ran in the template


def test_tritons_service_and_tilelangs_share_one_bound_of_compile_slots(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each service has a name of its own (its preload differs), but the slots that bound the compiles
    running at once are the user's: a slot Triton's service holds is one TileLang's cannot take."""
    from kcache.compile.compile_slots import CompileSlots
    from kcache.compile.pool.process_pool import TILELANG_PRELOAD
    from kcache.compile.service.address import identity
    from kcache.triton.isolation import TRITON_PRELOAD

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    tritons, tilelangs = identity(TRITON_PRELOAD, 1), identity(TILELANG_PRELOAD, 1)
    assert tritons != tilelangs
    held = CompileSlots(tritons, 1).try_take()
    try:
        assert held is not None and CompileSlots(tilelangs, 1).try_take() is None
    finally:
        assert held is not None
        held.release()
    assert CompileSlots(tilelangs, 1).held() == 0
