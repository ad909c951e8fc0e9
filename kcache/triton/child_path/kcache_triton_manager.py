"""Triton's cache manager for every Python that a program under kcache starts (`kcache run`,
`kcache.install()`): `TRITON_CACHE_MANAGER=kcache_triton_manager:CacheManager`, this directory on
PYTHONPATH. The variable reaches every child process, Inductor's compile workers included, and also
another project's Python that has Triton but cannot import kcache: there, this module gives Triton
its own manager, with one line on stderr, instead of failing the child's first compile. Plain Python
3, whatever that interpreter is; it imports nothing else of kcache's unless kcache imports."""

try:
    import importlib.util

    # kcache's own dependencies, which its compile path imports only at a miss: their absence (kcache's
    # source on the path, not its install) must show here, not fail that compile. Looked up, not
    # imported: a hit does not pay for them.
    for _dependency in ("cloudpickle", "platformdirs"):
        if importlib.util.find_spec(_dependency) is None:
            raise ModuleNotFoundError(f"No module named {_dependency!r}", name=_dependency)
    from kcache.triton.manager import CacheManager
except Exception as err:  # noqa: BLE001 - no kcache here, or a broken one: Triton's own cache, not a failure
    import sys

    from triton.runtime.cache import FileCacheManager as CacheManager

    sys.stderr.write(f"kcache: this Python ({sys.executable}) cannot use kcache ({type(err).__name__}: {err}); "
                     "its Triton kernels use Triton's own cache\n")

__all__ = ["CacheManager"]
