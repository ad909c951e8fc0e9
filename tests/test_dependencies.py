"""The README's install commands resolve on every machine it names, proven here without a GPU (issue 68).

A GPU machine (Python 3.12, torch 2.13.0's CUDA build from the package index) is resolved with pip's own
resolver against the index's metadata (`pip install --dry-run --report`, for that Python and platform):
torch stays 2.13.0, the Triton is the one torch pins, and every requirement of kcache's extras holds. The
machine running the tests is resolved as it stands: `.[test]` replaces no package it has with an older
one, torch least of all. Only an unreachable index skips, with the URL and the error."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

PROJECT = Path(__file__).resolve().parent.parent
TORCH = "2.13.0"  # the README's pin
GPU_PYTHON = "3.12"
# The GPU machine's platform: glibc 2.28 or later, x86_64. pip takes --platform tags literally, so every
# manylinux tag such a machine accepts is named (the CUDA libraries torch needs are manylinux_2_27).
GPU_PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(28, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
# The markers of that machine, for reading requirements the way pip did.
GPU_MARKERS = {"python_version": GPU_PYTHON, "python_full_version": f"{GPU_PYTHON}.0", "platform_system": "Linux",
               "sys_platform": "linux", "platform_machine": "x86_64", "os_name": "posix",
               "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def index_url() -> str:
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


@pytest.fixture(scope="module")
def index() -> str:
    """The package index, or a skip naming it and why it cannot be reached."""
    url = f"{index_url()}/torch/"
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            answer.read(1)
    except (urllib.error.URLError, OSError) as error:  # HTTPError too: a proxy's refusal is no answer
        pytest.skip(f"the package index cannot be reached ({url}: {error}); the resolution needs it")
    return index_url()


def project_copy(tmp_path: Path) -> Path:
    """The working tree, copied: pip prepares the project's metadata in place, and would leave its
    egg-info in the checkout."""
    copy = tmp_path / "project"
    shutil.copytree(PROJECT, copy, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".venv", ".gpu", ".*_cache", ".hypothesis", "benchmarks"))
    return copy


def dry_run(options: list[str], requirements: list[str], tmp_path: Path) -> dict[str, Any]:
    """pip's report of what `pip install REQUIREMENTS` would install, by this Python's pip."""
    report = tmp_path / "report.json"
    # No pip configuration file: the GPU machine has none of this one's (local wheels, constraints).
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report), *options,
            *requirements]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=540, check=False)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-5000:]}"
    return json.loads(report.read_text())


def resolved(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {canonicalize_name(item["metadata"]["name"]): item["metadata"] for item in report["install"]}


def requirements_of(metadata: dict[str, Any], extras: set[str]) -> list[Requirement]:
    """A distribution's requirements that apply on the GPU machine with `extras` asked for."""
    found = []
    for line in metadata.get("requires_dist") or []:
        requirement = Requirement(line)
        marker: Marker | None = requirement.marker
        if marker is None or any(marker.evaluate({**GPU_MARKERS, "extra": extra}) for extra in extras | {""}):
            found.append(requirement)
    return found


