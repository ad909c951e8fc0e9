"""kcache.triton.key_ahead: under `kcache run` and `kcache.install()`, Triton's key of its installation
(`triton.runtime.cache.triton_key`, a hash of `libtriton.so`) is computed in a thread as the program
imports Triton, not in its first compile; its value is Triton's own; the thread imports nothing; a fork
while it hashes compiles; nothing starts where Triton is not imported, is keyed already, or is not
kcache's. (What it saves is seen in stress.bench.triton_tunes's floor row, on the GPU.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kcache.triton import key_ahead

from .helpers import child_env

# The program's report: whether the thread was there as `import triton` returned, Triton's memo after
# waiting for it (bounded), the modules that appeared meanwhile, and the key's value.
REPORT = """
import hashlib, json, sys, threading
def report(before):
    ahead = [thread for thread in threading.enumerate() if thread.name == "kcache-triton-key"]
    for thread in ahead:
        thread.join(120)
    cache = sys.modules.get("triton.runtime.cache")
    memo = cache.triton_key.cache_info().currsize if cache else None
    print("REPORT " + json.dumps({"thread": bool(ahead), "alive": any(t.is_alive() for t in ahead), "memo": memo,
                                  "imported": sorted(set(sys.modules) - before), "triton": "triton" in sys.modules,
                                  "key": hashlib.sha256(cache.triton_key().encode()).hexdigest() if cache else None}))
"""


def run(tmp_path: Path, body: str, *command: str, **env: str) -> dict:
    program = tmp_path / "program.py"
    program.write_text(REPORT + body)
    environment = child_env(KCACHE_DIR=str(tmp_path / "root"), **env)
    if "TRITON_CACHE_MANAGER" not in env:
        environment.pop("TRITON_CACHE_MANAGER", None)  # as a user's shell has it: unset
    done = subprocess.run([sys.executable, *command, str(program)], capture_output=True, text=True, env=environment,
                          cwd=str(tmp_path), timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("REPORT "):])


def plain_key() -> str:
    done = subprocess.run([sys.executable, "-c", "import hashlib, triton.runtime.cache as c; "
                           "print(hashlib.sha256(c.triton_key().encode()).hexdigest())"],
                          capture_output=True, text=True, cwd="/", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


IMPORTS_TRITON = "import triton\nbefore = set(sys.modules)\nreport(before)\n"


def test_kcache_run_computes_tritons_key_as_the_program_imports_triton_and_imports_nothing_for_it(
        tmp_path: Path) -> None:
    seen = run(tmp_path, IMPORTS_TRITON, "-m", "kcache", "run")
    assert seen["thread"] and seen["memo"] == 1, seen  # without kcache.triton.key_ahead: no thread, memo 0
    assert seen["imported"] == [], seen
    assert seen["key"] == plain_key()


def test_kcache_install_computes_it_too_unless_the_program_keyed_triton_already(tmp_path: Path) -> None:
    seen = run(tmp_path, "import kcache\nkcache.install()\n" + IMPORTS_TRITON)
    assert seen["thread"] and seen["memo"] == 1 and seen["imported"] == [], seen
    already = run(tmp_path, "import triton\ntriton.runtime.cache.triton_key()\nimport kcache\nkcache.install()\n"
                            "before = set(sys.modules)\nreport(before)\n")
    assert not already["thread"] and already["memo"] == 1, already


def test_nothing_starts_where_triton_is_not_imported_or_its_cache_manager_is_another(tmp_path: Path) -> None:
    never = run(tmp_path, "print('no Triton here')\nreport(set(sys.modules))\n", "-m", "kcache", "run")
    assert never == {**never, "thread": False, "triton": False}, never
    other = run(tmp_path, IMPORTS_TRITON, "-m", "kcache", "run",
                TRITON_CACHE_MANAGER="triton.runtime.cache:FileCacheManager")
    assert not other["thread"] and other["memo"] == 0, other


def test_a_fork_while_the_key_is_hashed_computes_the_same_key_in_the_child(tmp_path: Path) -> None:
    """The program forks right after `import triton`, while the thread hashes (asserted: it was alive);
    the child, which has no such thread, computes Triton's key itself, within a bounded wait."""
    body = """
import os, select, triton
ahead = [thread for thread in threading.enumerate() if thread.name == "kcache-triton-key"]
hashing = bool(ahead) and ahead[0].is_alive()
reader, writer = os.pipe()
child = os.fork()
if child == 0:
    os.close(reader)
    os.write(writer, hashlib.sha256(triton.runtime.cache.triton_key().encode()).hexdigest().encode())
    os._exit(0)
os.close(writer)
ready, _, _ = select.select([reader], [], [], 120)
child_key = os.read(reader, 100).decode() if ready else None
if child_key is None:  # hung: no process left behind
    os.kill(child, 9)
_, status = os.waitpid(child, 0)
print("CHILD " + json.dumps({"hashing_at_fork": hashing, "key": child_key, "status": status}))
report(set(sys.modules))
"""
    program = tmp_path / "program.py"
    program.write_text(REPORT + body)
    environment = child_env(KCACHE_DIR=str(tmp_path / "root"))
    environment.pop("TRITON_CACHE_MANAGER", None)
    done = subprocess.run([sys.executable, "-m", "kcache", "run", str(program)], capture_output=True, text=True,
                          env=environment, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    child = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("CHILD "))[len("CHILD "):])
    parent = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("REPORT "))[len("REPORT "):])
    assert child["hashing_at_fork"], "the fork came after the thread ended: nothing was tested"
    assert child["key"] == parent["key"] == plain_key() and child["status"] == 0, (child, parent)


def test_a_package_the_walk_would_import_leaves_the_key_to_the_first_compile(tmp_path: Path) -> None:
    """unloaded_packages names what triton_key's pkgutil walk would import: a package (a folder with an
    `__init__.py`) under its folders that is not loaded; loaded ones and plain folders are not named."""
    import triton  # noqa: F401 - triton.compiler and triton.language loaded

    for folder in ("compiler", "language", "language/zz_kcache_unloaded", "backends/plain_folder"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    for package in ("compiler", "language", "language/zz_kcache_unloaded"):
        (tmp_path / package / "__init__.py").write_text("")
    assert key_ahead.unloaded_packages(str(tmp_path)) == ["triton.language.zz_kcache_unloaded"]


def test_a_failure_to_start_never_fails_the_programs_import_of_triton(monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """What runs from the program's `import triton` catches its own errors: the key is then left to
    the first compile, with a debug line."""
    import logging

    def broken() -> None:
        raise OSError("a Triton folder that cannot be listed")

    monkeypatch.setattr(key_ahead, "start", broken)
    with caplog.at_level(logging.DEBUG, logger="kcache"):
        key_ahead._start_quietly()
    assert "left to its first compile: OSError" in caplog.text
