"""The project as a user gets it: a wheel, installed (not editable) into a fresh venv, runs the stress
harness and the benchmark from site-packages, with no source checkout on its path; without
redis-server the benchmark skips its remote rows with one line and still exits 0."""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
REMOTE_SKIPPED = "remote: skipped: redis-server not found on PATH (apt-get install redis-server)"

# Run by the venv's interpreter: where it imports the project from, and where a child started the way
# the harness starts its workers (stress.procs: worker_env, cwd) imports it from.
WHERE = """
import json, shutil, subprocess, sys, tempfile
import kcache, redis, stress
from stress.procs import PROJECT, worker_env
from stress.servers.redis import redis_server
child = subprocess.run(
    [sys.executable, "-c", "import json, kcache, stress.worker; print(json.dumps([kcache.__file__, stress.worker.__file__]))"],
    env=worker_env(), cwd=str(PROJECT), capture_output=True, text=True, check=True)
pong = None
if shutil.which("redis-server"):
    with redis_server(tempfile.mkdtemp()) as (url, _server):  # the remote scenario's fixture, installed
        pong = redis.Redis.from_url(url).ping()
print(json.dumps({"parent": [kcache.__file__, stress.__file__], "children": json.loads(child.stdout),
                  "pythonpath": worker_env().get("PYTHONPATH", ""), "redis": pong}))
"""
# An import of the test suite from the package (stress used to take its fixtures from tests/).
IMPORTS_TESTS = re.compile(r"^\s*(from|import)\s+tests\b", re.MULTILINE)


def run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(cwd), timeout=timeout, check=False)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def build_wheel(tmp_path: Path, env: dict[str, str]) -> Path:
    # From a copy of the working tree: an in-tree build would write build/ and *.egg-info into the
    # checkout and reuse build/lib, where modules since removed from the source would linger.
    source = tmp_path / "source"
    shutil.copytree(PROJECT, source, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".venv", ".gpu", ".*_cache", ".hypothesis", ".benchmarks"))
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(source)],
        env, tmp_path)
    (wheel,) = wheels.glob("kcache_gpu-*.whl")  # the distribution's name (pyproject.toml), not the import name
    return wheel


def without(env: dict[str, str], tool: str) -> dict[str, str]:
    """env with a PATH that leaves out every directory holding `tool`."""
    path = os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if d and not (Path(d) / tool).exists())
    assert shutil.which(tool, path=path) is None
    return {**env, "PATH": path}


def see_running_environment(venv: Path) -> None:
    """Where the tests themselves run in a venv (as most users run them), its packages too: a venv made
    from a venv's interpreter is made from the base interpreter, and --system-site-packages shows only
    the base's. A .pth in the new venv adds the running one's site directories after its own (its own
    copy of kcache still wins: the test checks that)."""
    if sys.prefix == sys.base_prefix:
        return
    (own,) = venv.glob("lib/python*/site-packages")
    lines = [f"import site; site.addsitedir({directory!r})" for directory in site.getsitepackages()]
    (own / "zz-running-venv.pth").write_text("\n".join(lines) + "\n")


@pytest.mark.tilelang  # the memory-hit scenario compiles a real kernel, with kcache and with TileLang
def test_the_installed_wheel_runs_the_stress_harness_and_the_benchmark(tmp_path: Path) -> None:
    pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    wheel = build_wheel(tmp_path, env)
    venv = tmp_path / "venv"
    # --system-site-packages: torch, TileLang and redis come from the interpreter running the tests
    # (which also has the project installed in editable mode: the venv's own copy must win).
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], env, tmp_path)
    see_running_environment(venv)
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q", str(wheel)], env, tmp_path)
    cwd = tmp_path / "cwd"  # outside the checkout: nothing is importable from the current directory
    cwd.mkdir()

    where = json.loads(run([python, "-c", WHERE], env, cwd).stdout)
    venv_dir = venv.resolve()
    for module_file in where["parent"] + where["children"]:
        assert Path(module_file).resolve().is_relative_to(venv_dir), (module_file, where)
    assert where["pythonpath"] == ""  # nothing added: the workers' interpreter finds its site-packages itself
    assert where["redis"] is (True if shutil.which("redis-server", path=env["PATH"]) else None)
    installed = Path(where["parent"][1]).parent
    assert not [f.name for f in installed.glob("*.py") if IMPORTS_TESTS.search(f.read_text())]

    summary_file = tmp_path / "summary.json"
    stress = run([python, "-m", "stress", "--synthetic", "--fresh", "--quiet", "--seed", "7", "--procs", "2",
                  "--duration", "10", "--kill-rate", "1", "--corrupt-rate", "2", "--json", str(summary_file)], env, cwd)
    summary = json.loads(summary_file.read_text())
    assert summary["invariants"]["pass"], stress.stdout[-3000:]
    assert summary["ops"] > 0 and summary["kills"] >= 1  # killed workers were restarted from the installed copy

    memory = run([python, "-m", "stress.bench", "--only", "memory"], env, cwd)
    assert [line for line in memory.stdout.splitlines() if line.startswith("memory hit ")], memory.stdout
    assert "skipped" not in memory.stdout

    remote = run([python, "-m", "stress.bench", "--only", "remote"], without(env, "redis-server"), cwd)
    assert remote.stdout.splitlines().count(REMOTE_SKIPPED) == 1, remote.stdout
    assert "remote (redis" not in remote.stdout and "Traceback" not in remote.stderr, remote.stdout + remote.stderr

    # The README's Usage example, from the installed wheel, as far as it runs without a GPU (it says so).
    example = readme_usage_example().split("\nimport torch")[0]
    root = tmp_path / "usage-root"
    script = cwd / "usage_example.py"  # a file: TileLang's @T.prim_func reads the function's source
    script.write_text(example + "\nprint('USAGE', type(kernel).__name__, kcache.__file__)\n")
    usage = run([python, str(script)], {**env, "KCACHE_DIR": str(root)}, cwd)
    (line,) = [line for line in usage.stdout.splitlines() if line.startswith("USAGE ")]
    _, kind, module_file = line.split(" ", 2)
    assert kind == "JITKernel" and Path(module_file).resolve().is_relative_to(venv_dir), line
    assert len(list((root / "kernels").iterdir())) == 1  # compiled once, into the root it named
    shown = run([python, "-m", "pip", "show", "kcache-gpu"], env, cwd).stdout  # the distribution's name
    assert "Name: kcache-gpu" in shown and f"Location: {venv_dir}" in shown, shown


def readme_usage_example() -> str:
    """The Python block under the README's "## Usage"."""
    text = (PROJECT / "README.md").read_text()
    section = text.split("\n## Usage\n", 1)[1]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0]
