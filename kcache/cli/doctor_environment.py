"""The doctor's checks of the environment rather than of the root: the KCACHE_* settings (one verdict
for them all), TileLang and nvcc (found as TileLang finds them), and the classes TRITON_CACHE_MANAGER
and HELION_REMOTE_CACHE_BACKEND name. No TileLang, Triton or Helion import in this process."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, files, version
from pathlib import Path

from kcache.compile.interpreter import internal_environment, python_command
from kcache.config import SETTING_NAMES, describe_unknown_settings, unknown_settings
from kcache.redaction import masked

# Resolving a class imports its module (Triton's, Helion's, the user's): a bound on a hung import.
RESOLVE_TIMEOUT_S = 60.0
# What the child says of a class it could not resolve: a line, cut to this length.
RESOLVE_MESSAGE_CHARS = 300
# Run in a child so that neither the import's side effects nor its crash reach the doctor: started as
# kcache starts its own interpreters (kcache.compile.interpreter: no working directory nor relative
# entry on its path), in "/", so that nothing of the user's working directory is imported.
RESOLVE_CLASS = """
import importlib
module, name, base = sys.argv[1:4]
try:
    imported = importlib.import_module(module)
except BaseException as err:
    print(f"cannot import {module}: {type(err).__name__}: {err}")
    sys.exit(1)
found = getattr(imported, name, None)
if found is None:
    print(f"{module} has no {name!r}")
    sys.exit(1)
if not isinstance(found, type):
    print(f"{module}.{name} is no class")
    sys.exit(1)
if base not in {c.__name__ for c in found.__mro__}:
    print(f"{module}.{name} is no {base}")
    sys.exit(1)
"""


@dataclass
class Finding:
    check: str
    problem: bool
    detail: str
    fix: str = ""
    fixed: bool = False

    def __post_init__(self) -> None:
        # A finding may quote a URL (KCACHE_REMOTE's, an error naming it): never with its password.
        self.detail, self.fix = masked(self.detail), masked(self.fix)


def settings_finding(bad_value: str | None) -> Finding:
    """One verdict for the KCACHE_* variables: `bad_value` (Settings.from_env's one line for the first
    bad value, or None), the names that are no setting, and the others that are set. A setting named
    as bad is not also listed as set."""
    unknown = unknown_settings()
    problems = [text for text in (bad_value, describe_unknown_settings(unknown) if unknown else None) if text]
    known = sorted(name for name in os.environ if name in SETTING_NAMES
                   and not (bad_value and bad_value.startswith(f"{name}=")))
    listed = f"set: {', '.join(known)}" if known else "no other KCACHE_* setting is set"
    if not problems:
        return Finding("settings", False, f"set: {', '.join(known)}" if known else "no KCACHE_* setting is set")
    fixes = (["correct that variable or unset it"] if bad_value else []) + (
        [f"correct or unset {'it' if len(unknown) == 1 else 'them'} (docs/operations.md lists the settings)"]
        if unknown else [])
    return Finding("settings", True, "; ".join([*problems, listed]), "; ".join(fixes))


def installed_tilelang() -> str | None:
    """The installed TileLang's version, from its package metadata (no import)."""
    try:
        return version("tilelang")
    except PackageNotFoundError:
        return None


def find_cuda_home(environ: Mapping[str, str] | None = None) -> str | None:
    """The CUDA toolkit TileLang compiles with, found as TileLang 0.1.15 finds it
    (tilelang.env._find_cuda_home, private and only importable with TileLang itself): CUDA_HOME or
    CUDA_PATH; else the toolkit around nvcc on PATH; else the pip package nvidia-cuda-nvcc; else
    /usr/local/cuda, then /opt/nvidia/hpc_sdk/Linux_x86_64. TileLang then runs CUDA_HOME/bin/nvcc."""
    environ = os.environ if environ is None else environ
    home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    if home is None:
        nvcc = shutil.which("nvcc", path=environ.get("PATH"))
        if nvcc is not None:
            home = _home_of_nvcc(nvcc)
            if not os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
                home = _home_of_nvcc(os.path.realpath(nvcc))  # a pip shim: the package around the real one
        else:
            home = _pip_nvcc_home() or next((guess for guess in ("/usr/local/cuda", "/opt/nvidia/hpc_sdk/Linux_x86_64")
                                             if os.path.exists(guess)), None)
    return home if home is not None and os.path.exists(home) else None


def _home_of_nvcc(nvcc: str) -> str:
    # NVIDIA's HPC SDK keeps nvcc a level further down (.../compilers/bin/nvcc), as TileLang allows for.
    if "hpc_sdk" in nvcc.lower() and "cuda" not in nvcc.lower():
        return os.path.dirname(os.path.dirname(os.path.dirname(nvcc)))
    return os.path.dirname(os.path.dirname(nvcc))


