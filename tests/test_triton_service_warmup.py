"""The compile service warmed at a process's first miss of a lone Triton file (kcache.triton.isolation's
`warm_service_soon`, issue 67): Triton's driver builds its utilities module at the first launch, before
any compile, and the service's start then overlaps what the program does until its first tune. A fresh
process whose lone files all hit starts no service."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the Triton tests need triton (pip install -e '.[test]')")

from stress.service_runtime import service_pids  # noqa: E402

from .helpers import PROJECT, child_env  # noqa: E402

PROGRAM = """
import json, threading
from triton.runtime.cache import get_cache_manager
from kcache.compile.fork.caller_fork import SERVICE_WARM_THREAD
from kcache.triton import isolation

KEY = "0" * 64  # a module's key, as Triton's build names it (a sha256)

def warming():
    return [thread for thread in threading.enumerate() if thread.name == SERVICE_WARM_THREAD]

seen = {}
if get_cache_manager(KEY).get_file("utils.so") is None:  # a miss: Triton builds it and saves it
    get_cache_manager(KEY).put(b"a module", "utils.so", binary=True)
seen["after_miss"] = len(warming())
for thread in warming():
    thread.join(120)
pool = isolation._compile_pool() if seen["after_miss"] else None  # the warm-up's, made by the miss
seen["server_pid"] = pool.server_pid if getattr(pool, "_conn", None) is not None else None
print(json.dumps(seen))
"""

HIT = """
import json, threading
from triton.runtime.cache import get_cache_manager
from kcache.compile.fork.caller_fork import SERVICE_WARM_THREAD

found = get_cache_manager("0" * 64).get_file("utils.so")
print(json.dumps({"found": found is not None,
                  "warming": [t.name for t in threading.enumerate() if t.name == SERVICE_WARM_THREAD]}))
"""


def run(code: str, root: Path, runtime: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(PROJECT), timeout=300,
                          env=child_env(KCACHE_DIR=str(root), TRITON_CACHE_MANAGER="kcache.triton:CacheManager",
                                        XDG_RUNTIME_DIR=str(runtime), KCACHE_LOG="debug"))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_lone_files_miss_starts_the_compile_service_and_a_hit_starts_none(tmp_path: Path, runtime: Path) -> None:
    missed = run(PROGRAM, tmp_path / "root", runtime)
    assert missed["after_miss"] == 1  # the warm-up's thread, started by the miss, before any compile
    assert missed["server_pid"] in service_pids(runtime)  # the service it reached: started, listening
    from stress.service_runtime import stop_services

    stop_services(runtime)
    assert service_pids(runtime) == []
    hit = run(HIT, tmp_path / "root", runtime)
    assert hit == {"found": True, "warming": []}
    assert service_pids(runtime) == []  # nothing started by a process that only hit


def test_no_warm_up_where_tritons_compiles_stay_in_the_process(tmp_path: Path, runtime: Path) -> None:
    for name, setting in (("off", {"KCACHE_TRITON_ISOLATION": "off"}), ("pool", {"KCACHE_COMPILE_ISOLATION": "pool"})):
        done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, cwd=str(PROJECT),
                              timeout=300, env=child_env(KCACHE_DIR=str(tmp_path / name), XDG_RUNTIME_DIR=str(runtime),
                                                         TRITON_CACHE_MANAGER="kcache.triton:CacheManager", **setting))
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.splitlines()[-1]) == {"after_miss": 0, "server_pid": None}, setting
        assert (tmp_path / name).is_dir()  # it missed, and saved the module there
    assert service_pids(runtime) == []
