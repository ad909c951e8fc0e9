"""The isolated compile is the caller's compile: what crosses a process arrives equal (or is not
compiled), the caller's code runs in the caller, nothing passes between the service's clients, and
kcache's own interpreters import nothing from the working directory."""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kcache.compile.pool.process_pool import CompilePool
from stress.service_runtime import service_pids

from . import pool_jobs
from .helpers import PROJECT, child_env

SWIZZLED_MATMUL = '''
import tilelang
import tilelang.language as T
from tilelang.layout import make_swizzled_layout


def swizzled_matmul(M=1024, N=1024, K=1024, bm=128, bn=128, bk=64, stages=3):
    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, bn), "float16")
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.annotate_layout({A_s: make_swizzled_layout(A_s), B_s: make_swizzled_layout(B_s)})
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, bx * bn])

    return main
'''
TARGET = {"kind": "cuda", "arch": "sm_90a"}


@pytest.fixture(scope="module")
def kernels_module(tmp_path_factory: pytest.TempPathFactory) -> object:
    """The swizzled matmul's module (TileLang parses a prim_func's source: it must be a real file)."""
    directory = tmp_path_factory.mktemp("kernels")
    (directory / "swizzled_kernels.py").write_text(SWIZZLED_MATMUL)
    sys.path.insert(0, str(directory))
    try:
        import swizzled_kernels

        yield swizzled_kernels
    finally:
        sys.path.remove(str(directory))


# ---------------------------------------------------------------- the transfer, directly


def test_tvms_own_pickle_breaks_a_swizzled_layout_and_the_transfer_restores_it(kernels_module) -> None:
    """The fault the transfer exists for, shown first: TVM's round trip is not structurally equal (its
    layouts lost TileLang's placeholders); kcache's packed copy is, and its fingerprint matches."""
    import tvm

    from kcache.tilelang import transfer

    func = kernels_module.swizzled_matmul()
    broken = pickle.loads(pickle.dumps(func))
    assert not tvm.ir.structural_equal(func, broken)  # the fault fired
    assert transfer.fingerprint(broken) != transfer.fingerprint(func)  # and the fingerprint sees it
    packed, why = transfer.pack(func, "main")
    assert packed is not None, why
    arrived = transfer.unpack(pickle.loads(pickle.dumps(packed)))
    assert tvm.ir.structural_equal(func, arrived)


