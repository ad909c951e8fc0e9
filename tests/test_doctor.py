"""`kcache doctor` is right where a user reaches for it (issue 58): it finds nvcc as TileLang does (nvcc
off PATH, the toolkit at /usr/local/cuda, is no problem), never tells to install a TileLang that is
installed, checks that TRITON_CACHE_MANAGER and HELION_REMOTE_CACHE_BACKEND name classes (imported
outside the working directory), and gives the settings one verdict. Each case runs the real CLI in a
fresh interpreter with the environment a user would have."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from .helpers import PROJECT, child_env

# The CUDA toolkit TileLang compiles with on this machine, found without nvcc on PATH.
CUDA_DIR = Path("/usr/local/cuda")
# A PATH of the system's tools and this Python, without nvcc (which is in /usr/local/bin here).
NO_NVCC_PATH = os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"])


def doctor(root: Path, *, cwd: Path = PROJECT, unset: tuple[str, ...] = (), **env: str) -> tuple[int, dict]:
    """`kcache --dir ROOT --json doctor`: (exit status, {check: finding}); each check appears once."""
    environment = child_env(**env)
    for name in unset:
        environment.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(root), "--json", "doctor"],
                          capture_output=True, text=True, env=environment, cwd=str(cwd), timeout=300, check=False)
    findings = json.loads(done.stdout)
    checks = [f["check"] for f in findings]
    assert len(checks) == len(set(checks)), checks  # one verdict per check
    return done.returncode, {f["check"]: f for f in findings}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    made = tmp_path / "root"
    made.mkdir(mode=0o700)
    return made


def test_nvcc_off_path_is_found_in_usr_local_cuda_as_tilelang_finds_it(root: Path) -> None:
    assert (CUDA_DIR / "bin" / "nvcc").is_file()  # the machine has the toolkit TileLang would use
    off_path = subprocess.run(["sh", "-c", "command -v nvcc"], env={"PATH": NO_NVCC_PATH}, capture_output=True,
                              check=False)
    assert off_path.returncode != 0  # the case: nvcc is not on PATH
    _, found = doctor(root, unset=("CUDA_HOME", "CUDA_PATH"), PATH=NO_NVCC_PATH)
    toolchain = found["toolchain"]
    assert not toolchain["problem"], toolchain
    assert f"TileLang {version('tilelang')}" in toolchain["detail"]
    assert f"nvcc {CUDA_DIR / 'bin' / 'nvcc'}" in toolchain["detail"] and "not found" not in toolchain["detail"]


def test_a_cuda_home_without_nvcc_asks_for_the_toolkit_never_for_the_installed_tilelang(root: Path,
                                                                                       tmp_path: Path) -> None:
    empty = tmp_path / "not-a-toolkit"
    empty.mkdir()
    status, found = doctor(root, CUDA_HOME=str(empty), PATH=NO_NVCC_PATH)
    toolchain = found["toolchain"]
    assert status == 1 and toolchain["problem"], toolchain
    assert f"no nvcc in the CUDA toolkit {empty}" in toolchain["detail"]
    assert "CUDA toolkit" in toolchain["fix"] and "tilelang" not in toolchain["fix"].lower(), toolchain["fix"]


def test_cuda_home_wins_over_nvcc_on_path_as_in_tilelang(root: Path) -> None:
    _, found = doctor(root, CUDA_HOME=str(CUDA_DIR.resolve()))
    assert f"nvcc {CUDA_DIR.resolve() / 'bin' / 'nvcc'}" in found["toolchain"]["detail"]


@pytest.mark.parametrize(("value", "says"), [
    ("kcache.triton:CacheManger", "kcache.triton has no 'CacheManger'"),
    ("kcache.triton.CacheManager", "is not of the form MODULE:CLASS"),
    ("no_such_module_anywhere:CacheManager", "cannot import no_such_module_anywhere"),
    ("collections:OrderedDict", "collections.OrderedDict is no CacheManager"),
])
def test_a_triton_cache_manager_that_does_not_resolve_is_a_problem_with_its_fix(root: Path, value: str,
                                                                                 says: str) -> None:
    status, found = doctor(root, TRITON_CACHE_MANAGER=value)
    triton = found["triton"]
    assert status == 1 and triton["problem"] and says in triton["detail"], triton
    assert triton["fix"] == "export TRITON_CACHE_MANAGER=kcache.triton:CacheManager, or unset it"


def test_kcache_triton_cache_manager_resolves(root: Path) -> None:
    _, found = doctor(root, TRITON_CACHE_MANAGER="kcache.triton:CacheManager")
    assert not found["triton"]["problem"] and "go through kcache" in found["triton"]["detail"], found["triton"]


@pytest.mark.parametrize(("value", "says"), [
    ("kcache.helion.Backnd", "kcache.helion has no 'Backnd'"),
    ("Backend", "is not a dotted path"),
    ("collections.OrderedDict", "collections.OrderedDict is no RemoteCacheBackend"),
])
def test_a_helion_backend_that_does_not_resolve_is_a_problem_with_its_fix(root: Path, value: str, says: str) -> None:
    status, found = doctor(root, HELION_REMOTE_CACHE_BACKEND=value)
    helion = found["helion"]
    assert status == 1 and helion["problem"] and says in helion["detail"], helion
    assert helion["fix"] == "export HELION_REMOTE_CACHE_BACKEND=kcache.helion.Backend, or unset it"


def test_kcache_helion_backend_resolves_and_no_setting_no_row(root: Path) -> None:
    _, found = doctor(root, HELION_REMOTE_CACHE_BACKEND="kcache.helion.Backend")
    assert not found["helion"]["problem"] and "go through kcache" in found["helion"]["detail"], found["helion"]
    _, found = doctor(root, unset=("HELION_REMOTE_CACHE_BACKEND",))
    assert "helion" not in found


def test_a_class_is_never_imported_from_the_working_directory(root: Path, tmp_path: Path) -> None:
    """A module of the working directory named as the manager is not imported: no marker, a problem."""
    here = tmp_path / "cwd"
    here.mkdir()
    marker = tmp_path / "imported"
    for module in ("planted_manager", "planted_backend"):
        (here / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass CacheManager: pass\n"
                                           "class RemoteCacheBackend: pass\n")
    subprocess.run([sys.executable, "-c", "import planted_manager"], cwd=str(here), check=True)
    assert marker.exists()  # a plain `python -c` there imports it: the case is real
    marker.unlink()
    status, found = doctor(root, cwd=here, TRITON_CACHE_MANAGER="planted_manager:CacheManager",
                           HELION_REMOTE_CACHE_BACKEND="planted_backend.RemoteCacheBackend")
    assert not marker.exists()
    assert status == 1 and "cannot import planted_manager" in found["triton"]["detail"], found["triton"]
    assert "cannot import planted_backend" in found["helion"]["detail"], found["helion"]


def test_a_bad_setting_gets_one_verdict(root: Path) -> None:
    status, found = doctor(root, KCACHE_READONLY="maybe", KCACHE_MAX_AGE="30d", KCACHE_MAXSIZE="1G")
    settings = found["settings"]  # doctor() asserted there is one row of it
    assert status == 1 and settings["problem"]
    assert "KCACHE_READONLY='maybe': not a flag" in settings["detail"]
    assert "KCACHE_MAXSIZE (did you mean KCACHE_MAX_SIZE?)" in settings["detail"]
    listed_as_set = settings["detail"].split("; set: ")[1].split(", ")
    assert "KCACHE_MAX_AGE" in listed_as_set and "KCACHE_READONLY" not in listed_as_set  # a bad one is not "set"
    assert "correct that variable" in settings["fix"] and "correct or unset it" in settings["fix"]
    _, found = doctor(root, KCACHE_READONLY="1")
    assert not found["settings"]["problem"], found["settings"]
    assert "KCACHE_READONLY" in found["settings"]["detail"].removeprefix("set: ").split(", ")


AGREE_WITH_TILELANG = """
from kcache.cli.doctor_environment import find_cuda_home
from tilelang.env import _find_cuda_home
print(repr(find_cuda_home()), repr(_find_cuda_home() or None))
"""


@pytest.mark.parametrize("case", ["as set up", "nvcc off PATH", "CUDA_HOME", "CUDA_PATH"])
def test_the_cuda_toolkit_found_is_the_one_tilelang_finds(case: str) -> None:
    """find_cuda_home mirrors TileLang 0.1.15's private _find_cuda_home: both, in one environment."""
    env = child_env()
    for name in ("CUDA_HOME", "CUDA_PATH"):
        env.pop(name, None)
    if case == "nvcc off PATH":
        env["PATH"] = NO_NVCC_PATH
    elif case != "as set up":
        env[case] = str(CUDA_DIR.resolve())
    done = subprocess.run([sys.executable, "-c", AGREE_WITH_TILELANG], capture_output=True, text=True, env=env,
                          cwd=str(PROJECT), timeout=300, check=True)
    ours, tilelangs = done.stdout.split()
    assert ours == tilelangs and ours != "None", done.stdout


def test_without_tilelang_a_triton_user_has_no_problem_and_a_bare_python_is_told_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """TileLang's absence (its metadata gone: the mock, asserted to be the one asked) is no problem where
    Triton is installed, as `kcache run` runs a Triton-only program; without Triton too, it is one."""
    import importlib.util

    from kcache.cli import doctor_environment

    asked: list[str] = []
    monkeypatch.setattr(doctor_environment, "installed_tilelang", lambda: asked.append("tilelang"))
    triton_only = doctor_environment.toolchain_finding()
    assert asked == ["tilelang"] and importlib.util.find_spec("triton") is not None
    assert not triton_only.problem and "Triton's and Helion's kernels are cached" in triton_only.detail
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real_find_spec(name, *a))
    bare = doctor_environment.toolchain_finding()
    assert bare.problem and bare.fix == "pip install tilelang (or triton)", bare
