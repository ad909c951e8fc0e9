"""A Triton or Helion user's environment (issue 68): `pip install 'kcache-gpu[triton]'` brings no TileLang,
and every way into kcache works there: `import kcache`, `kcache --help` and `kcache run --help` (which
name all three compilers), `kcache.install()`, `kcache run`, Triton's cache manager by its variable, Helion's
backend, and `kcache doctor`, which finds no problem in TileLang's absence.

The environment is a venv of the running interpreter whose site directory is a view of the running
one's, every entry but TileLang's (its package, its metadata, TVM's) linked: what pip leaves where
TileLang was never installed. kcache comes from the checkout (PYTHONPATH)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import PROJECT

pytest.importorskip("triton", reason="the Triton user's program needs triton (pip install -e '.[test]')")

# What a TileLang install brings, and what must not come from the running environment (its kcache).
HIDDEN = ("tilelang", "tvm", "apache_tvm_ffi", "__editable__", "kcache", "__pycache__")
TRITON_PROGRAM = str(PROJECT / "stress" / "programs" / "triton_programs" / "compile.py")


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("no-tilelang")
    view = base / "site"
    view.mkdir()
    for directory in [Path(entry) for entry in sys.path if entry.endswith("site-packages") and Path(entry).is_dir()]:
        for name in sorted(os.listdir(directory)):
            # .pth files are left out: one of them is the running environment's editable kcache.
            if name.lower().startswith(HIDDEN) or name.endswith(".pth") or (view / name).exists():
                continue
            (view / name).symlink_to(directory / name)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], check=True)
    (site_packages,) = (base / "venv").glob("lib/python*/site-packages")
    (site_packages / "view.pth").write_text(f"{view}\n")
    interpreter = base / "venv" / "bin" / "python"
    found = run(interpreter, base, "-c", "import importlib.util as u, importlib.metadata as m, kcache\n"
                "try:\n    m.version('tilelang')\nexcept m.PackageNotFoundError:\n    print(u.find_spec('tilelang'), "
                "u.find_spec('triton') is not None, kcache.__file__)")
    # The venv is what it claims: no TileLang, not even its metadata; Triton; the checkout's kcache.
    assert found.stdout.split() == ["None", "True", str(PROJECT / "kcache" / "__init__.py")], found
    return interpreter


def run(interpreter: Path, cwd: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith(("KCACHE_", "TRITON_", "HELION_", "PYTHON"))}
    environment.update(PYTHONPATH=str(PROJECT), **env)
    return subprocess.run([str(interpreter), *argv], capture_output=True, text=True, env=environment, cwd=cwd,
                          timeout=300, check=False)


def triton_entries(root: Path) -> list[str]:
    return [name for name in os.listdir(root / "triton") if not name.startswith(".")] if (root / "triton").is_dir() else []


def test_the_help_names_all_three_compilers(python: Path, tmp_path: Path) -> None:
    for argv in (["--help"], ["run", "--help"]):
        done = run(python, tmp_path, "-m", "kcache", *argv)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        head = done.stdout.split("positional arguments:")[0]  # the usage and the description
        assert all(name in head for name in ("TileLang", "Triton", "Helion")), head


INSTALL = """
import json, os, sys
import kcache
kcache.install()
chosen = {name: os.environ.get(name) for name in ("TRITON_CACHE_MANAGER", "HELION_REMOTE_CACHE_BACKEND")}
import kcache.helion
kcache.helion.Backend  # Helion's backend imports without TileLang
sys.argv = ["triton_program", "add"]
import runpy
runpy.run_path(%r, run_name="__main__")
kcache.uninstall()
print(json.dumps({"chosen": chosen, "installed": kcache.is_installed(), "left": os.environ.get("TRITON_CACHE_MANAGER"),
                  "tilelang": "tilelang" in sys.modules}))
""" % TRITON_PROGRAM


def test_install_routes_triton_and_helion_without_tilelang(python: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    done = run(python, tmp_path, "-c", INSTALL, KCACHE_DIR=str(root), TRITON_CACHE_DIR=str(tmp_path / "plain"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "", done.stderr  # not a word: nothing is wrong
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {"chosen": {"TRITON_CACHE_MANAGER": "kcache_triton_manager:CacheManager",
                               "HELION_REMOTE_CACHE_BACKEND": "kcache.helion.Backend"},
                    "installed": False, "left": None, "tilelang": False}, seen
    assert len(triton_entries(root)) == 1 and not (tmp_path / "plain").exists()  # the compile went to kcache


@pytest.mark.parametrize("how", ["kcache run", "TRITON_CACHE_MANAGER"])
def test_a_triton_program_compiles_into_kcache_without_tilelang(python: Path, tmp_path: Path, how: str) -> None:
    root = tmp_path / "root"
    env = {"KCACHE_DIR": str(root), "TRITON_CACHE_DIR": str(tmp_path / "plain")}
    if how == "kcache run":
        argv = ["-m", "kcache", "run", TRITON_PROGRAM, "add"]
    else:
        argv, env["TRITON_CACHE_MANAGER"] = [TRITON_PROGRAM, "add"], "kcache.triton:CacheManager"
    outputs = []
    for _ in range(2):
        done = run(python, tmp_path, *argv, **env)
        assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
        outputs.append(json.loads(done.stdout.splitlines()[-1]))
    assert outputs[0] == outputs[1]
    assert len(triton_entries(root)) == 1 and not (tmp_path / "plain").exists()
    stats = run(python, tmp_path, "-m", "kcache", "stats", "--json", KCACHE_DIR=str(root))
    assert stats.returncode == 0, stats.stderr
    assert "triton" in stats.stdout  # the second run's hit, counted per compiler


def test_doctor_finds_no_problem_in_tilelangs_absence(python: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    done = run(python, tmp_path, "-m", "kcache", "doctor", "--json", KCACHE_DIR=str(root))
    assert done.returncode == 0, done.stdout + done.stderr
    findings = {finding["check"]: finding for finding in json.loads(done.stdout)}
    assert not [name for name, finding in findings.items() if finding["problem"]], findings
    assert "TileLang not installed" in findings["tilelang version"]["detail"]
