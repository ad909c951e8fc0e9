"""`kcache run` pays only for what the program uses (issue 58): TileLang's hooks are set when the program
imports TileLang, not before; Triton's manager and Helion's backend are environment variables. A program
that imports nothing loads no compiler, and a Triton-only program runs, through kcache, where TileLang
cannot be imported. (What it costs in time is measured by `python -m stress.bench --only run`, not here.)

Also: `python -m kcache` imports nothing from the working directory, even a folder named kcache there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import PROJECT, child_env

COMPILERS = ("tilelang", "tvm", "tvm_ffi", "triton", "helion", "torch")

# At exit (atexit, after the program's last line): what is loaded, and what kcache set for the program.
REPORT = """
import atexit, json, os, sys

def report():
    loaded = sorted({name.split(".")[0] for name in sys.modules} & set(%r))
    print("REPORT " + json.dumps({"compilers": loaded, "dropin": "kcache.dropin.installer" in sys.modules,
                                  "env": {name: os.environ.get(name) for name in
                                          ("KCACHE_TILELANG", "TRITON_CACHE_MANAGER", "HELION_REMOTE_CACHE_BACKEND")}}))

atexit.register(report)
""" % (COMPILERS,)


def run_program(tmp_path: Path, body: str, *kcache_options: str, **env: str) -> dict:
    program = tmp_path / "program.py"
    program.write_text(REPORT + body)
    environment = child_env(KCACHE_DIR=str(tmp_path / "root"), **env)
    for name in ("KCACHE_TILELANG", "TRITON_CACHE_MANAGER", "HELION_REMOTE_CACHE_BACKEND"):
        environment.pop(name, None)  # as a user's shell has them: unset
    done = subprocess.run([sys.executable, "-m", "kcache", *kcache_options, "run", str(program)], capture_output=True,
                          text=True, env=environment, cwd=str(tmp_path), timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("REPORT "):]) | {"stdout": done.stdout, "stderr": done.stderr}


@pytest.mark.parametrize("options", [(), ("--dir", "other-root")], ids=["fast-entry", "full-command-line"])
def test_a_program_that_imports_no_compiler_loads_none_and_gets_kcache_for_each(tmp_path: Path,
                                                                               options: tuple[str, ...]) -> None:
    seen = run_program(tmp_path, "print('the program ran')\n", *options)
    assert "the program ran" in seen["stdout"]
    assert seen["compilers"] == [] and seen["dropin"] is False, seen
    assert seen["env"] == {"KCACHE_TILELANG": "1", "TRITON_CACHE_MANAGER": "kcache_triton_manager:CacheManager",
                           "HELION_REMOTE_CACHE_BACKEND": "kcache.helion.Backend"}


TILELANG_PROGRAM = """
import importlib, sys
sys.path.insert(0, %r)
import kcache
assert not kcache.is_installed(), "installed before TileLang's import"
import tilelang
from kcache.dropin import routing
from stress.programs.kernels import CPU_TARGET, elementwise_add
assert kcache.is_installed() and importlib.import_module("tilelang.jit").cached is routing.cached
tilelang.compile(elementwise_add(), out_idx=[2], target=CPU_TARGET)
print("compiled")
""" % (str(PROJECT),)


@pytest.mark.tilelang
def test_a_program_that_imports_tilelang_gets_the_hooks_and_its_compile_goes_through_kcache(tmp_path: Path) -> None:
    seen = run_program(tmp_path, TILELANG_PROGRAM, TILELANG_CACHE_DIR=str(tmp_path / "tilelang-own"))
    assert "compiled" in seen["stdout"] and seen["dropin"] is True
    assert len(os.listdir(tmp_path / "root" / "kernels")) == 1  # the compile landed in kcache's root
    assert not (tmp_path / "tilelang-own").exists() or not any((tmp_path / "tilelang-own").rglob("*.so"))


def test_a_triton_program_runs_through_kcache_where_tilelang_cannot_be_imported(tmp_path: Path) -> None:
    pytest.importorskip("triton", reason="the Triton program needs triton (pip install -e '.[test]')")
    from stress.programs.triton_programs.assemblers import assembler_runs, counting_assemblers

    shadow = tmp_path / "no-tilelang" / "tilelang"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('TileLang cannot be imported here (the test says so)')\n")
    assemblers = tmp_path / "assemblers"
    assemblers.mkdir()
    env = child_env(**counting_assemblers(assemblers), KCACHE_DIR=str(tmp_path / "root"),
                    TRITON_CACHE_DIR=str(tmp_path / "plain"))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "no-tilelang"), env["PYTHONPATH"]])
    env.pop("TRITON_CACHE_MANAGER", None)
    check = subprocess.run([sys.executable, "-c", "import tilelang"], capture_output=True, text=True, env=env)
    assert check.returncode == 1 and "cannot be imported here" in check.stderr  # the shadow works
    outputs = []
    for _ in range(2):
        program = PROJECT / "stress" / "programs" / "triton_programs" / "compile.py"
        done = subprocess.run([sys.executable, "-m", "kcache", "run", str(program), "add"], capture_output=True,
                              text=True, env=env, cwd=str(tmp_path), timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(json.loads(done.stdout.splitlines()[-1]))
    assert assembler_runs(assemblers) == 1  # compiled once, then a hit
    assert outputs[0]["add"] == outputs[1]["add"]
    entries = [name for name in os.listdir(tmp_path / "root" / "triton") if not name.startswith(".")]
    assert len(entries) == 1 and not (tmp_path / "plain").exists()


SHOW_KCACHE = "import kcache; print('KCACHE', kcache.__file__, callable(kcache.install))\n"


@pytest.mark.parametrize("entry", ["python -m kcache", "console script"])
def test_a_folder_named_kcache_in_the_working_directory_shadows_nothing(tmp_path: Path, entry: str) -> None:
    """The clone's parent directory holds a folder `kcache` (the clone: no __init__.py, so a namespace
    package for any import that looks in the working directory first). kcache is found as an editable
    install finds it: by a finder after the path's, here one of the test's (setuptools' is the same)."""
    finder = tmp_path / "finder"
    finder.mkdir()
    (finder / "sitecustomize.py").write_text(
        "import sys\nfrom importlib.machinery import PathFinder\n\n"
        "class Editable:\n"
        "    @classmethod\n"
        "    def find_spec(cls, name, path=None, target=None):\n"
        f"        if name == 'kcache':\n"
        f"            return PathFinder.find_spec(name, [{str(PROJECT)!r}])\n"
        f"        if name.count('.') == 1 and name.startswith('kcache.'):  # as setuptools': a package's children\n"
        f"            return PathFinder.find_spec(name, [{str(PROJECT / 'kcache')!r}])\n"
        "        return None\n\n"
        "sys.meta_path.insert(sys.meta_path.index(PathFinder) + 1, Editable)\n")
    work = tmp_path / "work"
    (work / "kcache" / "kcache").mkdir(parents=True)  # the clone, seen from its parent
    program = tmp_path / "program.py"
    program.write_text(SHOW_KCACHE)
    script = tmp_path / "bin" / "kcache"
    script.parent.mkdir()
    script.write_text("import sys\nfrom kcache.cli.launch import main\nsys.exit(main())\n")  # as pip writes it
    command = [sys.executable, "-m", "kcache"] if entry == "python -m kcache" else [sys.executable, str(script)]
    env = {**os.environ, "PYTHONPATH": str(finder)}
    shadowed = subprocess.run([sys.executable, "-c", SHOW_KCACHE], capture_output=True, text=True, env=env, cwd=work)
    assert "has no attribute" in shadowed.stderr or "None" in shadowed.stdout  # the shadow is real for plain Python
    for argv in (["run", str(program)], ["--dir", str(tmp_path / "root"), "run", str(program)]):
        done = subprocess.run([*command, *argv], capture_output=True, text=True, env=env, cwd=work, timeout=120)
        assert done.returncode == 0 and done.stdout.splitlines() == [
            f"KCACHE {PROJECT / 'kcache' / '__init__.py'} True"], done.stderr[-2000:]
    version = subprocess.run([*command, "--version"], capture_output=True, text=True, env=env, cwd=work, timeout=120)
    assert version.returncode == 0 and f"from {PROJECT / 'kcache'}" in version.stdout, version.stderr[-2000:]
