"""kcache.triton.lone_files: a C module Triton builds alone (its driver's utilities, a kernel's launcher,
through `triton.runtime.build.compile_module_from_src`) is built once by processes that miss it together;
the builder's lock goes at its `put`, or when its build raised and Triton dropped the manager; a waiter
builds it itself past BUILD_WAIT_S. Builds counted by the C compiler Triton runs (a wrapper named by CC)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .helpers import child_env

SOURCE = r"""
#include <Python.h>
static PyObject* answer(PyObject* self, PyObject* args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kcache_lone_module", NULL, -1, methods};
PyMODINIT_FUNC PyInit_kcache_lone_module(void) { return PyModule_Create(&module); }
"""

# Builds the module through Triton, as its driver builds its own: the answer, and the error if any.
# KT_HOLD=1: a failed build's process stays alive (until a line on stdin) once past the error.
PROGRAM = r"""
import json, os, sys
from triton.runtime.build import compile_module_from_src
source = open(sys.argv[1]).read()
if os.environ.get("KT_GATE") == "1":
    print("ready", flush=True)
    sys.stdin.readline()
failed = False
try:
    print(json.dumps({"answer": compile_module_from_src(source, "kcache_lone_module").answer()}), flush=True)
except Exception as err:
    print(json.dumps({"error": type(err).__name__}), flush=True)
    failed = True
if failed and os.environ.get("KT_HOLD") == "1":  # the exception let go of, as a program does
    sys.stdin.readline()
"""


def counting_compiler(folder: Path, fail_first: bool = False) -> str:
    """A C compiler wrapper noting each build in `folder/builds`; `fail_first`: the first build fails."""
    wrapper = folder / "cc"
    failing = (f'if [ ! -e {folder}/failed ]; then touch {folder}/failed; echo "failed on purpose" >&2; exit 1; fi\n'
               if fail_first else "")
    wrapper.write_text(f"#!/bin/sh\necho $$ >> {folder}/builds\n{failing}exec gcc \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def builds(folder: Path) -> int:
    path = folder / "builds"
    return len(path.read_text().split()) if path.exists() else 0


def start(tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    (tmp_path / "module.c").write_text(SOURCE)
    (tmp_path / "program.py").write_text(PROGRAM)
    return subprocess.Popen([sys.executable, str(tmp_path / "program.py"), str(tmp_path / "module.c")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(tmp_path), env=child_env(TRITON_CACHE_MANAGER="kcache.triton:CacheManager",
                                                             KCACHE_DIR=str(tmp_path / "root"), **env))


def test_processes_missing_one_c_module_together_build_it_once(tmp_path: Path) -> None:
    cc = counting_compiler(tmp_path)
    processes = [start(tmp_path, CC=cc, KT_GATE="1") for _ in range(4)]
    try:
        for process in processes:  # every one ready, then all released at once
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        outputs = [process.communicate(timeout=300) for process in processes]
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=60)
    assert [json.loads(out.splitlines()[-1]) for out, _ in outputs] == [{"answer": 42}] * 4, outputs
    assert builds(tmp_path) == 1  # without the lock: one a process


def test_a_build_that_failed_lets_go_of_its_lock_while_its_process_lives(tmp_path: Path) -> None:
    """The first build fails (the compiler's exit status 1: Triton raises), its process stays alive; the
    next process takes the lock at once and builds (no warning of a wait of BUILD_WAIT_S)."""
    cc = counting_compiler(tmp_path, fail_first=True)
    started = [start(tmp_path, CC=cc, KT_HOLD="1")]
    try:
        assert started[0].stdout is not None
        assert "error" in json.loads(started[0].stdout.readline()), "the first build was meant to fail"
        started.append(start(tmp_path, CC=cc))
        out, err = started[1].communicate(timeout=300)
    finally:
        for process in started:
            process.kill()
            process.wait(timeout=60)
    assert json.loads(out.splitlines()[-1]) == {"answer": 42} and "building it here too" not in err, err[-2000:]
    assert builds(tmp_path) == 2


KEY = "A" * 52  # a Triton key: the base32 of a sha256


def test_a_waiter_builds_the_module_itself_past_the_build_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Two managers of one process, as two processes: the first misses and holds the module's lock (its
    build under way); the second, with BUILD_WAIT_S at 0.2 s, gives up waiting, with one warning, and
    holds nothing; the first's `put` publishes, and a third finds it."""
    from kcache.triton import lone_files, roots
    from kcache.triton.manager import CacheManager

    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "root"))
    monkeypatch.setattr(roots, "_roots", {})
    monkeypatch.setattr(lone_files, "BUILD_WAIT_S", 0.2)
    name = f"kcache_lone_module{lone_files.SUFFIX}"
    builder = CacheManager(KEY)
    assert builder.get_file(name) is None and builder._held.lock is not None  # a miss: this one builds
    seen: list[str | None] = []
    with caplog.at_level(logging.WARNING, logger="kcache"):
        waiter = threading.Thread(target=lambda: seen.append(CacheManager(KEY).get_file(name)))
        waiter.start()
        waiter.join(60)
    assert seen == [None] and "building it here too" in caplog.text
    builder.put(b"\x7fELF built", name)
    assert builder._held.lock is None
    found = CacheManager(KEY).get_file(name)
    assert found is not None and Path(found).read_bytes() == b"\x7fELF built"