def test_layouts_and_fragments_each_survive_the_transfer() -> None:
    """Each serialization risk on its own: a custom Layout, a Fragment with and without replication."""
    import tvm
    from tilelang.layout import Fragment, Layout

    from kcache.tilelang import transfer

    objects = [
        Layout([16, 32], lambda i, j: (j // 8, i * 8 + j % 8)),
        Fragment([16, 16], forward_thread_fn=lambda i, j: i * 2 + j % 2, forward_index_fn=lambda i, j: j // 2),
        Fragment([16, 16], forward_thread_fn=lambda i, j, rep: rep * 32 + i * 2 + j % 2, replicate=2),
    ]
    for original in objects:
        broken = pickle.loads(pickle.dumps(original))
        assert repr(broken) != repr(original)  # TVM's pickle alone loses its placeholders
        restored = transfer._restore_layout(broken)
        assert tvm.ir.structural_equal(original, restored), repr(original)
        assert repr(restored) == repr(original)


def test_a_fingerprint_that_differs_on_arrival_is_never_compiled(kernels_module) -> None:
    from kcache.tilelang import transfer

    packed, _ = transfer.pack(kernels_module.swizzled_matmul(), "main")
    forged = transfer.PackedFunc(packed.payload, "0" * 64, "main")
    with pytest.raises(transfer.TransferMismatch, match="main"):
        transfer.unpack(forged)


def _compile_in(mode: str, root: Path, func: object, caplog: pytest.LogCaptureFixture,
                monkeypatch: pytest.MonkeyPatch) -> object:
    import kcache
    from kcache.compile.pool import shared_pools as pool

    monkeypatch.setenv("KCACHE_COMPILE_ISOLATION", mode)
    try:
        with caplog.at_level(logging.WARNING, logger="kcache"):
            return kcache.KernelCache(root).get_or_compile(func, TARGET, out_idx=[2])
    finally:
        # The process's shared pool (pool mode) leaves its threads behind, and a later test's caller
        # would not fork beside them (caller_fork.unsafe_reason): close it.
        for shared in list(pool._shared.values()):
            shared.close()
        pool._shared.clear()


@pytest.mark.tilelang
@pytest.mark.parametrize(("mode", "where"), [("server", "in a fork of this process"), ("pool", "in this process")])
def test_a_mismatch_on_arrival_is_compiled_unserialized_with_one_warning(
        kernels_module, mode: str, where: str, runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The caller's fingerprint is forged (the worker, a process of its own, computes the true one):
    the worker refuses the job, and the caller compiles its own object with one warning that names
    the kernel: in a fork of itself, or in itself where another thread runs (the pool's threads)."""
    from kcache.tilelang import compile_lanes, transfer

    real_pack = transfer.pack
    real_unserialized = compile_lanes.compile_unserialized
    refused: list[str] = []

    def forged_pack(func: object, name: str) -> tuple[object, str]:
        packed, why = real_pack(func, name)
        return transfer.PackedFunc(packed.payload, "f" * 64, name), why

    def counted_unserialized(*args: object, **kwargs: object) -> None:
        refused.append(args[3])
        real_unserialized(*args, **kwargs)

    monkeypatch.setattr(transfer, "pack", forged_pack)
    monkeypatch.setattr(compile_lanes, "compile_unserialized", counted_unserialized)
    monkeypatch.setattr(compile_lanes, "_warned", set())  # one warning per kernel and process
    kernel = _compile_in(mode, tmp_path / "root", kernels_module.swizzled_matmul(), caplog, monkeypatch)
    assert len(refused) == 1 and "fingerprint" in refused[0]  # the worker refused it: the fault fired
    warnings = [r.getMessage() for r in caplog.records if "cannot be sent to a compile worker exactly" in r.getMessage()]
    assert len(warnings) == 1 and "'main'" in warnings[0] and f"compiling it {where}" in warnings[0], warnings
    assert "wgmma" in kernel.get_kernel_source() or "gemm" in kernel.get_kernel_source()


# ---------------------------------------------------------------- nothing passes between jobs


def test_a_service_job_sees_nothing_an_earlier_job_left(runtime: Path) -> None:
    from kcache.compile.service.client import ServicePool

    with ServicePool(1, None, ("tests.pool_jobs",), 60.0, lambda: CompilePool(1, preload=("tests.pool_jobs",))) as pool:
        assert pool.run(pool_jobs.remember, "a secret of client A") == 1
        assert pool.run(pool_jobs.what_was_left_behind) == ([], False)
        assert pool.run(pool_jobs.what_was_left_behind) == ([], False)


TWO_PROJECTS_PROGRAM = '''
import os, sys
sys.path.insert(0, {kernels!r})
import kcache
import tilelang
from tilelang.engine import callback
import cbmod
from swizzled_kernels import swizzled_matmul

callback.register_cuda_postproc_callback(cbmod.edit)
kernel = kcache.get_or_compile(swizzled_matmul(), {{"kind": "cuda", "arch": "sm_90a"}}, out_idx=[2])
source = kernel.get_kernel_source()
print("marks", sorted(m for m in ("project A", "project B") if m in source))
'''


@pytest.mark.tilelang
def test_two_projects_sharing_the_service_each_get_their_own_edit(kernels_module, runtime: Path,
                                                                    tmp_path: Path) -> None:
    """Each registers a callback from a module named alike (cbmod.py, in its own directory), and the
    same service compiles both: each kernel carries its own project's edit."""
    kernels_dir = str(Path(kernels_module.__file__).parent)
    outputs, servers = {}, set()
    for project in ("A", "B"):
        home = tmp_path / f"project-{project}"
        home.mkdir()
        (home / "cbmod.py").write_text(f"def edit(code, target):\n    return code + '\\n// project {project}\\n'\n")
        (home / "prog.py").write_text(TWO_PROJECTS_PROGRAM.format(kernels=kernels_dir))
        done = subprocess.run([sys.executable, "prog.py"], cwd=home, capture_output=True, text=True, timeout=600,
                              env=child_env(KCACHE_DIR=str(tmp_path / "shared-root"), KCACHE_CALLER_FORK="0"))
        assert done.returncode == 0, done.stderr[-3000:]
        # The service compiled it, and kcache stored it: not the caller's own compile that an opaque
        # callback gets (which TileLang's log lines, printed in the caller, would show).
        assert "kcache:" not in done.stderr, done.stderr[-3000:]
        assert "TileLang begins to compile" not in done.stdout, done.stdout[-3000:]
        outputs[project] = done.stdout.strip().splitlines()[-1]
        servers.update(service_pids(runtime))
    assert outputs == {"A": "marks ['project A']", "B": "marks ['project B']"}
    assert len(servers) == 1, servers  # one service compiled both
    assert len(os.listdir(tmp_path / "shared-root" / "kernels")) == 2


# ---------------------------------------------------------------- interpreters and the working directory

PLANTED = "import os\nopen(os.environ['PLANTED_MARKER'], 'a').write(__name__ + ' ' + str(os.getpid()) + '\\n')\n"
PLANTED_NAMES = ("json", "signal", "argparse", "kcache")


@pytest.mark.tilelang
def test_no_interpreter_kcache_starts_imports_from_the_working_directory(runtime: Path, tmp_path: Path) -> None:
    """A json.py, signal.py, argparse.py and a kcache/ planted where the program runs: the compile
    service, its template and workers, the process's pool, `kcache server start`, `kcache run` and
    `kcache import`'s stagers import none of them."""
    planted = tmp_path / "shared-scratch"
    planted.mkdir()
    for name in PLANTED_NAMES[:3]:
        (planted / f"{name}.py").write_text(PLANTED)
    (planted / "kcache").mkdir()
    (planted / "kcache" / "__init__.py").write_text(PLANTED)
    marker = tmp_path / "imported-from-the-working-directory"
    env = child_env(PLANTED_MARKER=str(marker), KCACHE_DIR=str(tmp_path / "root"), KCACHE_CALLER_FORK="0")

    # The planted modules work: an interpreter that does put the working directory first imports them.
    subprocess.run([sys.executable, "-c", "import json"], cwd=planted, env=env, check=True)
    assert marker.read_text().startswith("json ")
    marker.unlink()

    program = tmp_path / "program" / "prog.py"
    program.parent.mkdir()
    program.write_text(textwrap.dedent('''
        import argparse, json, signal, sys
        import kcache
        sys.path.insert(0, %r)
        from stress.programs.kernels import elementwise_add
        sys.path[:0] = ["", "."]  # the working directory on the path, as a notebook or a setup script puts it
        kcache.get_or_compile(elementwise_add(), {"kind": "cuda", "arch": "sm_90a"}, out_idx=[2])
        print("compiled", kcache.default_cache().stats()["compiles"])
    ''' % str(PROJECT)))
    # The console script (a script's own directory is first on its path, never the working
    # directory); where it is not installed (the GPU machine runs from a checkout), `python -P -m`,
    # which is the same as far as the working directory goes.
    script = shutil.which("kcache", path=str(Path(sys.executable).parent)) or shutil.which("kcache")
    assert script or sys.version_info >= (3, 11), "the kcache console script is not installed"
    kcache_command = [script] if script else [sys.executable, "-P", "-m", "kcache"]
    runs = {
        "server mode": [sys.executable, str(program)],
        "pool mode": [sys.executable, str(program)],
        "kcache server start": [*kcache_command, "server", "start"],
        "kcache run": [*kcache_command, "run", str(program)],
    }
    for what, command in runs.items():
        run_env = {**env, "KCACHE_COMPILE_ISOLATION": "pool" if what == "pool mode" else "server",
                   "KCACHE_DIR": str(tmp_path / f"root-{what.replace(' ', '-')}")}
        done = subprocess.run(command, cwd=planted, env=run_env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (what, done.stderr[-3000:])
        if what != "kcache server start":
            assert "compiled 1" in done.stdout, (what, done.stdout, done.stderr[-2000:])
    bundle = tmp_path / "kernels.kcb"
    root = tmp_path / "root-server-mode"
    env["KCACHE_BUNDLE_SECRET"] = "a secret of the test's"
    subprocess.run([*kcache_command, "--dir", str(root), "export", str(bundle)], cwd=planted, env=env, check=True,
                   capture_output=True)
    done = subprocess.run([*kcache_command, "--dir", str(tmp_path / "imported"), "import", str(bundle)], cwd=planted,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1" in done.stdout + done.stderr  # one entry imported, through the stagers
    assert not marker.exists(), marker.read_text()