def test_a_gpu_machine_keeps_torch_and_its_triton_with_the_test_extra(index: str, tmp_path: Path) -> None:
    platforms = [option for tag in GPU_PLATFORMS for option in ("--platform", tag)]
    report = dry_run(["--index-url", index, "--ignore-installed", "--target", str(tmp_path / "target"),
                      "--python-version", GPU_PYTHON, *platforms, "--only-binary=:all:"],
                     [f"torch=={TORCH}", f"{project_copy(tmp_path)}[test]"], tmp_path)
    versions = resolved(report)
    assert versions["torch"]["version"] == TORCH, versions["torch"]["version"]  # the CUDA build, not downgraded
    # The Triton torch pins is the Triton installed: no pin of kcache's fights it.
    (torch_triton,) = [r for r in requirements_of(versions["torch"], set()) if r.name == "triton"]
    assert str(torch_triton.specifier).startswith("=="), torch_triton
    assert torch_triton.specifier.contains(versions["triton"]["version"]), (torch_triton, versions["triton"]["version"])
    # Every requirement of the test extra (and so of the three compilers' extras it takes) holds.
    extras = {"test", "tilelang", "triton", "helion", "remote", "s3"}
    kcache = versions["kcache-gpu"]
    checked = []
    for requirement in requirements_of(kcache, extras):
        name = canonicalize_name(requirement.name)
        if name == "kcache-gpu":  # the test extra names the compilers' extras of this same project
            continue
        assert name in versions, f"{requirement} is not in the resolution"
        assert requirement.specifier.contains(versions[name]["version"], prereleases=True), (
            f"{requirement} does not hold: {versions[name]['version']}")
        checked.append(name)
    assert {"torch", "triton", "helion", "tilelang", "redis", "obstore", "pytest"} <= set(checked), checked
    assert Version(versions["helion"]["version"]) >= Version("1.5.1")


@pytest.mark.parametrize("extra", ["triton", "helion"])
def test_a_triton_or_helion_user_installs_no_tilelang(index: str, tmp_path: Path, extra: str) -> None:
    """`pip install 'kcache-gpu[triton]'` (or `[helion]`) on the GPU machine: torch's own Triton, and no
    TileLang nor anything only TileLang needs."""
    platforms = [option for tag in GPU_PLATFORMS for option in ("--platform", tag)]
    report = dry_run(["--index-url", index, "--ignore-installed", "--target", str(tmp_path / "target"),
                      "--python-version", GPU_PYTHON, *platforms, "--only-binary=:all:"],
                     [f"torch=={TORCH}", f"{project_copy(tmp_path)}[{extra}]"], tmp_path)
    versions = resolved(report)
    assert versions["torch"]["version"] == TORCH and "triton" in versions
    assert ("helion" in versions) is (extra == "helion"), sorted(versions)
    assert not {"tilelang", "apache-tvm-ffi", "z3-solver"} & set(versions), sorted(versions)


def test_the_test_extra_downgrades_nothing_here(index: str, tmp_path: Path) -> None:
    """The README's command on this machine, as it stands: nothing it has is replaced by an older one."""
    report = dry_run(["--index-url", index], [f"{project_copy(tmp_path)}[test]"], tmp_path)
    installed = {canonicalize_name(name): version for name, version in
                 json.loads(subprocess.run([sys.executable, "-c", LIST], capture_output=True, text=True,
                                           check=True).stdout).items()}
    versions = resolved(report)
    assert "torch" not in versions or "torch" not in installed, (versions["torch"]["version"], installed["torch"])
    older = {name: (installed[name], meta["version"]) for name, meta in versions.items()
             if name in installed and Version(meta["version"]) < Version(installed[name])}
    assert older == {}, f"would downgrade (installed, resolved): {older}"


LIST = "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"


def declared_extras() -> set[str]:
    """The extras pyproject.toml declares (read as text: Python 3.10 has no tomllib)."""
    text = (PROJECT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([a-z0-9-]+) = \[", section, re.MULTILINE))


def test_every_extra_the_readme_names_exists() -> None:
    """A user's first command names an extra pip would otherwise ignore with a warning only."""
    extras = declared_extras()
    assert {"tilelang", "triton", "helion", "remote", "s3", "test"} <= extras, extras
    text = (PROJECT / "README.md").read_text()
    named = set(re.findall(r"(?:kcache-gpu|\.)\[([a-z0-9-]+)\]", text))
    assert {"tilelang", "triton", "helion", "test"} <= named, named
    assert named <= extras, named - extras
    quick_start = text.split("## Quick start\n", 1)[1].split("\n## ", 1)[0]
    assert [f"pip install -e '.[{extra}]'" in quick_start for extra in ("triton", "helion", "tilelang")] == [True] * 3
