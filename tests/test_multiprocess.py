"""Fresh interpreters behind a start barrier: one compile per key, and SIGKILLed writers.

Compiler runs are counted by an nvcc wrapper (stress.nvcc_counter), not by kcache.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")

from kcache.store.layout import StagingName  # noqa: E402
from stress.nvcc_counter import NvccCounter  # noqa: E402
from stress.procs import Barrier  # noqa: E402

from .helpers import expect_line, spawn  # noqa: E402

pytestmark = pytest.mark.tilelang

GET = """
import kcache, json
from stress.programs.kernels import CPU_TARGET, elementwise_add
cache = kcache.KernelCache({root!r})
kernel = cache.get_or_compile(elementwise_add(), CPU_TARGET, out_idx=[2])
print("result " + json.dumps(cache.stats()), flush=True)
"""


def entries(root: Path) -> list[str]:
    kernels = root / "kernels"
    return sorted(os.listdir(kernels)) if kernels.exists() else []


def result_of(proc) -> dict:
    import json

    out, err = proc.communicate(timeout=600)
    lines = [line for line in out.splitlines() if line.startswith("result ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{err[-3000:]}"
    return json.loads(lines[-1][len("result "):])


def test_a_herd_of_fresh_processes_compiles_once(cache_root: Path, tmp_path: Path) -> None:
    counter = NvccCounter(tmp_path)
    procs = 4
    barrier = Barrier("stress.worker", procs, ["--root", str(cache_root), "--kernels", "1"], env=counter.env())
    barrier.wait_ready()
    barrier.release()
    results = barrier.collect()
    for r in results:
        assert r.returncode == 0 and r.result and not r.result["errors"], r.stderr[-3000:]
    assert counter.count() == 1
    assert sum(r.result["stats"]["compiles"] for r in results) == 1
    assert sum(r.result["stats"]["disk_hits"] for r in results) == procs - 1
    assert len(entries(cache_root)) == 1


@pytest.mark.parametrize("where", ["publish", "compile"])
def test_a_writer_killed_mid_publish_or_mid_compile_leaves_nothing_partial(cache_root: Path, tmp_path: Path, where: str) -> None:
    counter = NvccCounter(tmp_path)
    if where == "publish":
        pause = """
from kcache.store.entries import EntryStore
def pause(step):
    if step == "manifest_written":
        print("paused", flush=True); sys.stdin.readline()
EntryStore.fault_hook = staticmethod(pause)
"""
    else:
        pause = """
from kcache.tilelang import backend as tilelang_backend
def pause(*args, **kwargs):
    print("paused", flush=True); sys.stdin.readline()
tilelang_backend.compile_kernel = pause  # in-process compiles
tilelang_backend.compile_entry = pause  # compiles in the pool
"""
    writer = spawn("import sys\n" + pause + GET.format(root=str(cache_root)), **counter.env())
    expect_line(writer, "paused")
    compiles_before_kill = counter.count()
    waiter = spawn('print("ready", flush=True)\n' + GET.format(root=str(cache_root)), **counter.env())
    expect_line(waiter, "ready")
    assert entries(cache_root) == []  # nothing is visible while the writer is stopped
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()

    stats = result_of(waiter)
    assert stats["compiles"] == 1
    assert counter.count() == compiles_before_kill + 1
    (key,) = entries(cache_root)
    from kcache.store.manifest import verify_entry
    from kcache.tilelang.backend import COMPONENTS

    verify_entry(cache_root / "kernels" / key, COMPONENTS)
    leftovers = [StagingName.parse(n) for n in os.listdir(cache_root / ".staging")]
    if where == "publish":
        assert [s.pid for s in leftovers] == [writer.pid]  # what the killed writer left behind
    import kcache

    kcache.KernelCache(cache_root).gc()
    assert os.listdir(cache_root / ".staging") == []
