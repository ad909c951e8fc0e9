"""The worker template lowers one small kernel before it forks workers (kcache/tilelang/warm_up.py):
it runs before the template is ready, under the fork-safe environment, leaves the template able to
fork, and changes no kernel's source."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kcache.compile.service import client
from kcache.compile.service import connection as service_connection
from kcache.compile.workers.template_process import WorkerTemplate
from kcache.compile.workers.worker_process import anonymous_append_file

from .helpers import PROJECT


def test_the_template_runs_its_preloads_warm_up_before_it_is_ready_with_cuda_hidden(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    mark = tmp_path / "warmed.json"
    monkeypatch.setenv("KCACHE_TEST_WARM_UP_MARK", str(mark))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the caller's value: hidden while the template imports and warms up
    stderr = anonymous_append_file()
    template = WorkerTemplate(("tests.warm_up_hook",), 60.0, stderr)
    os.close(stderr)
    try:
        template.wait_ready()
        assert json.loads(mark.read_text()) == {"pid": template.pid, "cuda_visible_devices": ""}
        assert len(template.threads or []) == 1
    finally:
        template.close()


def test_the_services_template_is_warmed_by_tilelang_and_still_forks_its_workers(runtime: Path) -> None:
    """The real warm-up (TILELANG_PRELOAD's `warm_up_template`) starts no thread: the service's
    template still forks (a template holding threads would start workers by exec)."""
    from kcache.compile.pool.process_pool import TILELANG_PRELOAD, CompilePool
    from kcache.tilelang import compiler

    assert callable(compiler.warm_up_template)
    own = CompilePool(1, None, preload=())
    pool = client.ServicePool(1, None, TILELANG_PRELOAD, 60.0, lambda: own)
    try:
        pool.warm(1, wait=True)
        status = service_connection.request(pool.name, ("status",))
        assert status["template_pid"] is not None, status
        assert not own.worker_pids()
    finally:
        pool.close()
        own.close()


def lowered(*args: str) -> dict:
    """tests/warm_up_driver.py's output in a fresh process; PYTHONHASHSEED fixed: lowerings follow it."""
    done = subprocess.run([sys.executable, "-m", "tests.warm_up_driver", *args], cwd=PROJECT, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHONHASHSEED": "0"}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_warm_up_lowers_on_this_tilelang_and_changes_no_kernels_source() -> None:
    """Every prim_func kernel of the corpus lowered to device and host source in a fresh process, and
    in one that ran the warm-up first: the same text, or, for a kernel whose text TileLang itself
    varies from compile to compile (the MLA decode's workspaces swap names, tests/test_corpus.py), one
    that fresh processes of plain TileLang give too. The warm-up itself must succeed here, or the
    service's workers would silently start cold."""
    with ThreadPoolExecutor(2) as both:
        fresh, warmed = both.map(lambda args: lowered(*args), [(), ("--warm",)])
    assert warmed["warmed_s"] is not None
    assert len(fresh["digests"]) >= 40 and fresh["digests"].keys() == warmed["digests"].keys()
    plain = {name: set(digests) for name, digests in fresh["digests"].items()}
    differing = sorted(name for name, digests in warmed["digests"].items() if not set(digests) <= plain[name])
    for _ in range(4):  # fresh processes again, 6 lowerings each, until plain TileLang gave the warmed text
        if not differing:
            break
        with ThreadPoolExecutor(2) as both:
            for again in both.map(lambda _: lowered("--only", ",".join(differing), "--times", "6"), range(2)):
                for name, digests in again["digests"].items():
                    plain[name] |= set(digests)
        differing = [name for name in differing if not set(warmed["digests"][name]) <= plain[name]]
    assert not differing, f"the warm-up changed these kernels' source: {differing}"
