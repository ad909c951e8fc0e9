"""What each scenario of `python -m stress.bench` needs on this machine, and what to install where it
is missing: the bench skips such a scenario with one line saying so."""

from __future__ import annotations

CUDA_HINT = "install the CUDA toolkit, or set CUDA_HOME to one"


def _nvcc_counter_missing() -> str | None:
    """Why NvccCounter (herd, remote) cannot count compiles here, or None."""
    from stress.nvcc_counter import real_cuda_home

    try:
        real_cuda_home()
    except FileNotFoundError:
        return f"no CUDA toolkit found for the nvcc counter ({CUDA_HINT})"
    return None


def _compiler_missing() -> str | None:
    """Why TileLang cannot compile here (its own search for a CUDA toolkit found none), or None."""
    from tilelang.contrib import nvcc

    try:
        nvcc.find_cuda_path()
    except RuntimeError:
        return f"TileLang found no CUDA toolkit to compile kernels ({CUDA_HINT})"
    return None


def _remote_missing() -> str | None:
    """Why the remote scenario cannot run here, or None."""
    import importlib.util

    from stress.servers.redis import RedisServerMissing, find_redis_server

    try:
        find_redis_server()
    except RedisServerMissing as missing:
        return str(missing)
    if importlib.util.find_spec("redis") is None:
        return "the redis Python package is not installed (pip install 'kcache-gpu[remote]')"
    return _nvcc_counter_missing()


def _helion_missing() -> str | None:
    """Why Helion's autotune cannot run here, or None."""
    import importlib.util

    from stress.gpu import gpu_missing

    if importlib.util.find_spec("helion") is None:
        return "Helion is not installed: pip install helion"
    return gpu_missing()


def unavailable(scenario: str) -> str | None:
    """Why `scenario` cannot run on this machine (and what to install), or None where it can."""
    from kcache.errors import TileLangMissing
    from kcache.tilelang.installed import tilelang_installed

    if scenario == "triton":
        import importlib.util

        return None if importlib.util.find_spec("triton") else "Triton is not installed: pip install triton"
    if scenario == "helion":  # Helion's kernels on the GPU: no TileLang
        return _helion_missing()
    if scenario not in ("cli", "run") and not tilelang_installed():  # cli: synthetic entries; run: no compiler
        return str(TileLangMissing())
    if scenario == "remote":
        return _remote_missing()
    if scenario == "herd":
        return _nvcc_counter_missing()
    if scenario in ("disk", "memory", "compile", "cold", "many", "warm"):
        return _compiler_missing()
    return None  # cli: synthetic entries, no compiler
