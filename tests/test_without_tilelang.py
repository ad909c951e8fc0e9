"""Where TileLang is not installed (issue 37), as a new user's fresh venv: a real venv of Debian's Python
that holds kcache, the harness and their pure-Python dependencies, and no TileLang
(tests/unprivileged.build_venv), run with an environment of nothing but what each test gives it.

What needs TileLang says so in one line, with the fix, and exits non-zero; it starts nothing and leaves
nothing (no folder in its temporary directory, no process carrying its environment); opening a cache
starts no compile service, which could not compile anything there. The harness's synthetic mode, which
the hint names, runs there."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .leftovers import Scratch, processes_of
from .unprivileged import build_venv

INSTALL_TILELANG = "TileLang is not installed: pip install tilelang"


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    python = build_venv(tmp_path_factory.mktemp("bare"))
    found = subprocess.run([str(python), "-c", "import importlib.util; print(importlib.util.find_spec('tilelang'))"],
                           capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, check=True)
    assert found.stdout.strip() == "None"  # the venv is what it claims: no TileLang anywhere on its path
    yield python


def bare(python: Path, scratch: Scratch, *argv: str) -> subprocess.CompletedProcess[str]:
    """`python ARGV` in the bare venv, from a directory outside the project, with only: PATH, a HOME (and
    in it the default cache root) of the test's, the leftover mark, a temporary directory and a private
    runtime directory."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(scratch.path / "home"), **scratch.env,
           "TMPDIR": str(scratch.path / "tmp"), "XDG_RUNTIME_DIR": str(scratch.path / "run")}
    for directory in ("home", "tmp", "run"):
        (scratch.path / directory).mkdir(mode=0o700, exist_ok=True)
    return subprocess.run([str(python), *argv], capture_output=True, text=True, env=env, cwd=env["HOME"], timeout=300,
                          check=False)


def nothing_left(scratch: Scratch) -> None:
    """No process of the command's, no compile service's socket, nothing in its temporary directory."""
    assert processes_of(scratch) == []
    assert os.listdir(scratch.path / "tmp") == [] and not list((scratch.path / "run").rglob("*.sock"))


def test_the_stress_run_without_tilelang_names_the_fix_and_its_synthetic_mode(bare_python: Path,
                                                                            scratch: Scratch) -> None:
    done = bare(bare_python, scratch, "-m", "stress", "--duration", "5")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"stress: {INSTALL_TILELANG} (or `python -m stress --synthetic`: a fake "
                                        "compiler, the same load on kcache without TileLang)"]
    nothing_left(scratch)
    assert "--synthetic" in bare(bare_python, scratch, "-m", "stress", "--help").stdout
    # The mode the hint names works here, and leaves nothing either.
    synthetic = bare(bare_python, scratch, "-m", "stress", "--synthetic", "--procs", "2", "--duration", "2",
                     "--kill-rate", "0", "--corrupt-rate", "0", "--quiet")
    assert synthetic.returncode == 0 and "invariants: PASS" in synthetic.stdout, synthetic.stdout + synthetic.stderr
    nothing_left(scratch)


OPEN_AND_WAIT = """
import sys, threading, kcache
cache = kcache.KernelCache()
for thread in threading.enumerate():  # a warm-up of the compile service at open: given all its time
    if thread.name == "kcache-service-warm":
        thread.join()
print("opened", cache.settings.compile_isolation)
"""


def test_opening_a_cache_without_tilelang_starts_no_compile_service(bare_python: Path, scratch: Scratch) -> None:
    done = bare(bare_python, scratch, "-c", OPEN_AND_WAIT)
    assert done.returncode == 0 and done.stdout.split() == ["opened", "server"], done.stderr  # the default mode
    nothing_left(scratch)


NEEDS_TILELANG = """
import kcache
kcache.install()  # a Triton or Helion user's environment (issue 68): routes those two, no word of TileLang
print("installed into TileLang:", kcache.is_installed())
try:
    kcache.get_or_compile(None, "cuda")
except ModuleNotFoundError as err:  # what a caller catching the bare import's error still catches
    print(type(err).__name__, err.name, err, sep=": ")
"""


def test_the_api_and_the_cli_without_tilelang_say_how_to_install_it(bare_python: Path, scratch: Scratch) -> None:
    done = bare(bare_python, scratch, "-c", NEEDS_TILELANG)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines() == ["installed into TileLang: False", f"TileLangMissing: tilelang: {INSTALL_TILELANG}"]
    program, bundle = scratch.path / "home" / "program.py", scratch.path / "home" / "kernels.kcb"
    program.write_text("print('the program ran')\n")
    bundle.write_bytes(b"")
    # `kcache run` needs TileLang only for a program that imports it (issue 58): this one runs, and one
    # that imports TileLang gets Python's own error for it, from its own import line.
    ran = bare(bare_python, scratch, "-m", "kcache", "run", str(program))
    assert ran.returncode == 0 and ran.stdout == "the program ran\n" and ran.stderr == "", ran.stderr
    program.write_text("import tilelang\n")
    ran = bare(bare_python, scratch, "-m", "kcache", "run", str(program))
    assert ran.returncode == 1 and ran.stderr.splitlines()[-1] == "ModuleNotFoundError: No module named 'tilelang'"
    assert "program.py\", line 1" in ran.stderr, ran.stderr
    imported = bare(bare_python, scratch, "-m", "kcache", "import", str(bundle))
    assert imported.returncode == 2 and imported.stderr.splitlines() == [
        f"kcache: {INSTALL_TILELANG} (or skip the toolchain check: kcache import --any-toolchain, "
        "import_bundle(toolchain=None))"]
    # Its workers preload TileLang: it refuses, rather than say "running" and never start a worker.
    served = bare(bare_python, scratch, "-m", "kcache", "server", "start")
    assert served.returncode == 2 and served.stdout == "" and served.stderr.splitlines() == [
        f"kcache: {INSTALL_TILELANG} (the compile service compiles TileLang's kernels)"]
    nothing_left(scratch)
