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


def test_a_worker_forked_from_tritons_template_collects_none_of_the_templates_objects(runtime: Path) -> None:
    """The template freezes what it made out of the collector before it forks (gc.freeze): a worker's
    collection would otherwise walk the template's whole heap (Triton's modules, the warm-up's
    compiler state), copying each page it touches."""
    import gc

    from kcache.compile.pool.process_pool import CompilePool
    from kcache.compile.service import client
    from kcache.compile.service import connection as service_connection
    from kcache.triton.isolation import TRITON_PRELOAD

    own = CompilePool(1, None, preload=())
    pool = client.ServicePool(1, None, TRITON_PRELOAD, 60.0, lambda: own)
    try:
        pool.warm(1, wait=True)
        template = service_connection.request(pool.name, ("status",))["template_pid"]
        assert template is not None
        frozen = pool.run(gc.get_freeze_count, name="freeze count", timeout_s=60)
        parent = pool.run(os.getppid, name="its parent", timeout_s=60)
        assert parent == template  # a fork of the template ran it
        assert frozen > 10_000, frozen  # Triton's objects, not the handful a worker makes
    finally:
        pool.close()
        own.close()



def test_a_wait_for_a_compile_slot_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`CompileSlots.take` waits at most its timeout while every slot is held, then answers None; a
    free slot it takes at once."""
    import time

    from kcache.compile.compile_slots import CompileSlots

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    held = CompileSlots("elsewhere", 1).try_take()
    assert held is not None
    started = time.monotonic()
    assert CompileSlots("waiting", 1).take(0.3) is None
    assert 0.3 <= time.monotonic() - started < 5
    held.release()
    taken = CompileSlots("waiting", 1).take(0.3)
    assert taken is not None
    taken.release()

# A single-threaded program whose stages hook holds a lock: cloudpickle cannot carry it to a worker, so
# each compile's back half runs in a fork of the program (kcache.triton.isolation).
HOOK_STAYS = """
import threading
import triton
from triton import knobs
from triton.compiler import ASTSource
from stress.programs.triton_programs.compile import KERNELS, TARGET

guard = threading.Lock()

def hook(self=None, stages=None, options=None, language=None, capability=None):
    if self is None and stages is None:
        return "", ""
    with guard:
        pass

knobs.runtime.add_stages_inspection_hook = hook
fn, signature, constexprs = KERNELS["add"]
triton.compile(ASTSource(fn, signature, constexprs), target=TARGET)
print("compiled", flush=True)
"""


def test_a_fork_for_a_hook_that_cannot_travel_waits_for_a_compile_slot(tmp_path: Path, runtime: Path) -> None:
    """The fork that compiles for a stages hook of the program's counts against the machine's bound as
    the service's workers do: with the one slot held elsewhere, it waits, and compiles once it is free."""
    import selectors

    from kcache.compile.compile_slots import CompileSlots
    from stress.programs.triton_programs.assemblers import assembler_runs, counting_assemblers

    from .helpers import PROJECT
    from .test_triton import MANAGER, program_env

    counting_assemblers(tmp_path)
    env = program_env(tmp_path, tmp_path / "root", KCACHE_LOG="debug", KCACHE_COMPILE_WORKERS="1", **MANAGER)
    held = CompileSlots("elsewhere", 1).try_take()
    assert held is not None
    program = subprocess.Popen([sys.executable, "-c", HOOK_STAYS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, cwd=str(PROJECT))
    try:
        waiting, seen = "waits for one", ""
        with selectors.DefaultSelector() as selector:  # its log, line by line, until it says it waits
            selector.register(program.stderr, selectors.EVENT_READ)  # type: ignore[arg-type]
            while waiting not in seen and selector.select(timeout=120) and program.poll() is None:
                seen += program.stderr.readline()  # type: ignore[union-attr]
        assert waiting in seen, seen[-3000:]
        assert assembler_runs(tmp_path) == 0  # the slot is held elsewhere: nothing assembled yet
    finally:
        held.release()
    out, err = program.communicate(timeout=300)
    assert program.returncode == 0 and out.strip() == "compiled", err[-3000:]
    assert assembler_runs(tmp_path) == 1


def test_what_crosses_between_caller_and_worker_is_checked_where_it_arrives() -> None:
    """The IR is checked by the worker before it is parsed, the group's files by the caller before it
    publishes them, each against the sha256 its sender made (kcache.triton.stages)."""
    import hashlib

    from kcache.triton.stage_output import StageOutput
    from kcache.triton.stages import ArrivedChanged, StagesJob, StagesResult, run_stages

    sent = "module { tt.func public @k() { tt.return } }"
    job = StagesJob(source=sent + " ", ext="ttir", language=None, file_name="k", target=None, options=None,
                    metadata={}, environ={}, knobs={}, store_only_binary=False,
                    source_sha256=hashlib.sha256(sent.encode()).hexdigest())
    with pytest.raises(ArrivedChanged, match="the IR of k arrived at its worker changed"):
        run_stages(job)
    made = {"k.cubin": b"\x7fELF made", "k.json": b"{}"}
    sums = {name: hashlib.sha256(data).hexdigest() for name, data in made.items()}
    assert StagesResult(made, sums, StageOutput()).verified_files() == made
    with pytest.raises(ArrivedChanged, match="k.cubin arrived from its worker changed"):
        StagesResult({**made, "k.cubin": b"\x7fELF else"}, sums, StageOutput()).verified_files()
    with pytest.raises(ArrivedChanged, match="k.ptx"):  # a file the worker did not make
        StagesResult({**made, "k.ptx": b"//"}, sums, StageOutput()).verified_files()