def _pip_nvcc_home() -> str | None:
    try:
        packaged = files("nvidia-cuda-nvcc") or []
    except PackageNotFoundError:
        return None
    return next((str(Path(str(item.locate())).parent.parent) for item in packaged if item.name == "nvcc"), None)


def toolchain_finding() -> Finding:
    """TileLang's version and the nvcc it compiles with; the fix names only what is missing. Without
    TileLang, a Triton user's kcache still works (Triton brings its own assembler): no problem then,
    unless Triton is missing too."""
    import importlib.util

    tilelang = installed_tilelang()
    if tilelang is None:
        if importlib.util.find_spec("triton") is not None:
            return Finding("toolchain", False, "TileLang is not installed: Triton's and Helion's kernels are "
                           "cached without it (pip install tilelang to cache TileLang's too)")
        return Finding("toolchain", True, "neither TileLang nor Triton is installed: kcache has no compiler "
                       "to cache", "pip install tilelang (or triton)")
    home = find_cuda_home()
    nvcc = os.path.join(home, "bin", "nvcc") if home else None
    usable = nvcc is not None and os.access(nvcc, os.X_OK)
    where = (f"nvcc {nvcc}" if usable else f"no nvcc in the CUDA toolkit {home}" if home else
             "nvcc not found (TileLang looks at CUDA_HOME, CUDA_PATH, nvcc on PATH, /usr/local/cuda)")
    return Finding("toolchain", not usable, f"TileLang {tilelang}; {where}",
                   "" if usable else "install the CUDA toolkit, or set CUDA_HOME to it")


def resolve_class(module: str, name: str, base: str) -> str | None:
    """Why `module`.`name` does not resolve to a subclass of a class named `base` (a line), or None
    when it does: imported in a child, outside the working directory."""
    try:
        done = subprocess.run([*python_command(RESOLVE_CLASS), module, name, base], capture_output=True, text=True,
                              cwd="/", env=internal_environment({}), timeout=RESOLVE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"importing {module} took over {RESOLVE_TIMEOUT_S:.0f} s"
    if done.returncode == 0:
        return None
    said = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return (said[-1] if said else f"the import exited with status {done.returncode}")[:RESOLVE_MESSAGE_CHARS]


def triton_finding() -> Finding:
    """Whether Triton's kernels (and Inductor's) go through kcache, and that TRITON_CACHE_MANAGER, when
    set, names a CacheManager class as Triton reads it (MODULE:CLASS): a wrong one makes every Triton
    compile raise."""
    import importlib.util

    from kcache import triton as kcache_triton

    if importlib.util.find_spec("triton") is None:
        return Finding("triton", False, "Triton is not installed here")
    chosen = os.environ.get(kcache_triton.ENV)
    if not chosen:
        return Finding("triton", False, "Triton's kernels use Triton's own cache here: `kcache run` and "
                       f"kcache.install() route them through kcache, as does {kcache_triton.ENV}="
                       f"{kcache_triton.MODULE_VALUE}")
    module, colon, name = chosen.partition(":")
    wrong = resolve_class(module, name, "CacheManager") if colon else f"{chosen!r} is not of the form MODULE:CLASS"
    if wrong:
        return Finding("triton", True, f"{kcache_triton.ENV}={chosen} does not name a Triton CacheManager "
                       f"({wrong}): every Triton compile raises",
                       f"export {kcache_triton.ENV}={kcache_triton.MODULE_VALUE}, or unset it")
    if chosen in kcache_triton.ENV_VALUES:
        return Finding("triton", False, f"Triton's kernels go through kcache ({kcache_triton.ENV}={chosen})")
    return Finding("triton", False, f"Triton's kernels use the manager {chosen} ({kcache_triton.ENV})")


def helion_finding() -> Finding | None:
    """That HELION_REMOTE_CACHE_BACKEND, when set, names a RemoteCacheBackend class as Helion reads it
    (a dotted path); None when it is not set."""
    from kcache import helion as kcache_helion

    chosen = os.environ.get(kcache_helion.BACKEND_ENV, "").strip()
    if not chosen:
        return None
    module, dot, name = chosen.rpartition(".")
    wrong = resolve_class(module, name, "RemoteCacheBackend") if dot and module else \
        f"{chosen!r} is not a dotted path (package.module.Class)"
    if wrong:
        return Finding("helion", True, f"{kcache_helion.BACKEND_ENV}={chosen} does not name a Helion "
                       f"RemoteCacheBackend ({wrong}): Helion's remote autotune cache raises",
                       f"export {kcache_helion.BACKEND_ENV}={kcache_helion.ENV_VALUE}, or unset it")
    through = "go through kcache" if chosen == kcache_helion.ENV_VALUE else f"use the backend {chosen}"
    return Finding("helion", False, f"Helion's autotune picks {through} ({kcache_helion.BACKEND_ENV})")
